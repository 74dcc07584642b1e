"""Run the KServe v2 gRPC + HTTP servers and the Triton-style metrics endpoint in one loop.

The order is the platform's start-up contract: engines are loaded first (by the caller, or by
:func:`load_repository`) with every port closed, then the Python-backend models (in this
event loop, which their processes report to); the ports open together only once each model
reports ready, and then one ``KSERVE READY http=<port> grpc=<port> metrics=<port>`` line goes to
stdout. On SIGTERM/SIGINT the servers stop accepting inference (readiness turns false, new
requests are refused as unavailable), in-flight requests run to completion within the drain
timeout, and then the servers close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tritonclient.grpc import model_config_pb2 as mc

from serving.engine.core import Engine, load_engine
from serving.engine.model import read_engine_config
from serving.engine.stats import EngineStats, FanOutStats
from serving.kserve.grpc_server import start_grpc_server
from serving.kserve.http_server import build_app
from serving.kserve.service import InferenceService, ModelControl
from serving.kserve.triton_metrics import merge_families, render
from serving.metrics import triton_vllm
from serving.metrics.triton_vllm import TritonVllmMetrics
from serving.repository import ModelEntry

logger = logging.getLogger("serving.kserve")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: shutdown is ours to order (drain first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def metrics_app(
    service: InferenceService, bridged: list[TritonVllmMetrics] | None = None
) -> Starlette:
    """Triton's metrics port: the ``nv_*`` families, then the ``vllm:`` families Triton's vLLM
    backend bridges for the models that report them (``bridged``), then the Python models'
    custom metric families (``pb_utils.MetricFamily``), each family once."""

    async def metrics(request: Request) -> Response:
        # Without a fixed list: the served models' own, which change under model control.
        families = bridged if bridged is not None else bridged_metrics(service.engines())
        text = render(service.stats) + triton_vllm.render(families)
        text += merge_families([h.metrics_text() for h in service.python_handles()])
        return Response(text, media_type=PROMETHEUS_CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


def engine_stats(model_name: str, max_model_len: int | None = None) -> EngineStats | None:
    """vLLM-named metrics in prometheus multiprocess mode, when this process is set up for it.

    ``max_model_len`` bounds the token-count histogram buckets as vLLM does; the engine's own
    limit is only known after loading, so the configured one (if any) is used."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    from serving.metrics.vllm_metrics import VllmMetrics  # prometheus-client reads the env var

    stats: EngineStats = VllmMetrics(model_name, max_model_len=max_model_len)
    return stats


def reports_custom_metrics(config: mc.ModelConfig) -> bool:
    """Triton's vLLM backend rule (``model.py``, ``_get_bool_config_param``): the parameter
    ``REPORT_CUSTOM_METRICS`` present with a ``string_value`` of ``"true"``, in any case."""
    if "REPORT_CUSTOM_METRICS" not in config.parameters:
        return False
    return config.parameters["REPORT_CUSTOM_METRICS"].string_value.lower() == "true"


def load_repository(entries: list[ModelEntry]) -> list[Engine]:
    """Load every model (slow: weights are read); raises on the first that fails.

    A model bridges the ``vllm:`` families onto the metrics port as Triton's vLLM backend does:
    when its ``config.pbtxt`` sets ``REPORT_CUSTOM_METRICS`` and its ``model.json`` does not
    set ``disable_log_stats``. Those families' token buckets follow the loaded engine's
    ``max_model_len`` (vLLM's ``model_config.max_model_len``), so they join after loading."""
    return [load_entry(entry) for entry in entries]


def load_entry(entry: ModelEntry) -> Engine:
    """Load one model (see :func:`load_repository`); also what explicit model control's
    ``load`` runs."""
    logger.info("loading model %s version %s", entry.name, entry.version)
    engine_config = read_engine_config(entry.version_dir)
    stats = FanOutStats()
    multiprocess = engine_stats(entry.name, engine_config.max_model_len)
    if multiprocess is not None:
        stats.add(multiprocess)
    engine = load_engine(entry.version_dir, name=entry.name, stats=stats)
    if reports_custom_metrics(entry.config) and not engine_config.disable_log_stats:
        stats.add(TritonVllmMetrics(engine.name, engine.version, engine.max_model_len))
    return engine


def bridged_metrics(engines: list[Engine]) -> list[TritonVllmMetrics]:
    """The bridged families each engine feeds (see :func:`load_repository`)."""
    found = []
    for engine in engines:
        sinks = engine.stats.sinks if isinstance(engine.stats, FanOutStats) else (engine.stats,)
        found += [sink for sink in sinks if isinstance(sink, TritonVllmMetrics)]
    return found


async def serve_kserve(
    engines: list[Engine],
    *,
    host: str = "127.0.0.1",
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int | None = 8002,
    grpc_host: str | None = None,
    metrics_host: str | None = None,
    ready_callback: Callable[[int, int, int], Any] | None = None,
    drain_timeout: float = 30.0,
    configs: dict[str, mc.ModelConfig] | None = None,
    stop: asyncio.Event | None = None,
    control: ModelControl | None = None,
    python_models: list[ModelEntry] | None = None,
) -> None:
    """Serve ``engines`` until SIGTERM/SIGINT (or ``stop`` is set), then drain and return.

    ``python_models`` (Python-backend entries of the repository) are loaded first, with every
    port still closed; the first that fails raises
    :class:`~serving.kserve.service.ModelLoadFailed` and nothing is served.

    ``host`` is the HTTP address and, unless ``grpc_host``/``metrics_host`` say otherwise, the
    others' too. Ports may be 0 (any free port); ``metrics_port=None`` opens no metrics port
    (tritonserver's ``--allow-metrics=false``; reported as 0). ``ready_callback(http, grpc,
    metrics)`` receives the bound ports once everything listens. The engines are shut down on
    return. ``control`` enables Triton's model control (load/unload at run time)."""
    not_ready = [e.name for e in engines if not e.ready]
    if not_ready:
        raise RuntimeError(f"engines not ready, ports stay closed: {not_ready}")
    service = InferenceService(engines, configs, control)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)

    sockets: list[socket.socket] = []
    drain_deadline = 0.0
    grpc_server: Any = None
    servers: list[_Uvicorn] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for entry in python_models or []:
            logger.info("loading model %s version %s", entry.name, entry.version)
            await service.add_python(entry)
        http_sock = _bind(host, http_port)
        sockets.append(http_sock)
        apps = [(build_app(service), http_sock)]
        if metrics_port is not None:
            metrics_sock = _bind(metrics_host or host, metrics_port)
            sockets.append(metrics_sock)
            apps.append((metrics_app(service), metrics_sock))
        grpc_server, grpc_bound = await start_grpc_server(service, grpc_host or host, grpc_port)
        for app, sock in apps:
            config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
            servers.append(_Uvicorn(config))
            tasks.append(asyncio.create_task(servers[-1].serve(sockets=[sock])))
        while not all(s.started for s in servers):
            failed = [t for t in tasks if t.done()]
            if failed:
                raise RuntimeError("an HTTP server failed to start") from failed[0].exception()
            await asyncio.sleep(0.01)
        bound_metrics = metrics_sock.getsockname()[1] if metrics_port is not None else 0
        ports = (http_sock.getsockname()[1], grpc_bound, bound_metrics)
        logger.info("serving %s: http=%d grpc=%d metrics=%d", sorted(service.models), *ports)
        if ready_callback is not None:
            ready_callback(*ports)
        await stop.wait()

        logger.info("draining: %d request(s) in flight", service.in_flight)
        drain_deadline = loop.time() + drain_timeout
        service.begin_drain()
        if await service.wait_idle(drain_timeout):
            logger.info("drained")
        else:
            logger.warning(
                "drain timeout (%.0fs): %d request(s) still running are aborted",
                drain_timeout,
                service.in_flight,
            )
    finally:
        if grpc_server is not None:
            # The engine is done, but a stream may still hold responses it has not delivered
            # (the engine can outrun a slow reader): give them what is left of the drain time.
            # An open stream with nothing left to send is cancelled at the deadline.
            remaining = drain_deadline - loop.time() if drain_deadline else 0.0
            await grpc_server.stop(grace=max(1.0, remaining))
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for engine in engines:
            engine.shutdown()
        service.shutdown()  # also the models loaded at run time (explicit model control)
        await service.close_python()
        for sig in installed:
            loop.remove_signal_handler(sig)
        for sock in sockets:
            sock.close()


def repository_configs(entries: list[ModelEntry]) -> dict[str, mc.ModelConfig]:
    return {entry.name: entry.config for entry in entries}
