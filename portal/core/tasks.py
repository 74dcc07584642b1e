"""Housekeeping tasks run by Celery beat. Each is idempotent and safe to run twice."""

from __future__ import annotations

import time
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from portal.core import health
from portal.core.models import IdempotencyRecord


@shared_task
def beat_heartbeat() -> float:
    """Runs on beat's schedule through a worker: proves beat, broker and a worker all move."""
    now = time.time()
    health.broker_client().set(health.BEAT_HEARTBEAT_KEY, now)
    return now


@shared_task
def purge_expired_idempotency_keys() -> int:
    cutoff = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_KEY_TTL_SECONDS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted
