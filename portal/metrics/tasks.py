"""Beat's metrics scrape. Thin: the logic is in :mod:`.services`."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from portal.core.redis_clients import redis_client
from portal.metrics import services

LOCK_KEY = "metrics:scrape"


@shared_task
def scrape_metrics() -> dict[str, Any] | None:
    """One scrape pass, unless another is still running: two passes at once would write two
    points per deployment and halve each other's intervals. None when skipped."""
    interval = float(getattr(settings, "METRICS_SCRAPE_SECONDS", 15))
    client = redis_client()
    # Expires by itself, so a worker killed mid-pass holds up at most a few beats.
    lock = client.lock(
        LOCK_KEY, timeout=max(30.0, 4 * interval), blocking=False, raise_on_release_error=False
    )
    if not lock.acquire():
        return None
    try:
        report = services.scrape_live_instances()
    finally:
        lock.release()
    return {
        "at": report.at.isoformat(),
        "scraped": report.scraped,
        "up": report.up,
        "down": report.down,
        "points": report.points,
    }
