"""Gateway overhead: the same request straight to a backend and through ``serving.gateway``.

Run from the repository root (Redis on 127.0.0.1:6379)::

    python bench/gateway_overhead.py --quick   # fewer requests, about 20 s
    python bench/gateway_overhead.py           # the recorded run

The backend is a minimal HTTP server answering a completion-sized JSON body at once (this
script run with ``--backend``), so what is timed is the path, not a model: an instance's own
time only adds to both sides. The gateway runs as a real process following a real Redis table
with one route and that backend. Sequential requests (one client, keep-alive) and 8 concurrent
clients, each side in turn; p50/p99 per request from the call to the last byte. The overhead is
``p50(gateway) - p50(direct)``, with a caller key checked on every request; ``gateway+limits``
uses a key whose rate limits are never reached but are taken from Redis's token buckets on every
request, so its difference from ``gateway`` is what the limits cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import free_port, machine_info  # noqa: E402

ANSWER = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "bench--chat",
    "choices": [{"index": 0, "text": " hello there", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def serve_backend(port: int) -> None:
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(
    url: str, total: int, clients: int, headers: dict[str, str] | None = None
) -> list[float]:
    import httpx

    body = {"model": "bench--chat", "prompt": "Hello", "max_tokens": 2}
    latencies: list[float] = []
    per_client = total // clients

    async def one_client(client: httpx.AsyncClient) -> None:
        for _ in range(per_client):
            start = time.perf_counter()
            answer = await client.post(url, json=body)
            latencies.append((time.perf_counter() - start) * 1000)
            assert answer.status_code == 200, answer.text

    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=clients), headers=headers
    ) as client:
        for _ in range(20):  # warm-up
            await client.post(url, json=body)
        await asyncio.gather(*(one_client(client) for _ in range(clients)))
    return latencies


def wait_http(url: str) -> None:
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.backend:
        serve_backend(args.backend)
        return
    import redis

    from serving.gateway import keys, table

    total = 500 if args.quick else 3000
    backend_port, gateway_port = free_port(), free_port()
    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()
    backend = subprocess.Popen([sys.executable, __file__, "--backend", str(backend_port)])
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving.gateway",
            "--port",
            str(gateway_port),
            "--redis-url",
            args.redis_url,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        direct = f"http://127.0.0.1:{backend_port}"
        wait_http(direct + "/")
        wait_http(f"http://127.0.0.1:{gateway_port}/healthz")
        backends = [table.Backend("b", openai=direct)]
        table.publish(client, [table.RouteEntry("bench/chat", [table.Group("v1", 100, backends)])])
        # Two caller keys: one without limits (the key check alone), one whose limits are never
        # reached but must be taken from Redis's buckets on every request.
        plain, limited = "mlk_benchkey_plain", "mlk_benchlim_limited"
        high = keys.Limits(requests_per_second=1e6, tokens_per_minute=10**12)
        entries = [
            keys.KeyEntry("benchkey", keys.digest(plain), "bench"),
            keys.KeyEntry("benchlim", keys.digest(limited), "bench", limits=high),
        ]
        keys.publish(client, keys.document(entries, {}))
        time.sleep(0.5)
        via = f"http://127.0.0.1:{gateway_port}/models/bench/chat/v1/completions"
        paths = (
            ("direct", direct + "/v1/completions", None),
            ("gateway", via, {"Authorization": f"Bearer {plain}"}),
            ("gateway+limits", via, {"Authorization": f"Bearer {limited}"}),
        )
        rows: list[dict[str, Any]] = []
        for clients in (1, 8):
            for name, url, headers in paths:
                latencies = asyncio.run(timed(url, total, clients, headers))
                rows.append(
                    {
                        "clients": clients,
                        "path": name,
                        "requests": len(latencies),
                        "p50_ms": round(percentile(latencies, 0.5), 3),
                        "p99_ms": round(percentile(latencies, 0.99), 3),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for proc in (gateway, backend):
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        client.flushdb()

    def p50(clients: int, path: str) -> float:
        return next(r["p50_ms"] for r in rows if r["clients"] == clients and r["path"] == path)

    overhead = {
        clients: round(p50(clients, "gateway") - p50(clients, "direct"), 3) for clients in (1, 8)
    }
    limits_cost = {
        clients: round(p50(clients, "gateway+limits") - p50(clients, "gateway"), 3)
        for clients in (1, 8)
    }
    result = {
        "rows": rows,
        "p50_overhead_ms": overhead,
        "p50_rate_limit_cost_ms": limits_cost,
        "goal": "p50 overhead under 1 ms",
        "met": overhead[1] < 1.0,
        "machine": machine_info(("aiohttp", "uvloop", "httpx")),
        "command": "python bench/gateway_overhead.py" + (" --quick" if args.quick else ""),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gateway_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| clients | path | requests | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['clients']} | {r['path']} | {r['requests']} | {r['p50_ms']} | {r['p99_ms']} |"
        for r in rows
    ]
    lines += [
        "",
        f"p50 overhead (ms): 1 client {overhead[1]}, 8 clients {overhead[8]}",
        f"p50 cost of the rate limits (ms): 1 client {limits_cost[1]}, 8 clients {limits_cost[8]}",
        "",
    ]
    (args.out / "gateway_overhead.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
