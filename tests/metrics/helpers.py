"""Metric sources for the scraper's tests: loopback HTTP servers that answer what a test sets
(an engine's exposition rendered by prometheus-client, garbage, an error) or hang."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from portal.deployments.models import Deployment, Instance, InstanceState
from serving.metrics.vllm_metrics import REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS

LABELS = {"model_name": "demo--tiny", "engine": "0"}


class EngineExposition:
    """The families the portal reads, under the names an instance serves them, in a registry of
    their own; a new object is an engine that restarted (every counter back at zero)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg, names = self.registry, list(LABELS)
        self.success = Counter("nv_inference_request_success", "ok", ["model"], registry=reg)
        self.failure = Counter(
            "nv_inference_request_failure", "failed", ["model", "reason"], registry=reg
        )
        self.prompt = Counter("vllm:prompt_tokens", "prompt", names, registry=reg)
        self.generation = Counter("vllm:generation_tokens", "generated", names, registry=reg)
        self.queries = Counter("vllm:prefix_cache_queries", "queries", names, registry=reg)
        self.hits = Counter("vllm:prefix_cache_hits", "hits", names, registry=reg)
        self.usage = Gauge("vllm:kv_cache_usage_perc", "usage", names, registry=reg)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "ttft", names, buckets=TTFT_BUCKETS, registry=reg
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "e2e",
            names,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=reg,
        )
        self.usage.labels(**LABELS).set(0.0)

    def serve(
        self,
        *,
        ok: int = 0,
        failed: int = 0,
        ttft: float = 0.05,
        e2e: float = 0.4,
        engine: str = "0",
    ) -> None:
        """Account for finished requests: ``ok`` successful ones and ``failed`` failed ones,
        on the engine (and model) named ``engine``."""
        labels = {**LABELS, "engine": engine}
        model = f"{LABELS['model_name']}-{engine}"
        if ok:
            self.success.labels(model).inc(ok)
        if failed:
            self.failure.labels(model, "BACKEND").inc(failed)
        for _ in range(ok):
            self.prompt.labels(**labels).inc(5)
            self.generation.labels(**labels).inc(8)
            self.queries.labels(**labels).inc(5)
            self.hits.labels(**labels).inc(2)
            self.ttft.labels(**labels).observe(ttft)
            self.e2e.labels(**labels).observe(e2e)

    def set_usage(self, usage: float, engine: str = "0") -> None:
        self.usage.labels(**{**LABELS, "engine": engine}).set(usage)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


@dataclass
class Answer:
    """What a :class:`LoopbackSource` answers next. ``hang``: nothing, until the server stops."""

    status: int = 200
    body: str = ""
    hang: bool = False


@dataclass
class LoopbackSource:
    server: ThreadingHTTPServer
    answer: Answer
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"


@contextlib.contextmanager
def loopback_source(answer: Answer | None = None) -> Iterator[LoopbackSource]:
    source: LoopbackSource

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            current = source.answer
            if current.hang:
                source.released.wait(60)
                return
            body = current.body.encode()
            self.send_response(current.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    source = LoopbackSource(server, answer or Answer())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield source
    finally:
        source.released.set()
        server.shutdown()
        server.server_close()


def add_instance(
    deployment: Deployment, name: str, metrics_url: str, state: str = InstanceState.READY
) -> Instance:
    """An instance row as the launcher mirror writes one, with its ``/metrics`` endpoint."""
    return Instance.objects.create(
        deployment=deployment,
        version=deployment.target_version,
        name=name,
        endpoints={"metrics": metrics_url},
        state=state,
    )
