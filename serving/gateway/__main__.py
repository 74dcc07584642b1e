"""Run the gateway: ``python -m serving.gateway --port 8080 --redis-url redis://...``.

``--workers`` gateway processes share the port (SO_REUSEPORT) under a supervisor that starts
another when one dies (:mod:`serving.gateway.supervisor`), so a gateway process lost loses only
the requests it had in flight. Each serves at once with the table it finds in Redis, or, when
Redis has none or cannot be reached, with the copy it last saved (``--table-file``), and so
with the caller keys it checks (:mod:`serving.gateway.keys`, ``--keys-file``); the
supervisor prints ``GATEWAY READY http://HOST:PORT`` on stdout once all of them listen. Each then
follows the table: it checks the generation every 100 ms, swaps in a new table whole, saves it,
and reports what it applied (see :mod:`serving.gateway.table`). A malformed table is logged and
ignored; the last good one stays. After Redis lost its data (a restart without persistence) the
counter starts again past every number it gave before (:func:`.table.next_generation`); one that
went back all the same (a counter an older portal started at 0, a clock set back) is recognised,
and the table published under it is taken even though its number is lower. SIGTERM: stop
accepting, let in-flight requests finish (``--drain-timeout``), exit 0.

The port callers reach serves the models and ``/healthz``; ``/metrics``, which names every
team's routes, is served only on ``--metrics-port``. Callers' connections are bounded by
:mod:`serving.gateway.connections` (slow headers, idle keep-alive, connections per address).

A request for a deployment scaled to zero is held until the table gives its route an instance
(:mod:`serving.gateway.activator`): at most ``--hold-max`` per route and process
(``GATEWAY_HOLD_MAX``, default 100), each at most ``--hold-seconds`` (``GATEWAY_HOLD_SECONDS``,
default 120). Meanwhile the gateway asks for the deployment's wake in Redis and with the Celery
task ``portal.deployments.tasks.wake_deployment``, sent to the broker at ``CELERY_BROKER_URL``
(default: ``--redis-url``) on the queue ``CELERY_QUEUE`` (default ``celery``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from aiohttp import web

from serving.gateway import keys, observations, table
from serving.gateway.activator import DEFAULT_HOLD_MAX, DEFAULT_HOLD_SECONDS
from serving.gateway.connections import ConnectionGuard, GuardedSite
from serving.gateway.supervisor import supervise
from serving.request_limits import GATEWAY_MAX_BODY_ENV, max_body_bytes

if TYPE_CHECKING:
    from serving.gateway.proxy import Gateway

log = logging.getLogger("serving.gateway")
POLL_SECONDS = 0.1
REPORT_SECONDS = 1.0
#: How long a stopping gateway process waits for the table follower's last Redis command.
FOLLOWER_STOP_SECONDS = 5.0


async def follow(
    gateway: Gateway,
    client: aioredis.Redis,
    prefix: str,
    gateway_id: str,
    stop: asyncio.Event,
    table_file: Path | None = None,
    applied: bytes | str | None = None,
    keys_file: Path | None = None,
    applied_keys: bytes | str | None = None,
) -> None:
    """Keep the gateway on the newest good table and key set, save them, and say which table
    it runs, until ``stop`` is set. ``applied`` and ``applied_keys`` are the documents it
    started with.

    It ends on ``stop``, not on being cancelled: a cancellation that lands inside a Redis
    command can come out of redis-py as a connection error, which the loop takes for Redis
    being away and carries on (seen under load: about one stop in fifty never ended)."""
    seen_generation = None
    seen_keys_generation = None
    reported_at = 0.0
    while not stop.is_set():
        try:
            generation, keys_generation = await client.mget(
                f"{prefix}:generation", f"{prefix}:keys:generation"
            )
            if keys_generation != seen_keys_generation:
                # The key set is published whole under a lock, so the newest one written is
                # the one to apply, whatever its counter (which restarts if Redis lost its data).
                raw_keys = await client.get(f"{prefix}:keys")
                if raw_keys is not None and raw_keys != applied_keys:
                    try:
                        gateway.apply_keys(keys.parse(raw_keys))
                    except keys.KeyTableError as exc:
                        log.error("ignoring the key set: %s", exc)
                    else:
                        applied_keys = raw_keys
                        if keys_file is not None:
                            table.save_copy(keys_file, raw_keys)
                seen_keys_generation = keys_generation
            if generation != seen_generation:
                # A publisher takes its generation number before it writes the table, so the
                # table read here may still be the previous one: the number counts as seen only
                # once a table that new has been read (or refused), else it is read again.
                raw = await client.get(f"{prefix}:routes")
                if raw is not None:
                    try:
                        number, entries = table.parse(raw)
                    except table.TableError as exc:
                        log.error("ignoring the routing table: %s", exc)
                        seen_generation = generation
                    else:
                        # Redis lost its data: its counter started again, at or below ours,
                        # and the table under it is not the one applied.
                        counter = None if generation is None else int(generation)
                        reset = (
                            counter is not None
                            and number == counter <= gateway.generation
                            and raw != applied
                        )
                        if number > gateway.generation or reset:
                            gateway.apply(number, entries)
                            applied = raw
                            if table_file is not None:
                                table.save_copy(table_file, raw)
                            reported_at = 0.0
                        if generation is None or number >= int(generation):
                            seen_generation = generation
            if time.monotonic() - reported_at >= REPORT_SECONDS:
                reported_at = time.monotonic()
                before = await client.set(
                    f"{prefix}:live:{gateway_id}",
                    gateway.generation,
                    ex=table.LIVE_SECONDS,
                    get=True,
                )
                if before is None:
                    # The report written a second ago is gone: Redis lost its data, and its
                    # counter may have started again at the number already seen. Read again.
                    seen_generation = seen_keys_generation = None
                seen, gateway.seen = gateway.seen, {}
                if seen:
                    await client.hset(f"{prefix}:last_request", mapping=seen)  # type: ignore[arg-type]
                used, gateway.keys_used = gateway.keys_used, {}
                if used:
                    await client.hset(f"{prefix}:key_last_used", mapping=used)  # type: ignore[arg-type]
                await observations.flush(client, prefix, gateway.observations)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("Redis unavailable, keeping the current table: %s", exc)
            await _pause(stop, 1)
        await _pause(stop, POLL_SECONDS)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def start_document(
    client: aioredis.Redis,
    key: str,
    saved: Path | None,
    apply: Callable[[bytes | str], None],
    what: str,
) -> bytes | str | None:
    """Apply the routing table or key set to serve with from the start: Redis's, else the copy
    saved by the last gateway; save it again. Returns the document applied (None: none, or a
    malformed one, which is logged and ignored)."""
    try:
        raw = await client.get(key)
    except (aioredis.RedisError, OSError) as exc:
        log.warning("Redis unavailable at start: %s", exc)
        raw = None
    if raw is None and saved is not None:
        raw = table.load_copy(saved)
        if raw is not None:
            log.info("Redis has no %s: serving with the copy saved in %s", what, saved)
    if raw is None:
        return None
    try:
        apply(raw)
    except (table.TableError, keys.KeyTableError) as exc:
        log.error("ignoring the %s: %s", what, exc)
        return None
    if saved is not None:
        table.save_copy(saved, raw)
    return raw


async def run(args: argparse.Namespace, ready: Callable[[], None] | None = None) -> int:
    """One gateway process; ``ready`` is called once it listens (the supervisor's signal)."""
    # Imported here, in the worker: prometheus_client must not be loaded before the supervisor
    # chose the metrics directory (serving.gateway.supervisor).
    from serving.gateway.activator import Activator
    from serving.gateway.proxy import Gateway, make_app, make_metrics_app
    from serving.gateway.ratelimit import RateLimiter

    client = aioredis.Redis.from_url(args.redis_url)
    activator = Activator(
        prefix=args.prefix,
        client=client,
        broker_url=os.environ.get("CELERY_BROKER_URL") or args.redis_url,
        queue=os.environ.get("CELERY_QUEUE") or "celery",
        hold_max=args.hold_max,
        hold_seconds=args.hold_seconds,
    )
    gateway = Gateway(
        max_body_bytes=max_body_bytes(GATEWAY_MAX_BODY_ENV),
        limiter=RateLimiter(client),
        prefix=args.prefix,
        activator=activator,
    )
    table_file = Path(args.table_file) if args.table_file else None
    raw = await start_document(
        client,
        f"{args.prefix}:routes",
        table_file,
        lambda document: gateway.apply(*table.parse(document)),
        "routing table",
    )
    keys_file = Path(args.keys_file) if args.keys_file else None
    raw_keys = await start_document(
        client,
        f"{args.prefix}:keys",
        keys_file,
        lambda document: gateway.apply_keys(keys.parse(document)),
        "key set",
    )
    gateway_id = f"{socket.gethostname()}:{args.port}:{os.getpid()}"
    runner = web.AppRunner(
        make_app(gateway),
        access_log=None,
        handler_cancellation=False,
        keepalive_timeout=args.idle_timeout,
        shutdown_timeout=args.drain_timeout,
    )
    await runner.setup()
    guard = ConnectionGuard(args.header_timeout, args.max_connections_per_client)
    await GuardedSite(runner, args.host, args.port, guard).start()
    metrics_runner = None
    if args.metrics_port:
        metrics_runner = web.AppRunner(make_metrics_app(gateway), access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(
            metrics_runner, args.metrics_host or args.host, args.metrics_port, reuse_port=True
        ).start()
    with contextlib.suppress(aioredis.RedisError, OSError):
        await client.set(
            f"{args.prefix}:live:{gateway_id}", gateway.generation, ex=table.LIVE_SECONDS
        )
    if ready is not None:
        ready()
    else:
        print(f"GATEWAY READY http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        log.info("%s: draining", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    follower = asyncio.create_task(
        follow(gateway, client, args.prefix, gateway_id, stop, table_file, raw, keys_file, raw_keys)
    )
    await stop.wait()
    # Let it finish what it was doing: a live report it was still writing must not land after
    # the goodbye below. A Redis command stuck past the bound is given up.
    done, _ = await asyncio.wait({follower}, timeout=FOLLOWER_STOP_SECONDS)
    if not done:
        log.warning("the table follower did not stop in %g s; going on", FOLLOWER_STOP_SECONDS)
        follower.cancel()
    with contextlib.suppress(aioredis.RedisError, OSError):
        await client.delete(f"{args.prefix}:live:{gateway_id}")
    await runner.cleanup()  # stops listening, waits for in-flight requests up to the drain time
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    await client.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.gateway", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--prefix", default="gateway", help="Redis key prefix of the table")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("GATEWAY_METRICS_PORT") or 0),
        help="serve /metrics on this port only, for the cluster's scrapers (the caller-facing "
        "port never serves it); 0, the default: /metrics is not served",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get("GATEWAY_METRICS_HOST") or None,
        help="the address the metrics port listens on (default: --host)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=float(os.environ.get("GATEWAY_HEADER_TIMEOUT_SECONDS") or 10),
        help="close a new connection whose request headers have not all arrived in this many "
        "seconds (0: never)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=float(os.environ.get("GATEWAY_IDLE_TIMEOUT_SECONDS") or 75),
        help="close a keep-alive connection idle this long between requests; keep it above the "
        "idle timeout of a load balancer in front (60 s on AWS ALB)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=int,
        default=int(os.environ.get("GATEWAY_MAX_CONNECTIONS_PER_CLIENT") or 256),
        help="open connections one client address may hold per gateway process; one more is "
        "answered 429 and closed (0: no cap; behind a load balancer all come from its addresses)",
    )
    parser.add_argument(
        "--port-wait",
        type=float,
        default=10.0,
        help="how long the supervisor waits at start for its port to be free (the processes of "
        "a gateway stopped just before may still be closing it) before it exits with 1",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("GATEWAY_WORKERS", "2")),
        help="gateway processes sharing the port; 0 runs one in this process, unsupervised",
    )
    parser.add_argument(
        "--table-file",
        default=os.environ.get("GATEWAY_TABLE_FILE") or None,
        help="where each process saves the table it applied, to start from when Redis has none",
    )
    parser.add_argument(
        "--keys-file",
        default=os.environ.get("GATEWAY_KEYS_FILE") or None,
        help="where each process saves the caller keys it applied, to start from when Redis has none",
    )
    parser.add_argument(
        "--hold-max",
        type=int,
        default=int(os.environ.get("GATEWAY_HOLD_MAX", str(DEFAULT_HOLD_MAX))),
        help="requests held per route and process while its deployment, scaled to zero, starts; "
        "one more is answered 503 at once",
    )
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=float(os.environ.get("GATEWAY_HOLD_SECONDS", str(DEFAULT_HOLD_SECONDS))),
        help="the longest a request is held for a deployment scaled to zero before a 503",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.workers > 0:
        return supervise(args, serve_one)
    return serve_one(args)


def serve_one(args: argparse.Namespace, ready: Callable[[], None] | None = None) -> int:
    """One gateway process on asyncio's own event loop. Not uvloop: under uvloop a worker
    forked by the supervisor now and then never ran its SIGTERM handler (the signal caught,
    the handler not called; about 1 stop in 50 when the group and the supervisor both signal
    it), so it kept serving until killed instead of draining; on asyncio's loop that was never
    seen in over 200 stops."""
    return asyncio.run(run(args, ready))


if __name__ == "__main__":
    raise SystemExit(main())
