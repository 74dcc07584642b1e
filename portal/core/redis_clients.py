"""Redis clients shared within a process.

One client, and so one connection pool, per URL and options, instead of a new pool and
connection for every task, lock and check. redis-py's pools notice a fork and start over in the
child, so Celery's prefork workers and gunicorn's workers can inherit this cache safely.
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings

_clients: dict[tuple[str, bool, float | None], redis.Redis] = {}
_lock = threading.Lock()


def redis_client(
    url: str | None = None, *, decode_responses: bool = False, timeout: float | None = None
) -> redis.Redis:
    """The process's client for ``url`` (default ``REDIS_URL``). ``timeout`` bounds connecting
    and each reply, for callers that must answer even when Redis does not (health, metrics)."""
    key = (url or settings.REDIS_URL, decode_responses, timeout)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = redis.Redis.from_url(
                key[0],
                decode_responses=decode_responses,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
            )
            _clients[key] = client
        return client
