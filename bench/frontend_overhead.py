"""Front-end overhead benchmark: the OpenAI front end versus the engine's KServe gRPC, directly.

Run from the repository root::

    python bench/frontend_overhead.py --quick     # fewer requests per level, about a minute
    python bench/frontend_overhead.py             # the recorded run

It makes the random-weights demo model, starts ``python -m serving.kserve`` and
``python -m serving.frontend`` as real processes on loopback, and at 1, 8 and 32 concurrent
clients times two paths with the same generation (greedy, ``ignore_eos``, ``max_tokens`` 1..4
tokens so that per-request overhead dominates):

- ``direct``: ``tritonclient.grpc.aio`` ``stream_infer`` with the vLLM-backend tensors, one
  request per stream, as the front end itself sends them;
- ``frontend``: ``POST /v1/completions`` over HTTP (httpx, one keep-alive pool), through the front
  end, which then makes the same gRPC call.

Latency is per request from the client's call to the last byte; requests/s is completed requests
over the wall time of the level. The overhead is ``p50(frontend) - p50(direct)`` at each level.
All three processes (engine, front end, load generator) share the machine's cores, so at high
concurrency the front end's CPU time also slows the engine: the figure is an upper bound on what
the front end adds on a machine where it has its own core.

Results go to a JSON file and a Markdown summary next to it (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc.aio as grpcclient  # noqa: E402
from tritonclient.grpc import InferInput  # noqa: E402

from bench.machine import free_port, machine_info  # noqa: E402
from serving.demo_model import make_demo_model  # noqa: E402

MODEL = "demo--tiny"
CONCURRENCY = (1, 8, 32)
PROMPT = "The quick brown fox jumps over the lazy dog"
GOAL_MS = 2.0


def write_repository(root: Path, weights: Path, max_num_seqs: int) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "vllm"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        "instance_group { count: 1 kind: KIND_MODEL }\n"
    )
    args = {"model": str(weights), "tokenizer": str(weights), "max_num_seqs": max_num_seqs}
    (root / MODEL / "1" / "model.json").write_text(json.dumps(args))
    return root


@contextmanager
def process(command: list[str], ready: Callable[[], bool], name: str) -> Iterator[None]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start ({proc.returncode})")
            time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def tensors(max_tokens: int) -> list[InferInput]:
    params = json.dumps({"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
    values: list[tuple[str, str, Any]] = [
        ("text_input", "BYTES", np.array([PROMPT.encode()], dtype=np.object_)),
        ("stream", "BOOL", np.array([False])),
        ("sampling_parameters", "BYTES", np.array([params.encode()], dtype=np.object_)),
        ("exclude_input_in_output", "BOOL", np.array([True])),
        ("return_finish_reason", "BOOL", np.array([True])),
        ("return_num_input_tokens", "BOOL", np.array([True])),
        ("return_num_output_tokens", "BOOL", np.array([True])),
    ]
    out = []
    for name, dtype, value in values:
        tensor = InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


async def run_level(
    call: Callable[[], Awaitable[None]], concurrency: int, total: int
) -> dict[str, Any]:
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    for _ in range(min(concurrency, 4)):  # warm up connections and caches
        await call()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    return {
        "concurrency": concurrency,
        "requests": len(ms),
        "requests_per_s": round(len(ms) / wall, 2),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


async def measure(grpc_url: str, frontend_url: str, max_tokens: int, total: int) -> list[dict]:
    client = grpcclient.InferenceServerClient(grpc_url)
    http = httpx.AsyncClient(
        base_url=frontend_url, timeout=120, limits=httpx.Limits(max_connections=64)
    )
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }

    async def direct() -> None:
        async def one() -> Any:
            yield {"model_name": MODEL, "inputs": tensors(max_tokens), "request_id": "b"}

        stream = client.stream_infer(one())
        try:
            async for result, error in stream:
                if error is not None:
                    raise RuntimeError(error)
                reason = result.as_numpy("finish_reason")
                if reason is not None and reason.reshape(-1)[0] not in (b"None", b""):
                    break
        finally:
            stream.cancel()

    async def frontend() -> None:
        response = await http.post("/v1/completions", json=body)
        response.raise_for_status()
        usage = response.json()["usage"]
        assert usage["completion_tokens"] == max_tokens, usage

    rows = []
    try:
        for concurrency in CONCURRENCY:
            n = total * (1 if concurrency == 1 else 2)
            for path, call in (("direct", direct), ("frontend", frontend)):
                row = await run_level(call, concurrency, n)
                row.update(path=path, max_tokens=max_tokens)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        await client.close()
        await http.aclose()
    return rows


def overheads(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for concurrency in CONCURRENCY:
        direct = next(r for r in rows if r["path"] == "direct" and r["concurrency"] == concurrency)
        front = next(r for r in rows if r["path"] == "frontend" and r["concurrency"] == concurrency)
        out.append(
            {
                "concurrency": concurrency,
                "p50_overhead_ms": round(front["p50_ms"] - direct["p50_ms"], 3),
                "p99_overhead_ms": round(front["p99_ms"] - direct["p99_ms"], 3),
                "throughput_ratio": round(front["requests_per_s"] / direct["requests_per_s"], 3),
            }
        )
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Front-end overhead benchmark",
        "",
        "Generated by `bench/frontend_overhead.py`; do not edit by hand, rerun the command.",
        "",
        "## Machine and command",
        "",
        f"- CPU: {m.get('cpu_model')}, {m.get('cpu_count')} cores, memory {m.get('memory_gib')} GiB",
        f"- Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
        f"fastapi {m['fastapi']}, uvicorn {m['uvicorn']}, grpcio {m['grpcio']}, "
        f"tritonclient {m['tritonclient']}; {m['platform']}",
        f"- Commit {m.get('commit')}",
        f"- Command: `{result['command']}`",
        f"- Wall time {result['wall_s'] / 60:.1f} min",
        "",
        f"Each request: prompt of {result['prompt_tokens']} tokens, greedy, `ignore_eos`, "
        f"`max_tokens` = {result['max_tokens']} (short, so per-request overhead dominates). "
        "`direct` = tritonclient gRPC `stream_infer` to `serving.kserve`; `frontend` = "
        "`POST /v1/completions` (httpx) to `serving.frontend`, which makes the same gRPC call. "
        "Engine, front end and load generator share the machine's cores.",
        "",
        "## Latency and throughput",
        "",
        "| clients | path | requests | req/s | p50 | p99 |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['path']} | {r['requests']} | {r['requests_per_s']:.1f} "
            f"| {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms |"
        )
    lines += [
        "",
        f"## Overhead of the front end (goal: under {GOAL_MS:g} ms at p50)",
        "",
        "| clients | p50 added | p99 added | throughput vs direct |",
        "|---:|---:|---:|---:|",
    ]
    for o in result["overhead"]:
        lines.append(
            f"| {o['concurrency']} | {o['p50_overhead_ms']:.2f} ms | {o['p99_overhead_ms']:.2f} ms "
            f"| {o['throughput_ratio']:.2f}x |"
        )
    lines += ["", result["verdict"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per level")
    parser.add_argument("--requests", type=int, default=0, help="requests at 1 client")
    parser.add_argument("--max-tokens", type=int, default=2, choices=(1, 2, 3, 4))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    total = args.requests or (60 if args.quick else 300)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        weights = make_demo_model(Path(tmp) / "weights")
        repository = write_repository(Path(tmp) / "repository", weights, max_num_seqs=32)
        http, grpc_port, metrics, front = free_port(), free_port(), free_port(), free_port()
        py = sys.executable
        engine = [py, "-m", "serving.kserve", "--model-repository", str(repository)]
        engine += ["--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port)]
        engine += ["--metrics-port", str(metrics)]
        frontend = [py, "-m", "serving.frontend", "--model-repository", str(repository)]
        frontend += ["--kserve-grpc", f"127.0.0.1:{grpc_port}", "--kserve-http"]
        frontend += [f"127.0.0.1:{http}", "--kserve-metrics", f"http://127.0.0.1:{metrics}/metrics"]
        frontend += ["--host", "127.0.0.1", "--port", str(front), "--log-level", "warning"]
        engine_up = http_ok(f"http://127.0.0.1:{http}/v2/health/ready")
        frontend_up = http_ok(f"http://127.0.0.1:{front}/health/ready")
        with (
            process(engine, engine_up, "engine"),
            process(frontend, frontend_up, "frontend"),
        ):
            prompt_tokens = httpx.post(
                f"http://127.0.0.1:{front}/v1/completions",
                json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1},
                timeout=60,
            ).json()["usage"]["prompt_tokens"]
            rows = asyncio.run(
                measure(
                    f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{front}", args.max_tokens, total
                )
            )
    over = overheads(rows)
    worst = max(o["p50_overhead_ms"] for o in over)
    single = over[0]["p50_overhead_ms"]
    verdict = (
        f"At 1 client the front end adds {single:.2f} ms at p50 "
        f"({'within' if single < GOAL_MS else 'over'} the {GOAL_MS:g} ms goal); the largest p50 "
        f"difference over all levels is {worst:.2f} ms."
    )
    result = {
        "machine": machine_info(
            ("torch", "transformers", "fastapi", "uvicorn", "grpcio", "tritonclient")
        ),
        "command": "python bench/frontend_overhead.py"
        + (" " + shlex.join(argv or sys.argv[1:])).rstrip(),
        "wall_s": round(time.monotonic() - started, 1),
        "max_tokens": args.max_tokens,
        "prompt_tokens": prompt_tokens,
        "rows": rows,
        "overhead": over,
        "verdict": verdict,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontend_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "frontend_overhead.md").write_text(markdown(result))
    print(verdict)


if __name__ == "__main__":
    main()
