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

``--observations`` (:mod:`serving.frontend.observations`, one record per finished request):
left out, the front end runs with the environment as inherited, as before; ``on`` or ``off``
runs the comparison above with ``SERVING_OBSERVE_PER_SECOND`` at 100000 (every request observed)
or 0 (none); ``both`` measures only the ``frontend`` path, observations off against on, on one
engine: ``--rounds`` rounds of each, the front end restarted for every round, in the order off,
on, on, off, off, on, ... so that drift on a shared machine falls on both alike. It writes
``frontend_observations.json`` and ``.md``::

    python bench/frontend_overhead.py --pinning pinned --observations both
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
#: SERVING_OBSERVE_PER_SECOND for each --observations state: 100000 keeps every request here.
OBSERVE_ENV = {"off": "0", "on": "100000"}
OBSERVE_GOAL_MS = 0.1


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
        "latencies_ms": ms,  # popped by the caller
    }


async def measure(
    grpc_url: str,
    frontend_url: str,
    max_tokens: int,
    total: int,
    pids: dict[str, int],
    paths: tuple[str, ...] = ("direct", "frontend"),
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
            for path in paths:
                call = {"direct": direct, "frontend": frontend}[path]
                row = await run_level(call, concurrency, n, pids)
                row.update(path=path, max_tokens=max_tokens)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "latencies_ms"}), flush=True)
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
        f"- Front-end environment: {result['frontend_env'] or 'as inherited'}",
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
def engine_server(
    repository: Path, cpus: set[int] | None, engine_env: dict[str, str]
) -> Iterator[tuple[dict[str, int], int]]:
    """``serving.kserve`` on free loopback ports: its ports and pid."""
    ports = {what: free_port() for what in ("http", "grpc", "metrics")}
    engine = [sys.executable, "-m", "serving.kserve", "--model-repository", str(repository)]
    for what, port in ports.items():
        engine += [f"--{what}-address=127.0.0.1", f"--{what}-port", str(port)]
    engine_up = http_ok(f"http://127.0.0.1:{ports['http']}/v2/health/ready")
    with process(engine, engine_up, "engine", cpus, engine_env) as pid:
        yield ports, pid


@contextmanager
def frontend_server(
    repository: Path, engine: dict[str, int], cpus: set[int] | None, env: dict[str, str]
) -> Iterator[tuple[str, int]]:
    """``serving.frontend`` on a free loopback port, in front of ``engine``: its URL and pid."""
    front = free_port()
    frontend = [sys.executable, "-m", "serving.frontend", "--model-repository", str(repository)]
    frontend += ["--kserve-grpc", f"127.0.0.1:{engine['grpc']}", "--kserve-http"]
    frontend += [f"127.0.0.1:{engine['http']}"]
    frontend += ["--kserve-metrics", f"http://127.0.0.1:{engine['metrics']}/metrics"]
    frontend += ["--host", "127.0.0.1", "--port", str(front), "--log-level", "warning"]
    frontend_up = http_ok(f"http://127.0.0.1:{front}/health/ready")
    with process(frontend, frontend_up, "frontend", cpus, env) as pid:
        yield f"http://127.0.0.1:{front}", pid


def placement(pinned: bool) -> tuple[set[int] | None, set[int] | None]:
    """The front end's CPUs and the engine's (and load generator's): CPU 0 and the others when
    ``pinned``, else no pinning."""
    cpus = set(range(os.cpu_count() or 1))
    return ({0}, cpus - {0}) if pinned else (None, None)


@contextmanager
def servers(
    repository: Path, pinned: bool, engine_env: dict[str, str], frontend_env: dict[str, str]
) -> Iterator[tuple[str, str, dict[str, int]]]:
    """Engine and front end on free loopback ports: the gRPC target, the front end's URL and
    both pids. ``pinned``: the front end on CPU 0, the engine on the other CPUs."""
    front_cpus, engine_cpus = placement(pinned)
    with (
        engine_server(repository, engine_cpus, engine_env) as (ports, engine_pid),
        frontend_server(repository, ports, front_cpus, frontend_env) as (front_url, front_pid),
    ):
        pin_self(engine_cpus)
        try:
            pids = {"frontend": front_pid, "engine": engine_pid}
            yield f"127.0.0.1:{ports['grpc']}", front_url, pids
        finally:
            pin_self(None)


def prompt_tokens_of(front_url: str) -> int:
    return httpx.post(
        f"{front_url}/v1/completions",
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1},
        timeout=60,
    ).json()["usage"]["prompt_tokens"]


def observation_rounds(
    repository: Path, pinned: bool, engine_env: dict[str, str], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], int]:
    """``frontend`` rows, observations off and on, ``args.rounds`` of each on one engine, the
    front end restarted every round; order off, on, on, off, off, on, ... Each row keeps its
    latencies and how many observations the front end had recorded at its end."""
    front_cpus, engine_cpus = placement(pinned)
    order = [("off", "on") if i % 2 == 0 else ("on", "off") for i in range(args.rounds)]
    rows: list[dict[str, Any]] = []
    with engine_server(repository, engine_cpus, engine_env) as (ports, engine_pid):
        pin_self(engine_cpus)
        try:
            for number, state in ((i, st) for i, pair in enumerate(order) for st in pair):
                env = {"SERVING_OBSERVE_PER_SECOND": OBSERVE_ENV[state]}
                with frontend_server(repository, ports, front_cpus, env) as (url, pid):
                    prompt_tokens = prompt_tokens_of(url)
                    pids = {"frontend": pid, "engine": engine_pid}
                    grpc_url = f"127.0.0.1:{ports['grpc']}"
                    level = asyncio.run(
                        measure(grpc_url, url, args.max_tokens, args.total, pids, ("frontend",))
                    )
                    observed = httpx.get(f"{url}/observations?limit=1", timeout=10).json()["last"]
                for row in level:
                    row.update(round=number, observations=state, observed=observed)
                rows += level
        finally:
            pin_self(None)
    return rows, prompt_tokens


def percentile(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(len(sorted_ms) * q))]


def observation_summary(rows: list[dict[str, Any]], pinning: str) -> list[dict[str, Any]]:
    """Per level: pooled p50 and p99 of each state, the p50 difference (on - off) with the
    per-round differences (round i's on against round i's off) as its noise, the spread of the
    off rounds' p50s among themselves (an A/A difference), and front-end CPU per request."""
    out = []
    for concurrency in CONCURRENCY:
        level = [r for r in rows if r["concurrency"] == concurrency]
        by = {st: [r for r in level if r["observations"] == st] for st in OBSERVE_ENV}
        pooled = {st: sorted(x for r in by[st] for x in r["latencies_ms"]) for st in OBSERVE_ENV}
        p50 = {st: statistics.median(pooled[st]) for st in OBSERVE_ENV}
        diffs = [on["p50_ms"] - off["p50_ms"] for off, on in zip(by["off"], by["on"], strict=True)]
        off_p50s = [r["p50_ms"] for r in by["off"]]
        cpu = {
            st: sum(r["frontend_cpu_ms_per_request"] * r["requests"] for r in by[st])
            / sum(r["requests"] for r in by[st])
            for st in OBSERVE_ENV
        }
        row: dict[str, Any] = {"pinning": pinning, "concurrency": concurrency}
        for st in OBSERVE_ENV:
            row[f"{st}_requests"] = len(pooled[st])
            row[f"{st}_p50_ms"] = round(p50[st], 3)
            row[f"{st}_p99_ms"] = round(percentile(pooled[st], 0.99), 3)
            row[f"{st}_frontend_cpu_ms_per_request"] = round(cpu[st], 3)
        row.update(
            p50_diff_ms=round(p50["on"] - p50["off"], 3),
            round_diffs_ms=[round(d, 3) for d in diffs],
            round_diff_median_ms=round(statistics.median(diffs), 3),
            # mean of the round diffs +- 2 standard errors: about a 95% interval
            round_diff_mean_ms=round(statistics.fmean(diffs), 3),
            round_diff_2se_ms=round(2 * statistics.stdev(diffs) / len(diffs) ** 0.5, 3)
            if len(diffs) > 1
            else None,
            off_round_p50_spread_ms=round(max(off_p50s) - min(off_p50s), 3),
            cpu_diff_ms_per_request=round(cpu["on"] - cpu["off"], 3),
        )
        out.append(row)
    return out


def observation_verdict(summary: list[dict[str, Any]]) -> str:
    """Met where the interval of the round diffs lies below the goal, not met where it lies
    above, and unresolved where it straddles it (the noise is larger than the goal)."""
    parts = []
    for s in summary:
        mean, half = s["round_diff_mean_ms"], s["round_diff_2se_ms"] or 0.0
        if mean + half < OBSERVE_GOAL_MS:
            reading = "met"
        elif mean - half > OBSERVE_GOAL_MS:
            reading = "not met"
        else:
            reading = "not resolved: the interval is wider than the goal"
        parts.append(
            f"{s['pinning']}, {s['concurrency']} clients: on - off p50 {s['p50_diff_ms']:+.3f} ms "
            f"pooled, {mean:+.3f} +- {half:.3f} ms over rounds (goal under {OBSERVE_GOAL_MS:g} "
            f"ms): {reading}."
        )
    return " ".join(parts)


def observation_markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Front end: observations on against off",
        "",
        "Generated by `bench/frontend_overhead.py --observations both`; do not edit by hand.",
        "",
        f"- CPU: {m.get('cpu_model')}, {m.get('cpu_count')} cores; Python {m['python']}; "
        f"commit {m.get('commit')}",
        f"- Command: `{result['command']}`; wall time {result['wall_s'] / 60:.1f} min",
        f"- Load average (1, 5, 15 min) before {result['loadavg_before']}, "
        f"after {result['loadavg_after']}",
        f"- `off`: `SERVING_OBSERVE_PER_SECOND={OBSERVE_ENV['off']}`; `on`: "
        f"`SERVING_OBSERVE_PER_SECOND={OBSERVE_ENV['on']}` (every request observed; observations "
        f"recorded per `on` round: {result['observed_on']}, per `off` round: "
        f"{result['observed_off']})",
        f"- {result['rounds']} rounds of each state on one engine process, the front end "
        "restarted every round, order off, on, on, off, off, on, ...; `POST /v1/completions`, "
        f"prompt of {result['prompt_tokens']} tokens, `max_tokens` = {result['max_tokens']}, "
        f"{result['total']} requests per round at 1 client, twice that at 8 and 32",
        "",
        "p50 and p99 are over all rounds' requests of a state together. Round diffs: each "
        "round's p50 on minus the same round's p50 off; their mean +- 2 standard errors is "
        "about a 95% interval of the difference, drift between rounds included. Off spread: the "
        "largest minus the smallest p50 of the off rounds, i.e. how far the same setting moves "
        "between rounds. CPU: the front-end process's user+system time per request.",
        "",
    ]
    for pinning in dict.fromkeys(s["pinning"] for s in result["summary"]):
        lines += [
            f"## {pinning.capitalize()} ({PINNING_TEXT[pinning]})",
            "",
            "| clients | p50 off | p50 on | p50 on - off | round diffs: mean +- 2 SE "
            "| round diffs: min..max "
            "| off spread | p99 off | p99 on | CPU/req off | CPU/req on |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in result["summary"]:
            if s["pinning"] != pinning:
                continue
            d = s["round_diffs_ms"]
            lines.append(
                f"| {s['concurrency']} | {s['off_p50_ms']:.3f} ms | {s['on_p50_ms']:.3f} ms "
                f"| {s['p50_diff_ms']:+.3f} ms "
                f"| {s['round_diff_mean_ms']:+.3f} ± {s['round_diff_2se_ms']} ms "
                f"| {min(d):+.3f}..{max(d):+.3f} ms | {s['off_round_p50_spread_ms']:.3f} ms "
                f"| {s['off_p99_ms']:.2f} ms | {s['on_p99_ms']:.2f} ms "
                f"| {s['off_frontend_cpu_ms_per_request']:.3f} ms "
                f"| {s['on_frontend_cpu_ms_per_request']:.3f} ms |"
            )
        lines.append("")
    lines += [
        "Per round (p50, ms):",
        "",
        "| pinning | clients | round | off | on |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in sorted(result["rows"], key=lambda r: (r["pinning"], r["concurrency"], r["round"])):
        if r["observations"] == "off":
            on = next(
                x
                for x in result["rows"]
                if (x["pinning"], x["concurrency"], x["round"], x["observations"])
                == (r["pinning"], r["concurrency"], r["round"], "on")
            )
            lines.append(
                f"| {r['pinning']} | {r['concurrency']} | {r['round']} "
                f"| {r['p50_ms']:.3f} | {on['p50_ms']:.3f} |"
            )
    lines += ["", result["verdict"], ""]
    return "\n".join(lines)


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
    parser.add_argument(
        "--observations",
        choices=("both", "on", "off"),
        default=None,
        help="the front end's per-request observations: on (every request) or off for the "
        "direct/frontend comparison, or both: frontend only, off against on in alternating "
        "rounds (left out: the environment as inherited)",
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each state with both")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    engine_env = dict(item.split("=", 1) for item in args.engine_env)
    frontend_env = (
        {"SERVING_OBSERVE_PER_SECOND": OBSERVE_ENV[args.observations]}
        if args.observations in OBSERVE_ENV
        else {}
    )
    args.total = total = args.requests or (60 if args.quick else 300)
    modes = ("unpinned", "pinned") if args.pinning == "both" else (args.pinning,)
    if "pinned" in modes and ((os.cpu_count() or 1) < 2 or shutil.which("taskset") is None):
        raise SystemExit("--pinning pinned needs at least 2 CPUs and taskset (util-linux)")
    started = time.monotonic()
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = make_demo_model(Path(tmp) / "weights")
        repository = write_repository(Path(tmp) / "repository", weights, max_num_seqs=32)
        for mode in modes:
            if args.observations == "both":
                level, prompt_tokens = observation_rounds(
                    repository, mode == "pinned", engine_env, args
                )
            else:
                with servers(repository, mode == "pinned", engine_env, frontend_env) as (
                    grpc_url,
                    front_url,
                    pids,
                ):
                    prompt_tokens = prompt_tokens_of(front_url)
                    level = asyncio.run(measure(grpc_url, front_url, args.max_tokens, total, pids))
            rows += [{"pinning": mode, **row} for row in level]
    result: dict[str, Any] = {
        "machine": machine_info(
            ("torch", "transformers", "fastapi", "uvicorn", "grpcio", "tritonclient")
        ),
        "command": "python bench/frontend_overhead.py"
        + (" " + shlex.join(argv or sys.argv[1:])).rstrip(),
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_before": loadavg_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "max_tokens": args.max_tokens,
        "engine_env": engine_env,
        "frontend_env": frontend_env,
        "prompt_tokens": prompt_tokens,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.observations == "both":
        summary = [
            row
            for mode in modes
            for row in observation_summary([r for r in rows if r["pinning"] == mode], mode)
        ]
        observed = {
            st: sorted({r["observed"] for r in rows if r["observations"] == st})
            for st in OBSERVE_ENV
        }
        result.update(
            rounds=args.rounds,
            total=total,
            observed_on=observed["on"],
            observed_off=observed["off"],
            summary=summary,
            verdict=observation_verdict(summary),
        )
        result["rows"] = [{k: v for k, v in r.items() if k != "latencies_ms"} for r in rows]
        name = "frontend_observations"
        text = observation_markdown(result)
    else:
        for row in rows:
            row.pop("latencies_ms")
        over = overheads(rows)
        result.update(rows=rows, overhead=over, verdict=verdict(over))
        name = "frontend_overhead"
        text = markdown(result)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(text)
    print(result["verdict"])


if __name__ == "__main__":
    main()
