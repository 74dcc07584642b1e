"""The unified /metrics: merge rules, and the endpoint over real sockets with the engine's
metrics endpoint healthy, down, failing or answering garbage."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from serving.metrics.unified import (
    UP_FAMILY,
    add_metrics_route,
    check_exposition,
    merge,
    read_multiprocess,
    split_families,
)
from tests.ports import free_port
from tests.serving.instance_helpers import write_vllm_metrics

# What Triton's vLLM backend with REPORT_CUSTOM_METRICS serves: nv_* families (counters without
# a _total suffix) and bridged vllm:* families that collide with the multiprocess ones, plus
# one bridged family (time_per_output_token) that vLLM 0.24 no longer has.
TRITON_TEXT = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="a",version="1"} 4
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="a",version="1"} 4
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model="a",version="1"} 999
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{model="a",version="1",le="0.1"} 1
vllm:time_to_first_token_seconds_bucket{model="a",version="1",le="+Inf"} 1
vllm:time_to_first_token_seconds_sum{model="a",version="1"} 0.05
vllm:time_to_first_token_seconds_count{model="a",version="1"} 1
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{model="a",version="1",le="+Inf"} 2
vllm:time_per_output_token_seconds_sum{model="a",version="1"} 0.05
vllm:time_per_output_token_seconds_count{model="a",version="1"} 2
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5
"""


@pytest.fixture(scope="module")
def multiproc(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("prometheus")
    write_vllm_metrics(directory, {"model": "a", "requests": 2})
    return directory


def parse(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def up(families: dict, source: str) -> float:
    return next(s.value for s in families[UP_FAMILY].samples if s.labels["source"] == source)


def type_lines(text: str) -> list[str]:
    return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]


# --- merge rules -------------------------------------------------------------------------


def test_merge_keeps_each_family_once_preferring_multiprocess(multiproc):
    text = merge(TRITON_TEXT, read_multiprocess(multiproc))
    families = parse(text)
    names = type_lines(text)
    assert len(names) == len(set(names))
    # The bridged copy (999, labels model/version) is gone; vLLM's own (model_name/engine) stays.
    prompt = [s for s in families["vllm:prompt_tokens"].samples]
    assert [(s.labels, s.value) for s in prompt] == [({"engine": "0", "model_name": "a"}, 14.0)]
    ttft = families["vllm:time_to_first_token_seconds"].samples
    assert all("model_name" in s.labels for s in ttft)
    # A bridged family vLLM's files do not have is kept.
    assert "vllm:time_per_output_token_seconds" in families
    assert up(families, "triton") == 1 and up(families, "vllm") == 1


def test_triton_counters_are_copied_verbatim(multiproc):
    text = merge(TRITON_TEXT, read_multiprocess(multiproc))
    # A parse/re-render would have renamed the sample to nv_inference_count_total.
    assert 'nv_inference_count{model="a",version="1"} 4\n' in text
    assert "# TYPE nv_inference_count counter\n" in text
    assert "nv_inference_count_total" not in text
    assert 'nv_gpu_utilization{gpu_uuid="GPU-0"} 0.5' in text


def test_merge_without_sources_is_still_valid():
    families = parse(merge(None, None))
    assert set(families) == {UP_FAMILY}
    assert up(families, "triton") == 0 and up(families, "vllm") == 0


def test_triton_family_named_like_our_gauge_is_dropped():
    triton = f'# TYPE {UP_FAMILY} gauge\n{UP_FAMILY}{{source="x"}} 5\n'
    check_exposition(triton)
    families = parse(merge(triton, None))
    assert {s.labels["source"] for s in families[UP_FAMILY].samples} == {"triton", "vllm"}


def test_split_families_groups_samples_and_untyped_lines():
    text = (
        '# HELP h help\n# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 2\nh_count 1\n'
        "plain 3\n# a comment\n# TYPE c counter\nc_total 4\n"
    )
    families = {f.name: f for f in split_families(text)}
    assert families["h"].sample_names == {"h_bucket", "h_sum", "h_count"}
    assert families["plain"].type == "untyped" and families["plain"].samples == ["plain 3"]
    assert families["c"].names() >= {"c", "c_total"}


def test_missing_or_foreign_multiproc_dir_reads_as_down(tmp_path):
    assert read_multiprocess(tmp_path / "missing") is None
    assert read_multiprocess(tmp_path) is None  # exists, but no .db file yet
    (tmp_path / "counter_1.db").write_bytes(b"\xff" * 64)  # not a prometheus mmap file
    assert read_multiprocess(tmp_path) is None
    # Claims 4096 used bytes in a 64-byte file: reading it fails, the scrape must not.
    (tmp_path / "counter_1.db").write_bytes(struct.pack("i", 4096) + b"\x07" * 60)
    assert read_multiprocess(tmp_path) is None


# --- the endpoint over real sockets --------------------------------------------------------


class EngineMetrics:
    """A Triton-style metrics endpoint on loopback whose answer each test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.body = TRITON_TEXT.encode()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(owner.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def engine_metrics() -> Iterator[EngineMetrics]:
    engine = EngineMetrics()
    yield engine
    engine.server.shutdown()


def serve_app(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/metrics"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def endpoint(engine_metrics, multiproc) -> Iterator[str]:
    app = FastAPI()
    add_metrics_route(app, engine_metrics.url, multiproc, timeout=1.0)
    yield from serve_app(app)


@pytest.fixture(scope="module")
def endpoint_engine_down(multiproc) -> Iterator[str]:
    app = FastAPI()
    add_metrics_route(app, f"http://127.0.0.1:{free_port()}/metrics", multiproc, timeout=1.0)
    yield from serve_app(app)


@pytest.fixture
def engine(engine_metrics) -> Iterator[EngineMetrics]:
    yield engine_metrics
    engine_metrics.status, engine_metrics.body = 200, TRITON_TEXT.encode()


def scrape(url: str) -> tuple[httpx.Response, dict]:
    response = httpx.get(url, timeout=10)
    return response, parse(response.text)


def test_endpoint_serves_both_sources(endpoint, engine):
    response, families = scrape(endpoint)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "nv_inference_count" in families and "vllm:generation_tokens" in families
    assert up(families, "triton") == 1 and up(families, "vllm") == 1


def test_engine_endpoint_down_still_answers(endpoint_engine_down):
    response, families = scrape(endpoint_engine_down)
    assert response.status_code == 200
    assert up(families, "triton") == 0 and up(families, "vllm") == 1
    assert "vllm:generation_tokens" in families
    assert not any(name.startswith("nv_") for name in families)


@pytest.mark.parametrize(
    "status, body",
    [
        (200, b"<html><body>Service Unavailable</body></html>"),
        (200, b"\xff\xfe not utf-8"),
        (500, TRITON_TEXT.encode()),
    ],
    ids=["garbage", "not-utf8", "http-500"],
)
def test_engine_garbage_or_failure_still_answers(endpoint, engine, status, body):
    engine.status, engine.body = status, body
    response, families = scrape(endpoint)
    assert response.status_code == 200
    assert up(families, "triton") == 0 and up(families, "vllm") == 1
    assert not any(name.startswith("nv_") for name in families)
