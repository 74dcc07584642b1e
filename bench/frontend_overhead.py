"""Front-end overhead benchmark: the OpenAI front end versus the engine's KServe gRPC, directly.

Run from the repository root::

    python bench/frontend_overhead.py --quick     # fewer requests per level, about a minute
    python bench/frontend_overhead.py             # the recorded run, pinned and unpinned

It makes the random-weights demo model, starts ``python -m serving.kserve`` and
``python -m serving.frontend`` as real processes on loopback, and at 1, 8 and 32 concurrent
clients times two paths with the same generation (greedy, ``ignore_eos``, ``max_tokens`` 1..4
tokens so that per-request overhead dominates):

- ``direct``: one ``ModelStreamInfer`` call per request on the generated gRPC stub, with the
  vLLM-backend tensors the front end sends, built once (the cheapest client there is, so the
  reference is as fast as the engine allows);
- ``frontend``: ``POST /v1/completions`` over keep-alive HTTP/1.1 connections (see
  :class:`HttpClients`), through the front end, which then makes the same gRPC call.

Latency is per request from the client's call to the last byte; requests/s is completed requests
over the wall time of the level. The overhead is ``p50(frontend) - p50(direct)`` at each level.
Each level also records the CPU time per request of the front end, the engine and the load
generator, which is steadier than latency on a shared machine.

Two placements, each with fresh processes (``--pinning``, default both):

- ``unpinned``: engine, front end and load generator share every core, so the front end's CPU
  time is taken from the engine;
- ``pinned``: ``taskset`` puts the front end alone on CPU 0 and the engine and the load generator
  on the others, as on a machine where the front end has its own core.

Results go to a JSON file and a Markdown summary next to it (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import struct
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

import grpc  # noqa: E402
import httpx  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402

from bench.machine import free_port, machine_info  # noqa: E402
from serving.demo_model import make_demo_model  # noqa: E402

MODEL = "demo--tiny"
CONCURRENCY = (1, 8, 32)
PROMPT = "The quick brown fox jumps over the lazy dog"
GOAL_MS = 2.0
GOAL_RATIO = 0.8


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
def process(
    command: list[str],
    ready: Callable[[], bool],
    name: str,
    cpus: set[int] | None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[int]:
    """The process's pid once ``ready``; with ``cpus`` it runs under ``taskset`` on them."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(extra_env or {})}
    if cpus is not None:
        command = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start ({proc.returncode})")
            time.sleep(0.2)
        yield proc.pid
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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin_self(cpus: set[int] | None) -> None:
    """Put every thread of this process (the load generator, gRPC's threads included) on
    ``cpus``, or back on all of them with ``None``."""
    cpus = cpus or set(range(os.cpu_count() or 1))
    subprocess.run(
        ["taskset", "-a", "-p", "-c", ",".join(map(str, sorted(cpus))), str(os.getpid())],
        check=True,
        stdout=subprocess.DEVNULL,
    )


class HttpClients:
    """Keep-alive HTTP/1.1 connections to the front end, one per request in flight (so one per
    client at a concurrency level): the load generator's HTTP side.

    httpx's AsyncClient cost the load generator 1.3 ms of CPU per request at 8 clients and 2.8 ms
    at 32 (its pool), against 0.7 ms for tritonclient on the direct path; on a 2-core machine
    that CPU came out of the engine's core and the front-end figures measured httpx. This
    writes the request and reads a ``Content-Length`` body, which is all a non-streaming
    completion needs."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._all: list[asyncio.StreamWriter] = []

    async def post_json(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        ).encode()
        while self._idle:
            reader, writer = self._idle.pop()
            try:
                return await self._exchange(reader, writer, head + data)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()  # uvicorn closed it after its keep-alive timeout: as any client,
                # open another; nothing was answered on it, so nothing is counted twice
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self._all.append(writer)
        return await self._exchange(reader, writer, head + data)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, bytes]:
        writer.write(request)
        response = await reader.readuntil(b"\r\n\r\n")
        status = int(response[9:12])
        headers = response.lower()
        at = headers.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError("the front end answered without content-length")
        length = int(headers[at + 17 : headers.index(b"\r\n", at + 2)])
        content = await reader.readexactly(length)
        self._idle.append((reader, writer))
        return status, content

    async def close(self) -> None:
        for writer in self._all:
            writer.close()


def engine_request(max_tokens: int) -> pb.ModelInferRequest:
    """The vLLM-backend tensors of one request, as the front end sends them (BYTES raw contents
    are a 4-byte little-endian length, then the bytes)."""
    params = json.dumps({"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True})
    request = pb.ModelInferRequest(model_name=MODEL, id="b")
    values: list[tuple[str, str, bytes]] = [
        ("text_input", "BYTES", PROMPT.encode()),
        ("stream", "BOOL", b"\x00"),
        ("sampling_parameters", "BYTES", params.encode()),
        ("exclude_input_in_output", "BOOL", b"\x01"),
        ("return_finish_reason", "BOOL", b"\x01"),
        ("return_num_input_tokens", "BOOL", b"\x01"),
        ("return_num_output_tokens", "BOOL", b"\x01"),
    ]
    for name, dtype, value in values:
        request.inputs.add(name=name, datatype=dtype, shape=[1])
        raw = struct.pack("<I", len(value)) + value if dtype == "BYTES" else value
        request.raw_input_contents.append(raw)
    return request


async def run_level(
    call: Callable[[], Awaitable[None]], concurrency: int, total: int, pids: dict[str, int]
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
    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
    load_cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    cpu_ms = {
        f"{name}_cpu_ms_per_request": round(1000 * (cpu_seconds(pid) - cpu[name]) / len(ms), 3)
        for name, pid in pids.items()
    }
    cpu_ms["load_generator_cpu_ms_per_request"] = round(
        1000 * (time.process_time() - load_cpu) / len(ms), 3
    )
    return {
        "concurrency": concurrency,
        "requests": len(ms),
        "requests_per_s": round(len(ms) / wall, 2),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        **cpu_ms,
    }


async def measure(
    grpc_url: str, frontend_url: str, max_tokens: int, total: int, pids: dict[str, int]
) -> list[dict]:
    channel = grpc.aio.insecure_channel(grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = engine_request(max_tokens)
    host, port = frontend_url.removeprefix("http://").rsplit(":", 1)
    http = HttpClients(host, int(port))
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }

    async def direct() -> None:
        call = stub.ModelStreamInfer()
        try:
            await call.write(request)
            await call.done_writing()
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise RuntimeError("the engine ended the stream before finishing")
                if response.error_message:
                    raise RuntimeError(response.error_message)
                result = response.infer_response
                names = [output.name for output in result.outputs]
                reason = result.raw_output_contents[names.index("finish_reason")][4:]
                if reason not in (b"None", b""):
                    break
        finally:
            call.cancel()

    async def frontend() -> None:
        status, content = await http.post_json("/v1/completions", body)
        if status != 200:
            raise RuntimeError(f"front end answered {status}: {content[:200]!r}")
        usage = json.loads(content)["usage"]
        assert usage["completion_tokens"] == max_tokens, usage

    rows = []
    try:
        for concurrency in CONCURRENCY:
            n = total * (1 if concurrency == 1 else 2)
            for path, call in (("direct", direct), ("frontend", frontend)):
                row = await run_level(call, concurrency, n, pids)
                row.update(path=path, max_tokens=max_tokens)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        await channel.close()
        await http.close()
    return rows


def overheads(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for pinning in dict.fromkeys(r["pinning"] for r in rows):
        for concurrency in CONCURRENCY:
            level = [r for r in rows if r["pinning"] == pinning and r["concurrency"] == concurrency]
            direct = next(r for r in level if r["path"] == "direct")
            front = next(r for r in level if r["path"] == "frontend")
            out.append(
                {
                    "pinning": pinning,
                    "concurrency": concurrency,
                    "p50_overhead_ms": round(front["p50_ms"] - direct["p50_ms"], 3),
                    "p99_overhead_ms": round(front["p99_ms"] - direct["p99_ms"], 3),
                    "throughput_ratio": round(
                        front["requests_per_s"] / direct["requests_per_s"], 3
                    ),
                    "frontend_cpu_ms_per_request": front.get("frontend_cpu_ms_per_request"),
                }
            )
    return out


def verdict(over: list[dict[str, Any]]) -> str:
    lines = []
    for pinning in dict.fromkeys(o["pinning"] for o in over):
        level = {o["concurrency"]: o for o in over if o["pinning"] == pinning}
        single = level[1]["p50_overhead_ms"]
        ratios = [level[c]["throughput_ratio"] for c in CONCURRENCY if c > 1]
        met = single < GOAL_MS and min(ratios) >= GOAL_RATIO
        lines.append(
            f"{pinning}: {single:.2f} ms added p50 at 1 client (goal under {GOAL_MS:g} ms), "
            + ", ".join(
                f"{level[c]['throughput_ratio']:.2f}x of direct throughput at {c} clients"
                for c in CONCURRENCY
                if c > 1
            )
            + f" (goal at least {GOAL_RATIO:g}x): {'met' if met else 'not met'}."
        )
    return " ".join(lines)


PINNING_TEXT = {
    "unpinned": "engine, front end and load generator share all the machine's cores",
    "pinned": "`taskset`: the front end alone on CPU 0; the engine and the load generator on "
    "the other CPUs",
}


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
        f"- Engine environment: {result['engine_env'] or 'as inherited'}",
        "",
        f"Each request: prompt of {result['prompt_tokens']} tokens, greedy, `ignore_eos`, "
        f"`max_tokens` = {result['max_tokens']} (short, so per-request overhead dominates). "
        "`direct` = one `ModelStreamInfer` call per request on the generated gRPC stub to "
        "`serving.kserve`; `frontend` = `POST /v1/completions` over keep-alive HTTP/1.1 to "
        "`serving.frontend`, which makes the same gRPC call. CPU/req: user+system CPU time of "
        "the front-end process, the engine process and the load generator over the level, "
        "divided by its requests.",
        "",
    ]
    for pinning in dict.fromkeys(r["pinning"] for r in result["rows"]):
        lines += [
            f"## {pinning.capitalize()} ({PINNING_TEXT[pinning]})",
            "",
            "| clients | path | requests | req/s | p50 | p99 | CPU/req: front end | engine "
            "| load generator |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["rows"]:
            if r["pinning"] != pinning:
                continue
            lines.append(
                f"| {r['concurrency']} | {r['path']} | {r['requests']} "
                f"| {r['requests_per_s']:.1f} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms "
                f"| {r['frontend_cpu_ms_per_request']:.3f} ms "
                f"| {r['engine_cpu_ms_per_request']:.3f} ms "
                f"| {r['load_generator_cpu_ms_per_request']:.3f} ms |"
            )
        lines += [
            "",
            f"Overhead of the front end ({pinning}; goals: under {GOAL_MS:g} ms p50 at 1 client,"
            f" at least {GOAL_RATIO:g}x of direct throughput at 8 and 32 clients):",
            "",
            "| clients | p50 added | p99 added | throughput vs direct |",
            "|---:|---:|---:|---:|",
        ]
        for o in result["overhead"]:
            if o["pinning"] == pinning:
                lines.append(
                    f"| {o['concurrency']} | {o['p50_overhead_ms']:.2f} ms "
                    f"| {o['p99_overhead_ms']:.2f} ms | {o['throughput_ratio']:.2f}x |"
                )
        lines.append("")
    lines += [result["verdict"], ""]
    return "\n".join(lines)


@contextmanager
def servers(
    repository: Path, pinned: bool, engine_env: dict[str, str]
) -> Iterator[tuple[str, str, dict[str, int]]]:
    """Engine and front end on free loopback ports: the gRPC target, the front end's URL and
    both pids. ``pinned``: the front end on CPU 0, the engine on the other CPUs."""
    cpus = set(range(os.cpu_count() or 1))
    front_cpus, engine_cpus = ({0}, cpus - {0}) if pinned else (None, None)
    http, grpc_port, metrics, front = free_port(), free_port(), free_port(), free_port()
    py = sys.executable
    engine = [py, "-m", "serving.kserve", "--model-repository", str(repository)]
    for what in ("http", "grpc", "metrics"):
        engine += [f"--{what}-address=127.0.0.1"]
    engine += ["--http-port", str(http), "--grpc-port", str(grpc_port)]
    engine += ["--metrics-port", str(metrics)]
    frontend = [py, "-m", "serving.frontend", "--model-repository", str(repository)]
    frontend += ["--kserve-grpc", f"127.0.0.1:{grpc_port}", "--kserve-http"]
    frontend += [f"127.0.0.1:{http}", "--kserve-metrics", f"http://127.0.0.1:{metrics}/metrics"]
    frontend += ["--host", "127.0.0.1", "--port", str(front), "--log-level", "warning"]
    engine_up = http_ok(f"http://127.0.0.1:{http}/v2/health/ready")
    frontend_up = http_ok(f"http://127.0.0.1:{front}/health/ready")
    with (
        process(engine, engine_up, "engine", engine_cpus, engine_env) as engine_pid,
        process(frontend, frontend_up, "frontend", front_cpus) as front_pid,
    ):
        pin_self(engine_cpus)
        try:
            pids = {"frontend": front_pid, "engine": engine_pid}
            yield f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{front}", pids
        finally:
            pin_self(None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per level")
    parser.add_argument("--requests", type=int, default=0, help="requests at 1 client")
    parser.add_argument("--max-tokens", type=int, default=2, choices=(1, 2, 3, 4))
    parser.add_argument(
        "--pinning",
        choices=("both", "unpinned", "pinned"),
        default="both",
        help="pinned: the front end on CPU 0 and the engine and load generator on the rest",
    )
    parser.add_argument(
        "--engine-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the engine only (e.g. OMP_WAIT_POLICY=PASSIVE)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    engine_env = dict(item.split("=", 1) for item in args.engine_env)
    total = args.requests or (60 if args.quick else 300)
    modes = ("unpinned", "pinned") if args.pinning == "both" else (args.pinning,)
    if "pinned" in modes and ((os.cpu_count() or 1) < 2 or shutil.which("taskset") is None):
        raise SystemExit("--pinning pinned needs at least 2 CPUs and taskset (util-linux)")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = make_demo_model(Path(tmp) / "weights")
        repository = write_repository(Path(tmp) / "repository", weights, max_num_seqs=32)
        for mode in modes:
            with servers(repository, mode == "pinned", engine_env) as (grpc_url, front_url, pids):
                prompt_tokens = httpx.post(
                    f"{front_url}/v1/completions",
                    json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1},
                    timeout=60,
                ).json()["usage"]["prompt_tokens"]
                level = asyncio.run(measure(grpc_url, front_url, args.max_tokens, total, pids))
            rows += [{"pinning": mode, **row} for row in level]
    over = overheads(rows)
    result = {
        "machine": machine_info(
            ("torch", "transformers", "fastapi", "uvicorn", "grpcio", "tritonclient")
        ),
        "command": "python bench/frontend_overhead.py"
        + (" " + shlex.join(argv or sys.argv[1:])).rstrip(),
        "wall_s": round(time.monotonic() - started, 1),
        "max_tokens": args.max_tokens,
        "engine_env": engine_env,
        "prompt_tokens": prompt_tokens,
        "rows": rows,
        "overhead": over,
        "verdict": verdict(over),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "frontend_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "frontend_overhead.md").write_text(markdown(result))
    print(result["verdict"])


if __name__ == "__main__":
    main()
