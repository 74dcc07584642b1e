"""The portal's own Prometheus metrics: its web requests, its Celery queue and its tasks.

They live in a registry of their own, so nothing another library registers globally ends up on
the portal's ``/metrics``. Web requests are counted in the web process that serves them and
summed over gunicorn's workers (see :func:`exposition`). Queue depth and task timings are not
this process's to know: the queue is read from the broker when Prometheus scrapes, and workers
(other processes, other hosts) add their task timings to Redis hashes that the collector reads
back. Labels are HTTP methods, URL pattern names, status codes and task names only, never paths
or ids, so nothing here names a team or its objects.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun
from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from portal.core.redis_clients import redis_client
from portal.metrics import buckets as bk

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "portal_http_requests",
    "HTTP requests the portal answered, by method, URL pattern name and status.",
    ["method", "view", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "portal_http_request_duration_seconds",
    "Time the portal took to answer an HTTP request, by method and URL pattern name.",
    ["method", "view"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

#: Upper bounds of the task-duration histogram (a last ``+Inf`` is implied).
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
TASK_KEY_PREFIX = "portal:metrics:task:"
TASK_INDEX_KEY = "portal:metrics:tasks"
# kombu's Redis transport keeps a queue's priorities 3, 6 and 9 in lists of their own.
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")

REDIS_TIMEOUT_SECONDS = 2.0  # a scrape or a task's bookkeeping never waits longer on Redis


def _redis(url: str) -> redis.Redis:
    return redis_client(url, timeout=REDIS_TIMEOUT_SECONDS)


def default_queue() -> str:
    return str(getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery"))


# --- task timings (worker side) -----------------------------------------------------------------


def record_task(name: str, outcome: str, seconds: float) -> None:
    """Add one finished task to its (task, outcome) hash: count, sum and the one bucket it
    falls in (counts are made cumulative when read, so a write is a few increments)."""
    key = f"{TASK_KEY_PREFIX}{name}|{outcome}"
    bound = next((b for b in TASK_BUCKETS if seconds <= b), float("inf"))
    pipe = _redis(settings.REDIS_URL).pipeline(transaction=True)
    pipe.hincrby(key, "count", 1)
    pipe.hincrbyfloat(key, "sum", seconds)
    pipe.hincrby(key, f"le:{bk.le_key(bound)}", 1)
    pipe.sadd(TASK_INDEX_KEY, f"{name}|{outcome}")
    pipe.execute()


_started: dict[str, float] = {}
_started_lock = threading.Lock()


def _on_task_prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id is not None:
        with _started_lock:
            _started[task_id] = time.monotonic()


def _on_task_postrun(
    task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any
) -> None:
    with _started_lock:
        started = _started.pop(task_id or "", None)
    if started is None or task is None:
        return
    try:
        record_task(str(task.name), (state or "unknown").lower(), time.monotonic() - started)
    except redis.RedisError as exc:  # a metric must never fail the task it measures
        logger.warning("cannot record the duration of %s: %s", task.name, exc)


def connect_task_signals() -> None:
    task_prerun.connect(_on_task_prerun, weak=False, dispatch_uid="portal.metrics.prerun")
    task_postrun.connect(_on_task_postrun, weak=False, dispatch_uid="portal.metrics.postrun")


# --- the collector (web side) --------------------------------------------------------------------


def _task_histogram(client: redis.Redis) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "portal_celery_task_duration_seconds",
        "Time Celery tasks ran, by task name and outcome (success, failure, retry).",
        labels=["task", "outcome"],
    )
    for raw in sorted(client.smembers(TASK_INDEX_KEY)):
        member = raw.decode() if isinstance(raw, bytes) else str(raw)
        name, _, outcome = member.rpartition("|")
        stored = {
            (k.decode() if isinstance(k, bytes) else k): float(v)
            for k, v in client.hgetall(f"{TASK_KEY_PREFIX}{member}").items()
        }
        running = 0.0
        cumulative = []
        for bound in (*TASK_BUCKETS, float("inf")):
            running += stored.get(f"le:{bk.le_key(bound)}", 0.0)
            cumulative.append((bk.le_key(bound), running))
        family.add_metric([name, outcome], cumulative, stored.get("sum", 0.0))
    return family


class PortalCollector(Collector):
    """Reads what the web process cannot count itself, at scrape time."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "portal_metrics_redis_up",
            "Whether Redis answered this scrape (1); 0 leaves the queue and task families out.",
        )
        try:
            queue = default_queue()
            broker = _redis(settings.CELERY_BROKER_URL)
            depth = sum(int(broker.llen(queue + suffix)) for suffix in _PRIORITY_SUFFIXES)
            tasks = _task_histogram(_redis(settings.REDIS_URL))
        except redis.RedisError as exc:
            logger.warning("portal metrics: Redis unavailable: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        waiting = GaugeMetricFamily(
            "portal_celery_queue_length",
            "Celery messages waiting in the broker's queue, not yet taken by a worker.",
            labels=["queue"],
        )
        waiting.add_metric([queue], float(depth))
        up.add_metric([], 1.0)
        yield up
        yield waiting
        yield tasks

    def describe(self) -> Iterator[Metric]:
        # Describing would read Redis at registration time; an empty answer defers to collect.
        return iter(())


REGISTRY.register(PortalCollector())


def exposition() -> bytes:
    """The text ``/metrics`` answers. Under gunicorn (see :mod:`portal.gunicorn_conf`) the
    request metrics come from every worker's files; elsewhere (tests, ``runserver``) from this
    process alone."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return generate_latest(REGISTRY)
    registry = CollectorRegistry(auto_describe=True)
    MultiProcessCollector(registry)
    registry.register(PortalCollector())
    return generate_latest(registry)
