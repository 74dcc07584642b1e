"""Unified ``/metrics`` benchmark: scrape latency with a realistic amount of vLLM metrics on disk.

Run from the repository root::

    python bench/metrics_scrape.py                 # 8 writers, 300 scrapes (about a minute)
    python bench/metrics_scrape.py --scrapes 1000  # more samples for the tail

What runs, every part a real process on loopback:

- 8 *writer* processes (as vLLM's engine cores / API servers would be), each with
  ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus-client is imported, each defining the 45
  metric families vLLM 0.24 can produce (``vllm/v1/metrics/loggers.py``, the speculative-decoding
  and performance families included) with vLLM's types, label names, label values (finish
  reasons, prompt-token sources, waiting reasons, draft positions, ...) and buckets for
  ``max_model_len`` 32768, labelled ``engine=<i>``. For the whole run each does what vLLM's stat
  logger does once per engine step, 50 steps a second: set every gauge, bump every counter and
  make 40 histogram observations, so scrapes read files that are being written.
- a *Triton-style* endpoint: a static exposition shaped like Triton's with the vLLM backend
  (``nv_inference_*`` per model, ``nv_gpu_*`` / ``nv_cpu_*``, and the 8 families the backend
  bridges with ``REPORT_CUSTOM_METRICS``, which the merge must drop as duplicates);
- the *front end*: a FastAPI app with :func:`serving.metrics.unified.add_metrics_route` under
  uvicorn, the way the instance serves it;
- this process scrapes ``/metrics`` over HTTP one request at a time (keep-alive, as Prometheus
  does), after a warm-up, and reports p50/p90/p99/max. The first answer is checked: it must
  parse with prometheus-client's parser, hold every family once, and say both sources are up.

Results go to ``bench/results/metrics_scrape.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.machine import free_port, machine_info  # noqa: E402

MODEL = "team--llama-3-8b"
MAX_MODEL_LEN = 32768
GOAL_P99_MS = 50.0
OBSERVATIONS_PER_STEP = 40


def build_1_2_5_buckets(max_value: int) -> list[float]:
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * 10**exponent > max_value:
                return out
            out.append(float(mantissa * 10**exponent))
        exponent += 1


TOKENS = build_1_2_5_buckets(MAX_MODEL_LEN)
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
PER_TOKEN = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0]  # fmt: skip
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
RESIDENCY = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120,
             300, 600, 1200, 1800]  # fmt: skip

# (name, type, extra labels {label: values}, buckets or multiprocess mode) — vLLM 0.24's set.
FAMILIES: list[tuple[str, str, dict[str, list[str]], Any]] = [
    ("vllm:num_requests_running", "gauge", {}, "mostrecent"),
    ("vllm:num_requests_waiting", "gauge", {}, "mostrecent"),
    ("vllm:num_requests_waiting_by_reason", "gauge", {"reason": ["capacity", "deferred"]}, "mostrecent"),
    ("vllm:engine_sleep_state", "gauge",
     {"sleep_state": ["awake", "weights_offloaded", "discard_all"]}, "mostrecent"),
    ("vllm:kv_cache_usage_perc", "gauge", {}, "mostrecent"),
    ("vllm:cache_config_info", "gauge", {"block_size": ["16"], "cache_dtype": ["auto"],
     "enable_prefix_caching": ["True"], "gpu_memory_utilization": ["0.9"],
     "num_gpu_blocks": ["27000"], "swap_space": ["4"]}, "mostrecent"),
    ("vllm:lora_requests_info", "gauge", {}, "sum"),  # own label set, see writer()
    ("vllm:corrupted_requests", "counter", {}, None),
    ("vllm:prefix_cache_queries", "counter", {}, None),
    ("vllm:prefix_cache_hits", "counter", {}, None),
    ("vllm:external_prefix_cache_queries", "counter", {}, None),
    ("vllm:external_prefix_cache_hits", "counter", {}, None),
    ("vllm:mm_cache_queries", "counter", {}, None),
    ("vllm:mm_cache_hits", "counter", {}, None),
    ("vllm:num_preemptions", "counter", {}, None),
    ("vllm:prompt_tokens", "counter", {}, None),
    ("vllm:prompt_tokens_by_source", "counter",
     {"source": ["local_compute", "local_cache_hit", "external_kv_transfer"]}, None),
    ("vllm:prompt_tokens_cached", "counter", {}, None),
    ("vllm:generation_tokens", "counter", {}, None),
    ("vllm:request_success", "counter",
     {"finished_reason": ["stop", "length", "abort", "error", "repetition"]}, None),
    ("vllm:spec_decode_num_drafts", "counter", {}, None),
    ("vllm:spec_decode_num_draft_tokens", "counter", {}, None),
    ("vllm:spec_decode_num_accepted_tokens", "counter", {}, None),
    ("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
     {"position": ["0", "1", "2", "3"]}, None),
    ("vllm:estimated_flops_per_gpu_total", "counter", {}, None),
    ("vllm:estimated_read_bytes_per_gpu_total", "counter", {}, None),
    ("vllm:estimated_write_bytes_per_gpu_total", "counter", {}, None),
    ("vllm:request_prompt_tokens", "histogram", {}, TOKENS),
    ("vllm:request_generation_tokens", "histogram", {}, TOKENS),
    ("vllm:iteration_tokens_total", "histogram", {}, ITERATION),
    ("vllm:request_max_num_generation_tokens", "histogram", {}, TOKENS),
    ("vllm:request_params_n", "histogram", {}, [1, 2, 5, 10, 20]),
    ("vllm:request_params_max_tokens", "histogram", {}, TOKENS),
    ("vllm:time_to_first_token_seconds", "histogram", {}, TTFT),
    ("vllm:inter_token_latency_seconds", "histogram", {}, PER_TOKEN),
    ("vllm:request_time_per_output_token_seconds", "histogram", {}, PER_TOKEN),
    ("vllm:e2e_request_latency_seconds", "histogram", {}, LATENCY),
    ("vllm:request_queue_time_seconds", "histogram", {}, LATENCY),
    ("vllm:request_inference_time_seconds", "histogram", {}, LATENCY),
    ("vllm:request_prefill_time_seconds", "histogram", {}, LATENCY),
    ("vllm:request_decode_time_seconds", "histogram", {}, LATENCY),
    ("vllm:request_prefill_kv_computed_tokens", "histogram", {}, TOKENS),
    ("vllm:kv_block_lifetime_seconds", "histogram", {}, RESIDENCY),
    ("vllm:kv_block_idle_before_evict_seconds", "histogram", {}, RESIDENCY),
    ("vllm:kv_block_reuse_gap_seconds", "histogram", {}, RESIDENCY),
]  # fmt: skip
# Bridged by Triton's vLLM backend (labels model, version) and also written by vLLM itself.
BRIDGED: list[tuple[str, str, list[float]]] = [
    ("vllm:prompt_tokens_total", "counter", []),
    ("vllm:generation_tokens_total", "counter", []),
    ("vllm:time_to_first_token_seconds", "histogram", TTFT),
    ("vllm:time_per_output_token_seconds", "histogram", PER_TOKEN),
    ("vllm:e2e_request_latency_seconds", "histogram", [1.0, 2.5, 5, 10, 15, 20, 30, 40, 50, 60]),
    ("vllm:request_prompt_tokens", "histogram", TOKENS),
    ("vllm:request_generation_tokens", "histogram", TOKENS),
    ("vllm:request_params_n", "histogram", [1.0, 2, 5, 10, 20]),
]


# --- the writer processes ----------------------------------------------------------------


def writer(index: int, hz: float) -> None:
    """One engine process: define every family, then keep updating all of them."""
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "set before prometheus_client loads"
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()
    base = {"model_name": MODEL, "engine": str(index)}
    children: list[tuple[str, Any]] = []
    for name, kind, extra, spec in FAMILIES:
        if name == "vllm:lora_requests_info":
            labels = {"max_lora": ["4"], "waiting_lora_adapters": [""],
                      "running_lora_adapters": ["sql-lora,chat-lora"]}  # fmt: skip
        else:
            labels = {k: [v] for k, v in base.items()} | extra
        names = list(labels)
        if kind == "gauge":
            metric: Any = Gauge(name, name, names, registry=registry, multiprocess_mode=spec)
        elif kind == "counter":
            metric = Counter(name, name, names, registry=registry)
        else:
            metric = Histogram(name, name, names, registry=registry, buckets=spec)
        combos: list[dict[str, str]] = [{}]
        for label, values in labels.items():
            combos = [c | {label: v} for c in combos for v in values]
        children.extend((kind, metric.labels(**c)) for c in combos)
    rng = random.Random(index)
    scalars = [(kind, child) for kind, child in children if kind != "histogram"]
    histograms = [child for kind, child in children if kind == "histogram"]
    print("READY", flush=True)
    period = 1.0 / hz
    while True:
        # One engine step as vLLM's PrometheusStatLogger.record() sees it: every gauge set and
        # every counter bumped, and a few dozen histogram observations (inter-token latencies
        # of the running batch, the odd first token and finished request).
        for kind, child in scalars:
            if kind == "gauge":
                child.set(rng.random() * 64)
            else:
                child.inc(rng.randint(0, 50))
        for child in rng.choices(histograms, k=OBSERVATIONS_PER_STEP):
            child.observe(rng.lognormvariate(0, 2))
        time.sleep(period)


# --- the Triton-style endpoint -----------------------------------------------------------


def triton_text() -> str:
    labels = f'model="{MODEL}",version="1"'
    lines: list[str] = []

    def family(name: str, kind: str, samples: list[str], doc: str = "") -> None:
        lines.extend([f"# HELP {name} {doc or name}", f"# TYPE {name} {kind}", *samples])

    for name in ("request_success", "count", "exec_count", "request_duration_us",
                 "queue_duration_us", "compute_input_duration_us", "compute_infer_duration_us",
                 "compute_output_duration_us"):  # fmt: skip
        family(f"nv_inference_{name}", "counter", [f"nv_inference_{name}{{{labels}}} 12345"])
    family(
        "nv_inference_request_failure",
        "counter",
        [f'nv_inference_request_failure{{{labels},reason="{r}"}} 0'
         for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")],
    )  # fmt: skip
    family(
        "nv_inference_pending_request_count",
        "gauge",
        [f"nv_inference_pending_request_count{{{labels}}} 3"],
    )
    gpus = [f'gpu_uuid="GPU-{g:08x}-0000-0000-0000-000000000000"' for g in range(8)]
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
                 "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):  # fmt: skip
        kind = "counter" if name == "nv_energy_consumption" else "gauge"
        family(name, kind, [f"{name}{{{uuid}}} {g + 0.5}" for g, uuid in enumerate(gpus)])
    family("nv_cpu_utilization", "gauge", ["nv_cpu_utilization 0.25"])
    family("nv_cpu_memory_total_bytes", "gauge", ["nv_cpu_memory_total_bytes 1.0e12"])
    family("nv_cpu_memory_used_bytes", "gauge", ["nv_cpu_memory_used_bytes 3.0e11"])
    for name, kind, buckets in BRIDGED:
        if kind == "counter":
            family(name, kind, [f"{name}{{{labels}}} 4242"])
            continue
        samples = [f'{name}_bucket{{{labels},le="{b}"}} 7' for b in buckets]
        samples += [f'{name}_bucket{{{labels},le="+Inf"}} 7', f"{name}_sum{{{labels}}} 3.5",
                    f"{name}_count{{{labels}}} 7"]  # fmt: skip
        family(name, kind, samples)
    return "\n".join(lines) + "\n"


def serve_triton(port: int) -> None:
    body = triton_text().encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: with Nagle on, the body would wait for the
        # client's delayed ACK (40 ms on Linux), a stall real Triton does not have.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def serve_unified(port: int, triton_url: str, multiproc: Path) -> None:
    import uvicorn
    from fastapi import FastAPI

    from serving.metrics.unified import add_metrics_route

    app = FastAPI()
    add_metrics_route(app, triton_url, multiproc)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# --- the driver ----------------------------------------------------------------------------


def wait_http(url: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


def percentiles(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {
        "p50": round(pct(50), 3),
        "p90": round(pct(90), 3),
        "p99": round(pct(99), 3),
        "max": round(ordered[-1], 3),
        "mean": round(statistics.fmean(ordered), 3),
    }


def check_answer(text: str) -> dict[str, Any]:
    """The merged answer must be valid, hold each family once and both sources must be up."""
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    if len(names) != len(set(names)):
        raise RuntimeError("a family appears twice in the merged exposition")
    up = {
        s.labels["source"]: s.value
        for f in families
        if f.name == "serving_metrics_source_up"
        for s in f.samples
    }
    if up != {"triton": 1.0, "vllm": 1.0}:
        raise RuntimeError(f"a source is down: {up}")
    # vLLM's own copy of a bridged family wins; the bridged one (labels model/version) must be
    # gone, except time_per_output_token, which vLLM 0.24 no longer writes itself.
    survivors = [
        name
        for name, _, _ in BRIDGED
        if name != "vllm:time_per_output_token_seconds"
        and re.search(rf'^{re.escape(name)}(_bucket|_sum|_count)?{{model="', text, re.M)
    ]
    if survivors:
        raise RuntimeError(f"bridged duplicates were not dropped: {survivors}")
    vllm = [f for f in families if f.name.startswith("vllm:")]
    return {
        "families": len(families),
        "vllm_families": len(vllm),
        "nv_families": sum(f.name.startswith("nv_") for f in families),
        "samples": sum(len(f.samples) for f in families),
        "bytes": len(text.encode()),
    }


def component_times(multiproc: Path, repeats: int) -> dict[str, dict[str, float]]:
    """In-process cost of the parts of a scrape (no HTTP), and of the plain prometheus-client
    way of reading the same files (``MultiProcessCollector`` + ``generate_latest``)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from serving.metrics.multiprocess import MultiprocessReader
    from serving.metrics.unified import check_exposition, merge, read_multiprocess

    text = triton_text()
    reader = MultiprocessReader(multiproc)
    read, parsed, merged, plain = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        vllm = read_multiprocess(multiproc, reader)
        t1 = time.perf_counter()
        check_exposition(text)
        t2 = time.perf_counter()
        merge(text, vllm)
        t3 = time.perf_counter()
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(multiproc))
        generate_latest(registry)
        t4 = time.perf_counter()
        read.append((t1 - t0) * 1e3)
        parsed.append((t2 - t1) * 1e3)
        merged.append((t3 - t2) * 1e3)
        plain.append((t4 - t3) * 1e3)
    return {
        "read_and_render_db": percentiles(read),
        "check_triton_text": percentiles(parsed),
        "merge": percentiles(merged),
        "plain_multiprocesscollector_generate_latest": percentiles(plain),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    started = time.perf_counter()
    multiproc = Path(tempfile.mkdtemp(prefix="bench-prometheus-"))
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    me = [sys.executable, str(Path(__file__).resolve())]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(args.workers):
            proc = subprocess.Popen(
                [*me, "--worker", str(index), "--hz", str(args.hz)], env=env, stdout=subprocess.PIPE
            )
            procs.append(proc)
        for proc in procs[: args.workers]:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"READY":
                raise RuntimeError("a writer process failed to start")
        triton_port, unified_port = free_port(), free_port()
        plain_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        procs.append(subprocess.Popen([*me, "--triton", str(triton_port)], env=plain_env))
        triton_url = f"http://127.0.0.1:{triton_port}/metrics"
        procs.append(
            subprocess.Popen(
                [*me, "--unified", str(unified_port), triton_url, str(multiproc)], env=plain_env
            )
        )
        url = f"http://127.0.0.1:{unified_port}/metrics"
        wait_http(triton_url)
        wait_http(url)
        db_files = sorted(multiproc.glob("*.db"))
        db_bytes = sum(p.stat().st_size for p in db_files)
        with httpx.Client(timeout=10) as client:
            answer = check_answer(client.get(url).text)
            for _ in range(args.warmup):
                client.get(url)
            times = []
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - t0) * 1e3)
                if response.status_code != 200:
                    raise RuntimeError(f"scrape answered {response.status_code}")
            last = check_answer(client.get(url).text)
        components = component_times(multiproc, args.component_repeats)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for path in multiproc.glob("*"):
            path.unlink()
        multiproc.rmdir()
    scrape = percentiles(times)
    return {
        "benchmark": "metrics_scrape",
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "machine": machine_info(("prometheus_client", "httpx", "uvicorn", "fastapi", "starlette")),
        "setup": {
            "writers": args.workers,
            "writer_update_hz": args.hz,
            "vllm_families_per_writer": len(FAMILIES),
            "max_model_len": MAX_MODEL_LEN,
            "db_files": len(db_files),
            "db_bytes": db_bytes,
            "warmup_scrapes": args.warmup,
            "scrapes": args.scrapes,
        },
        "answer_first": answer,
        "answer_last": last,
        "scrape_ms": scrape,
        "components_in_process_ms": components,
        "goal_p99_ms": GOAL_P99_MS,
        "goal_met": scrape["p99"] < GOAL_P99_MS,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def render_markdown(r: dict[str, Any]) -> str:
    m, s, a, sc = r["machine"], r["setup"], r["answer_first"], r["scrape_ms"]
    comp = r["components_in_process_ms"]
    rows = "\n".join(
        f"| {name} | {v['p50']} | {v['p90']} | {v['p99']} | {v['max']} |"
        for name, v in [("scrape over HTTP", sc)] + [(k, v) for k, v in comp.items()]
    )
    return f"""# Unified /metrics scrape benchmark

Generated by `bench/metrics_scrape.py`; do not edit by hand, rerun the command.

## Machine and command

- CPU: {m.get("cpu_model")}, {m.get("cpu_count")} cores, memory {m.get("memory_gib")} GiB
- Python {m.get("python")}, prometheus_client {m.get("prometheus_client")}, httpx {m.get("httpx")}, \
uvicorn {m.get("uvicorn")}, fastapi {m.get("fastapi")}; {m.get("platform")}
- Commit {m.get("commit")}
- Command: `{r["command"]}`
- Wall time {r["elapsed_s"]} s

## Setup

{s["writers"]} writer processes, each with {s["vllm_families_per_writer"]} vLLM 0.24 families \
(vLLM's names, types, label sets and buckets, `max_model_len` {s["max_model_len"]}), each doing \
{s["writer_update_hz"]:g} engine steps a second during the run (every gauge set, every counter \
bumped, {OBSERVATIONS_PER_STEP} histogram observations per step): {s["db_files"]} `.db` files, \
{s["db_bytes"] / 2**20:.1f} MiB. A Triton-style endpoint (nv_* families, 8 GPUs, plus the 8 \
bridged vllm:* families) on loopback. The front end (FastAPI + uvicorn) serves the merged \
`/metrics`; this process scrapes it one request at a time over a keep-alive connection \
({s["warmup_scrapes"]} warm-up, then {s["scrapes"]} timed).

Merged answer: {a["families"]} families ({a["vllm_families"]} vllm:*, {a["nv_families"]} nv_*), \
{a["samples"]} samples, {a["bytes"] / 1024:.0f} KiB; valid for prometheus-client's parser, \
every family once, both sources up.

## Results (ms)

| what | p50 | p90 | p99 | max |
|---|---:|---:|---:|---:|
{rows}

Goal: p99 under {r["goal_p99_ms"]:g} ms: **{"met" if r["goal_met"] else "NOT met"}**.
The other rows are measured in the benchmark process, without HTTP, on the same files while
they are being written: reading and rendering the `.db` files (`MultiprocessReader`, in a worker
thread in the server, concurrently with the Triton fetch), validating the Triton text, merging;
and, for comparison, the plain prometheus-client way (a fresh `MultiProcessCollector` +
`generate_latest`), which the first version of the endpoint used. Writers, server and scraper
share the same cores.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--hz", type=float, default=50.0, help="updates per second per writer")
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--component-repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "metrics_scrape")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--triton", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--unified", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return writer(args.worker, args.hz)
    if args.triton is not None:
        return serve_triton(args.triton)
    if args.unified is not None:
        port, url, directory = args.unified
        return serve_unified(int(port), url, Path(directory))
    if args.scrapes < 200 or args.workers < 1 or args.hz <= 0:
        parser.error("--scrapes must be >= 200, --workers >= 1 and --hz > 0")
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(results))
    print(render_markdown(results))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    main()
