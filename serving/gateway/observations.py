"""KServe v2 inference requests through the gateway, observed for the rollout's canary analysis.

The OpenAI requests are observed by the instances' front ends (:mod:`serving.frontend.observations`),
which see tokens, finish reasons and structured answers. KServe v2 requests go from the gateway
straight to the instance's KServe server, which is Triton itself on tritonserver instances, so
the gateway is the one place that sees them all: for each it keeps the version that answered,
the status, the latency and the error class.

Cost on the request path: a sampling decision (:class:`~serving.rate_sampler.RateSampler`,
``GATEWAY_OBSERVE_PER_SECOND`` per process, default 200; 0 turns it off) and one append to a
bounded buffer. The table follower flushes the buffer to Redis once a second
(:func:`flush`), into one stream per route, ``{prefix}:observations:{route}``, trimmed to about
``STREAM_LENGTH`` entries; stream ids are times, so the controller reads a bake's window with
one ``XRANGE`` (:func:`read`).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from typing import Any

import redis
import redis.asyncio as aioredis

from serving.rate_sampler import RateSampler

DEFAULT_PER_SECOND = 200.0
#: Observations waiting for the next flush, per gateway process (dropped oldest first if Redis
#: is away longer than that lasts).
BUFFER = 10_000
#: About how many observations a route's stream keeps (all gateways together).
STREAM_LENGTH = 50_000
#: A request is flushed up to a report interval (and a slow Redis write) after it ended: a
#: window is read this much past its end, then cut to it by each record's own time.
FLUSH_LAG_SECONDS = 5.0
INFERENCE_ENDINGS = ("/infer", "/generate", "/generate_stream")
#: What went wrong, by status, for the analysis's reasons (a KServe error is a bare message).
ERROR_CLASSES = {
    400: "invalid_request",
    404: "not_found",
    413: "too_large",
    429: "rate_limited",
    499: "cancelled",
    500: "internal",
    502: "upstream_error",
    503: "unavailable",
    504: "timeout",
}


def is_inference(method: str, upstream_path: str) -> bool:
    """A KServe v2 inference call (``POST v2/models/<m>[/versions/<v>]/infer|generate...``),
    not a health, metadata or repository call."""
    return (
        method == "POST"
        and upstream_path.startswith("v2/models/")
        and upstream_path.endswith(INFERENCE_ENDINGS)
    )


def error_class(status: int) -> str | None:
    if status < 400:
        return None
    return ERROR_CLASSES.get(status, "client_error" if status < 500 else "server_error")


def stream_key(prefix: str, route: str) -> str:
    return f"{prefix}:observations:{route}"


class GatewayObservations:
    """One gateway process's sampler and unflushed observations."""

    def __init__(self, per_second: float) -> None:
        self.sampler = RateSampler(per_second)
        self.pending: deque[tuple[str, dict[str, Any]]] = deque(maxlen=BUFFER)

    @classmethod
    def from_env(cls) -> GatewayObservations:
        return cls(float(os.environ.get("GATEWAY_OBSERVE_PER_SECOND", DEFAULT_PER_SECOND)))

    def wanted(self) -> bool:
        return self.sampler.wanted()

    def add(self, route: str, version: str, status: int, started: float) -> None:
        """A finished request of ``route`` answered by ``version`` (its label, ``v2``);
        ``started`` is its ``time.monotonic()`` when it came in."""
        self.pending.append(
            (
                route,
                {
                    "at": time.time(),
                    "version": version,
                    "protocol": "kserve",
                    "status": status,
                    "latency_s": time.monotonic() - started,
                    "error": error_class(status),
                },
            )
        )

    def take(self) -> dict[str, list[dict[str, Any]]]:
        """What is waiting, by route, leaving nothing behind."""
        by_route: dict[str, list[dict[str, Any]]] = {}
        while self.pending:
            route, record = self.pending.popleft()
            by_route.setdefault(route, []).append(record)
        return by_route


async def flush(client: aioredis.Redis, prefix: str, observations: GatewayObservations) -> None:
    """Write the waiting observations to their routes' streams, in one round trip. On a Redis
    error they are lost (a sample, not a ledger), and the caller goes on as for any report."""
    batches = observations.take()
    if not batches:
        return
    pipe = client.pipeline(transaction=False)
    for route, records in batches.items():
        for record in records:
            pipe.xadd(
                stream_key(prefix, route),
                {"o": json.dumps(record)},
                maxlen=STREAM_LENGTH,
                approximate=True,
            )
    await pipe.execute()


def read(
    client: redis.Redis, prefix: str, route: str, since: float, until: float
) -> list[dict[str, Any]]:
    """Every gateway's observations of ``route`` that ended within ``[since, until]``."""
    entries: list[tuple[Any, dict[Any, Any]]] = client.xrange(  # type: ignore[assignment]
        stream_key(prefix, route),
        min=str(int(since * 1000)),
        max=str(int((until + FLUSH_LAG_SECONDS) * 1000)),
    )
    found = []
    for _id, fields in entries:
        # Bytes or text, as the client decodes.
        record = json.loads(fields[b"o"] if b"o" in fields else fields["o"])
        if since <= record["at"] <= until:
            found.append(record)
    return found
