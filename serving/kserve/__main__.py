"""``python -m serving.kserve --model-repository=DIR [tritonserver flags]``: the CPU engine.

It loads the repository's models (all, or with ``--model-control-mode=explicit`` only those
named by ``--load-model``), then serves KServe v2 over HTTP and gRPC and Triton-style metrics,
and prints ``KSERVE READY http=<port> grpc=<port> metrics=<port>`` (ports may be given as 0;
``metrics=0`` when ``--allow-metrics=false`` left the metrics port closed).
Its command line is tritonserver's (see :mod:`serving.kserve.cli`), so the instance supervisor
starts it exactly as it starts ``tritonserver``.

Exit status: 0 after a clean drain; 2 when the repository is unusable; 1 when a model fails to
load. In both failure cases no port was ever opened.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from types import FrameType

from serving.kserve.cli import LOG_DATE_FORMATS, ServerOptions, parse_options
from serving.kserve.server import load_entry, load_repository, repository_configs, serve_kserve
from serving.kserve.service import ModelControl, ModelLoadFailed
from serving.repository import PYTHON_BACKEND, RepositoryError, read_repository

logger = logging.getLogger("serving.kserve")


class _StopRequested(BaseException):
    """SIGTERM/SIGINT before serving began: nothing is in flight, so stop at once."""


def _stop_loading(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


def configure_logging(options: ServerOptions) -> None:
    handler: logging.Handler = (
        logging.FileHandler(options.log_file) if options.log_file else logging.StreamHandler()
    )
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt=LOG_DATE_FORMATS[options.log_format],
        )
    )
    logging.basicConfig(level=min(options.log_level, logging.CRITICAL), handlers=[handler])
    if options.log_level > logging.CRITICAL:
        logging.disable(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    configure_logging(options)
    if options.backend_directory is not None:
        logger.info(
            "--backend-directory=%s: the CPU engine's backend is built in",
            options.backend_directory,
        )
    for backend, setting, value in options.backend_config:
        logger.info("backend config %s: {%r: %r}", backend, setting, value)
    explicit = options.model_control_mode == "explicit"
    to_load = options.models_to_load()
    try:
        # Explicit mode without --load-model: an empty list, nothing loads until asked.
        entries = read_repository(options.model_repository, to_load)
    except RepositoryError as exc:
        logger.error("model repository refused, not serving: %s", exc)
        return 2
    # Until the event loop takes the signals over (after loading), a stop request ends the
    # start cleanly instead of killing the process half-way through reading weights.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_loading)
    python_entries = [e for e in entries if e.backend == PYTHON_BACKEND]
    entries = [e for e in entries if e.backend != PYTHON_BACKEND]
    try:
        engines = load_repository(entries)
    except _StopRequested as stop:
        logger.info("%s while loading; stopped without serving", stop)
        return 0
    except Exception as exc:  # any load failure: say which model and why, open nothing
        logger.error("model failed to load, not serving: %s: %s", type(exc).__name__, exc)
        return 1

    def ready(http: int, grpc: int, metrics: int) -> None:
        print(f"KSERVE READY http={http} grpc={grpc} metrics={metrics}", flush=True)

    try:
        asyncio.run(
            serve_kserve(
                engines,
                host=options.http_address,
                http_port=options.http_port,
                grpc_host=options.grpc_address,
                grpc_port=options.grpc_port,
                metrics_host=options.metrics_address,
                metrics_port=options.metrics_port if options.allow_metrics else None,
                ready_callback=ready,
                drain_timeout=options.exit_timeout_secs,
                configs=repository_configs(entries),
                control=ModelControl(options.model_repository, explicit, load_entry),
                python_models=python_entries,
            )
        )
    except ModelLoadFailed as exc:  # a Python model: no port was opened
        logger.error("model failed to load, not serving: %s", exc)
        return 1
    except _StopRequested as stop:  # arrived before serve_kserve installed its handlers
        logger.info("%s before serving began; stopped", stop)
        for engine in engines:
            engine.shutdown()
        return 0
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
