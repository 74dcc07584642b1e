"""``python -m serving.kserve --model-repository DIR``: load every model, then serve KServe v2.

Exit status: 0 after a clean drain; 2 when the repository is unusable; 1 when a model fails to
load. In both failure cases no port was ever opened.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from serving.kserve.repository import ModelControl, RepositoryError, read_repository
from serving.kserve.server import load_entry, load_repository, repository_configs, serve_kserve

logger = logging.getLogger("serving.kserve")


class _StopRequested(BaseException):
    """SIGTERM/SIGINT before serving began: nothing is in flight, so stop at once."""


def _stop_loading(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving.kserve", description=__doc__)
    parser.add_argument("--model-repository", required=True, type=Path)
    parser.add_argument(
        "--model", action="append", default=None, help="serve only this model (repeatable)"
    )
    parser.add_argument(
        "--model-control-mode",
        choices=("none", "explicit"),
        default="none",
        help="explicit: only the --model models load at start; others load and unload through "
        "the repository API (Triton's --model-control-mode)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    for name in ("http_port", "grpc_port", "metrics_port"):
        if not 0 <= getattr(args, name) <= 65535:
            parser.error(f"--{name.replace('_', '-')} must be a port number (0-65535)")
    if args.drain_timeout < 0:
        parser.error("--drain-timeout must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        explicit = args.model_control_mode == "explicit"
        if explicit and not args.model:
            entries = []  # as Triton in explicit mode: nothing loads until asked
            if not args.model_repository.is_dir():
                raise RepositoryError(
                    f"model repository {args.model_repository} is not a directory"
                )
        else:
            entries = read_repository(args.model_repository, args.model)
    except RepositoryError as exc:
        logger.error("model repository refused, not serving: %s", exc)
        return 2
    # Until the event loop takes the signals over (after loading), a stop request ends the
    # start cleanly instead of killing the process half-way through reading weights.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_loading)
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
                host=args.host,
                http_port=args.http_port,
                grpc_port=args.grpc_port,
                metrics_port=args.metrics_port,
                ready_callback=ready,
                drain_timeout=args.drain_timeout,
                configs=repository_configs(entries),
                control=ModelControl(args.model_repository, explicit, load_entry),
            )
        )
    except _StopRequested as stop:  # arrived before serve_kserve installed its handlers
        logger.info("%s before serving began; stopped", stop)
        for engine in engines:
            engine.shutdown()
        return 0
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
