"""``/healthz`` and Celery, against the real Redis and a real worker process."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core import health
from portal.core.models import IdempotencyRecord
from portal.core.tasks import beat_heartbeat, purge_expired_idempotency_keys


def get_health(client):
    response = client.get("/healthz")
    return response.status_code, response.json()


@pytest.mark.django_db
def test_unhealthy_without_worker_or_beat(client, clean_redis):
    status, body = get_health(client)
    assert status == 503
    assert body["status"] == "unhealthy"
    checks = body["checks"]
    assert checks["database"]["ok"] and checks["broker"]["ok"]
    assert not checks["workers"]["ok"]
    assert "no worker answered" in checks["workers"]["detail"]
    assert checks["beat"] == {"ok": False, "detail": "no heartbeat yet: is celery beat running?"}


@pytest.mark.django_db
def test_livez_checks_only_this_web_process(client, clean_redis):
    response = client.get("/livez")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "postgresql"}


@pytest.mark.django_db
def test_stale_beat_heartbeat_is_unhealthy(clean_redis):
    clean_redis.set(health.BEAT_HEARTBEAT_KEY, time.time() - 3600)
    check = health.check_beat()
    assert not check.ok
    assert check.detail.startswith("last heartbeat 360")  # 3600s, or a second or so more


def test_unreachable_broker_is_reported(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    check = health.check_broker()
    assert not check.ok
    assert "ConnectionError" in check.detail


def test_task_round_trip_through_a_real_worker(celery_worker_process):
    old = IdempotencyRecord.objects.create(
        principal="user:1", key="old", method="POST", path="/x", fingerprint="f",
        status_code=201, response_body={},
    )  # fmt: skip
    IdempotencyRecord.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(days=2)
    )
    fresh = IdempotencyRecord.objects.create(
        principal="user:1", key="fresh", method="POST", path="/x", fingerprint="f",
        status_code=201, response_body={},
    )  # fmt: skip

    assert purge_expired_idempotency_keys.delay().get(timeout=30) == 1
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [fresh.pk]
    # Idempotent: running it again deletes nothing more.
    assert purge_expired_idempotency_keys.delay().get(timeout=30) == 0


def test_all_green_with_a_worker_and_a_beat_heartbeat(client, celery_worker_process):
    beat_heartbeat.delay().get(timeout=30)
    status, body = get_health(client)
    assert status == 200, body
    assert body["status"] == "ok"
    assert all(check["ok"] for check in body["checks"].values())
    assert body["checks"]["database"]["detail"] == "postgresql"
    assert "worker(s)" in body["checks"]["workers"]["detail"]
