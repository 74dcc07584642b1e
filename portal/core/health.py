"""Real liveness checks of what the portal depends on, for ``/healthz``.

Each check talks to the thing itself: a query to the database, a PING to the broker, a control
ping answered by a live Celery worker, and the age of the heartbeat that beat schedules.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import redis
from django.conf import settings
from django.db import connection

from portal.core.redis_clients import redis_client

BEAT_HEARTBEAT_KEY = "portal:beat:heartbeat"
WORKER_PING_TIMEOUT = 1.0


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


def broker_client() -> redis.Redis:
    return redis_client(settings.CELERY_BROKER_URL, timeout=2)


def check_database() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure means "not healthy", with the reason
        return Check(False, f"{type(exc).__name__}: {exc}")
    return Check(True, connection.vendor)


def check_broker() -> Check:
    try:
        broker_client().ping()
    except redis.RedisError as exc:
        return Check(False, f"{type(exc).__name__}: {exc}")
    return Check(True, "redis")


def check_workers() -> Check:
    from portal.celery import app

    try:
        replies = app.control.ping(timeout=WORKER_PING_TIMEOUT) or []
    except Exception as exc:
        return Check(False, f"{type(exc).__name__}: {exc}")
    if not replies:
        return Check(False, f"no worker answered a ping within {WORKER_PING_TIMEOUT:g}s")
    names = sorted(name for reply in replies for name in reply)
    return Check(True, f"{len(names)} worker(s): {', '.join(names)}")


def check_beat() -> Check:
    try:
        raw = broker_client().get(BEAT_HEARTBEAT_KEY)
    except redis.RedisError as exc:
        return Check(False, f"{type(exc).__name__}: {exc}")
    if raw is None:
        return Check(False, "no heartbeat yet: is celery beat running?")
    age = time.time() - float(raw)
    if age > settings.BEAT_HEARTBEAT_MAX_AGE_SECONDS:
        return Check(False, f"last heartbeat {age:.0f}s ago")
    return Check(True, f"last heartbeat {age:.0f}s ago")


def report() -> tuple[bool, dict[str, dict]]:
    checks = {
        "database": check_database(),
        "broker": check_broker(),
        "workers": check_workers(),
        "beat": check_beat(),
    }
    return all(c.ok for c in checks.values()), {name: asdict(c) for name, c in checks.items()}
