"""The routing table the rollout controller publishes and every gateway follows, in Redis.

Both sides import this module: the portal's local launcher calls :func:`publish`, and the
gateway reads with :func:`read`. The table is always replaced whole, under a new generation
number; each gateway reports the generation it applied, so the controller knows when an
instance left out of the table no longer gets new requests (:func:`applied_generation`).

Keys under ``prefix`` (default ``gateway``):

- ``{prefix}:routes``: JSON ``{"generation": g, "routes": [...]}``; ``{prefix}:generation``: g,
  moved by :func:`next_generation`, so it never goes back, even after Redis lost its data.
  A route's ``wake`` is the id of its deployment when that deployment scales to zero: a
  gateway holds a request for such a route while it has no ready backend, and asks for the
  wake (:mod:`serving.gateway.activator`); absent or null, such a request is answered 503.
- ``{prefix}:live:{gateway id}``: the generation that gateway applied; expires after 5 s.
- ``{prefix}:last_request``: hash of route path → Unix time of its last request.
- ``{prefix}:wake``: hash of deployment id → Unix time a gateway last asked for its wake
  (the portal's periodic task reads and clears it); ``{prefix}:wake:sent:{id}``: set for 5 s
  by the gateway process that sent the wake task, so the others do not send it again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

LIVE_SECONDS = 5


class TableError(ValueError):
    """A published table that does not have the expected shape."""


@dataclass(frozen=True)
class Backend:
    name: str
    openai: str | None = None
    kserve_http: str | None = None


@dataclass(frozen=True)
class Group:
    """One version's share: ``weight`` percent of the route's requests over its backends."""

    label: str
    weight: int
    backends: list[Backend] = field(default_factory=list)


@dataclass(frozen=True)
class RouteEntry:
    """``path`` is ``team/model`` (Red-Black) or ``team/model/versions/<n>`` (Versioned)."""

    path: str
    groups: list[Group] = field(default_factory=list)
    #: The deployment to wake when the route has no ready backend (it is scaled to zero);
    #: None: the route is not, and such a request is answered 503 at once.
    wake: int | None = None


#: INCR, but a counter Redis does not hold starts at ARGV[1] (see :func:`next_generation`).
_NEXT_GENERATION = (
    "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) end "
    "return redis.call('INCR', KEYS[1])"
)


def next_generation(client: redis.Redis | redis.client.Pipeline, key: str) -> Any:
    """Move the counter ``key`` on: its next number, or, in a pipeline, the pipeline itself.

    Whatever waits for "generation g or newer" (the controller for the gateways, a Kubernetes
    route's annotation) must see every table published after Redis lost its data (a restart
    without persistence, a FLUSHDB) as newer than those before, or it waits for ever for a
    number the restarted counter has not reached. So a counter Redis does not hold starts at the
    clock's microseconds, not at 0: past any number the lost counter reached, unless it was moved
    more than a million times a second on average since it started (the numbers stay below
    2**53, exact in JSON, Lua and Prometheus)."""
    seed = time.time_ns() // 1_000
    if isinstance(client, redis.client.Pipeline):
        return client.eval(_NEXT_GENERATION, 1, key, seed)
    return int(client.eval(_NEXT_GENERATION, 1, key, seed))  # type: ignore[arg-type]


def publish(client: redis.Redis, routes: list[RouteEntry], prefix: str = "gateway") -> int:
    """Replace the table; returns its generation."""
    generation = next_generation(client, f"{prefix}:generation")
    document = {"generation": generation, "routes": [asdict(route) for route in routes]}
    # A later generation published concurrently must not be overwritten by this older one.
    script = client.register_script(
        "local current = redis.call('GET', KEYS[1]) "
        "if current then current = cjson.decode(current)['generation'] end "
        "if (not current) or current < tonumber(ARGV[1]) then "
        "redis.call('SET', KEYS[1], ARGV[2]) end"
    )
    script(keys=[f"{prefix}:routes"], args=[generation, json.dumps(document)])
    return generation


def parse(raw: str | bytes) -> tuple[int, list[RouteEntry]]:
    try:
        document = json.loads(raw)
        generation = document["generation"]
        routes = [_route(item) for item in document["routes"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise TableError(f"malformed routing table: {exc!r}") from exc
    if not isinstance(generation, int):
        raise TableError("malformed routing table: generation is not an integer")
    return generation, routes


def _route(item: dict[str, Any]) -> RouteEntry:
    path = item["path"]
    if not isinstance(path, str) or not path or path.startswith("/"):
        raise TableError(f"bad route path {path!r}")
    groups = []
    for group in item["groups"]:
        weight = group["weight"]
        if not isinstance(weight, int) or not 0 <= weight <= 100:
            raise TableError(f"bad weight {weight!r} on route {path}")
        backends = [
            Backend(str(b["name"]), b.get("openai"), b.get("kserve_http"))
            for b in group["backends"]
        ]
        groups.append(Group(str(group["label"]), weight, backends))
    wake = item.get("wake")  # absent from the tables published before scale to zero
    if wake is not None and (not isinstance(wake, int) or isinstance(wake, bool)):
        raise TableError(f"bad wake {wake!r} on route {path}")
    return RouteEntry(path, groups, wake)


def save_copy(path: Path, raw: bytes | str) -> None:
    """Keep the table a gateway applied on disk, replaced atomically (several gateway processes
    may write it), so a gateway started while Redis has lost it still has routes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    os.replace(partial, path)


def load_copy(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def applied_generation(client: redis.Redis, prefix: str = "gateway") -> int | None:
    """The oldest generation any live gateway runs with; None when no gateway is live."""
    keys = list(client.scan_iter(match=f"{prefix}:live:*", count=100))
    values = [v for v in client.mget(keys) if v is not None] if keys else []
    return min(int(v) for v in values) if values else None


def last_requests(client: redis.Redis, prefix: str = "gateway") -> dict[str, float]:
    raw = client.hgetall(f"{prefix}:last_request")
    return {_text(k): float(v) for k, v in raw.items()}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
