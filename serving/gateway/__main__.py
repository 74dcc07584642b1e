"""Run the gateway: ``python -m serving.gateway --port 8080 --redis-url redis://...``.

It serves at once with the table it finds in Redis (an empty one is fine), prints
``GATEWAY READY http://HOST:PORT`` on stdout, and then follows the table: it checks the
generation every 100 ms, swaps in a new table whole, and reports what it applied (see
:mod:`serving.gateway.table`). A malformed table is logged and ignored; the last good one
stays. SIGTERM: stop accepting, let in-flight requests finish (``--drain-timeout``), exit 0.
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

import redis.asyncio as aioredis
from aiohttp import web

from serving.gateway import table
from serving.gateway.proxy import Gateway, make_app
from serving.limits import GATEWAY_MAX_BODY_ENV, max_body_bytes

log = logging.getLogger("serving.gateway")
POLL_SECONDS = 0.1
REPORT_SECONDS = 1.0


async def follow(gateway: Gateway, client: aioredis.Redis, prefix: str, gateway_id: str) -> None:
    """Keep the gateway on the newest good table, and say which one it runs."""
    seen_generation = None
    reported_at = 0.0
    while True:
        try:
            generation = await client.get(f"{prefix}:generation")
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
                        if number > gateway.generation:
                            gateway.apply(number, entries)
                            reported_at = 0.0
                        if generation is None or number >= int(generation):
                            seen_generation = generation
            if time.monotonic() - reported_at >= REPORT_SECONDS:
                reported_at = time.monotonic()
                await client.set(
                    f"{prefix}:live:{gateway_id}", gateway.generation, ex=table.LIVE_SECONDS
                )
                seen, gateway.seen = gateway.seen, {}
                if seen:
                    await client.hset(f"{prefix}:last_request", mapping=seen)  # type: ignore[arg-type]
        except (aioredis.RedisError, OSError) as exc:
            log.warning("Redis unavailable, keeping the current table: %s", exc)
            await asyncio.sleep(1)
        await asyncio.sleep(POLL_SECONDS)


async def run(args: argparse.Namespace) -> int:
    gateway = Gateway(max_body_bytes=max_body_bytes(GATEWAY_MAX_BODY_ENV))
    client = aioredis.Redis.from_url(args.redis_url)
    with contextlib.suppress(table.TableError):
        raw = await client.get(f"{args.prefix}:routes")
        if raw is not None:
            gateway.apply(*table.parse(raw))
    gateway_id = f"{socket.gethostname()}:{args.port}:{os.getpid()}"
    runner = web.AppRunner(make_app(gateway), access_log=None, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, shutdown_timeout=args.drain_timeout)
    await site.start()
    await client.set(f"{args.prefix}:live:{gateway_id}", gateway.generation, ex=table.LIVE_SECONDS)
    print(f"GATEWAY READY http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    follower = asyncio.create_task(follow(gateway, client, args.prefix, gateway_id))
    await stop.wait()
    follower.cancel()
    await client.delete(f"{args.prefix}:live:{gateway_id}")
    await runner.cleanup()  # stops listening, waits for in-flight requests up to the drain time
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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
