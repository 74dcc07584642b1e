"""``python -m serving.frontend``: the OpenAI-compatible front end as its own process.

    python -m serving.frontend --model-repository DIR --kserve-grpc 127.0.0.1:8001 \\
        --kserve-http 127.0.0.1:8000 --kserve-metrics http://127.0.0.1:8002/metrics \\
        --host 127.0.0.1 --port 9000 [--no-openai] [--access-log]

On SIGTERM uvicorn stops accepting connections and waits up to ``--drain-timeout`` seconds for
in-flight requests (streams included) to finish before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from serving.frontend.app import create_app
from serving.frontend.settings import Settings
from serving.frontend.tool_parsers import ALIASES, DEFAULT_PARSER, PARSERS, parser_name


class DrainingServer(uvicorn.Server):
    """uvicorn, except that a SIGTERM which drained cleanly ends the process with status 0.

    uvicorn re-raises the signal it caught once it has shut down, so the process would report
    "killed by SIGTERM" even after every in-flight request finished; for a supervisor SIGTERM is
    the normal way to stop an instance, and a clean drain is success."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="OpenAI-compatible front end over KServe v2.")
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--kserve-grpc", default="127.0.0.1:8001")
    parser.add_argument("--kserve-http", default="127.0.0.1:8000")
    parser.add_argument("--kserve-metrics", default="http://127.0.0.1:8002/metrics")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--no-openai", dest="openai", action="store_false", help="serve only health and /metrics"
    )
    parser.add_argument("--default-max-tokens", type=int, default=16)
    parser.add_argument(
        "--tool-call-parser",
        default=DEFAULT_PARSER,
        choices=sorted([*PARSERS, *ALIASES]),
        help="how models write tool calls under tool_choice auto, unless their config.pbtxt "
        "sets the tool_call_parser parameter",
    )
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="info")
    # One log line per request is CPU on the path this process exists to keep short; the
    # instance supervisor (serving.instance) never logged them either (log level warning).
    parser.add_argument(
        "--access-log", action="store_true", help="log every request (uvicorn's access log)"
    )
    # uvloop (from uvicorn[standard]) takes about 1 ms off each request: bench/frontend_overhead.py.
    parser.add_argument("--loop", default="auto", choices=("asyncio", "uvloop", "auto"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.default_max_tokens < 1:
        raise SystemExit("--default-max-tokens must be at least 1")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    settings = Settings(
        model_repository=args.model_repository,
        kserve_grpc=args.kserve_grpc,
        kserve_http=args.kserve_http,
        kserve_metrics=args.kserve_metrics,
        openai=args.openai,
        default_max_tokens=args.default_max_tokens,
        tool_call_parser=parser_name(args.tool_call_parser),
    )
    config = uvicorn.Config(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(args.drain_timeout),
        loop=args.loop,
        access_log=args.access_log,
    )
    DrainingServer(config).run()


if __name__ == "__main__":
    main()
