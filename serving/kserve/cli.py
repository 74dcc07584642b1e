"""tritonserver's command line, as the CPU engine accepts it.

The instance supervisor starts either ``tritonserver`` (GPU instance types, the serving image)
or ``python -m serving.kserve`` (the CPU engine) with one and the same command line: only the
executable differs. So the CPU engine parses the subset of tritonserver's options that the
platform (and Triton's own CI scripts, run here against it) relies on, with Triton's names,
syntax (``--opt=value`` or ``--opt value``; booleans ``true|on|1`` / ``false|off|0``) and
defaults (r26.07, ``src/command_line_parser.cc``; ``tests/data/tritonserver_options_r26.07.txt``
keeps a copy of that table's names and a test holds every name here to it).

A tritonserver option this engine does not implement is refused by name, as is a value whose
behaviour it does not reproduce (``--allow-grpc=false``): a start that cannot mean what it says
stops here, before anything loads.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path

TRUE_WORDS = frozenset({"true", "on", "1"})
FALSE_WORDS = frozenset({"false", "off", "0"})
# Triton's two log formats, as date formats for Python's logging (same message layout).
LOG_DATE_FORMATS = {"default": None, "ISO8601": "%Y-%m-%dT%H:%M:%S%z"}
CONTROL_MODES = ("none", "explicit")  # "poll" watches the repository: not implemented here


class OptionError(ValueError):
    """The command line asks for something this engine cannot do; the message says what."""


def triton_bool(value: str) -> bool:
    """Triton's ``ParseOption<bool>``: case-insensitive true/on/1 and false/off/0, else an error."""
    word = value.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {value}")


def port(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535)")
    return number


def non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return number


def backend_setting(value: str) -> tuple[str, str, str]:
    """``<backend>,<setting>=<value>`` (Triton's ``--backend-config``)."""
    backend, _, rest = value.partition(",")
    setting, eq, setting_value = rest.partition("=")
    if not backend or not setting or not eq:
        raise argparse.ArgumentTypeError(
            f"--backend-config expects <backend>,<setting>=<value>, got {value!r}"
        )
    return backend, setting, setting_value


@dataclass(frozen=True)
class ServerOptions:
    """What the CPU engine was asked to do, in tritonserver's terms."""

    model_repository: Path
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()
    exit_timeout_secs: int = 30
    server_id: str = "triton"
    log_level: int = logging.INFO
    log_format: str = "default"
    log_file: Path | None = None
    backend_directory: Path | None = None
    backend_config: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)

    def models_to_load(self) -> list[str] | None:
        """The models to load at start: ``None`` means every model of the repository."""
        if self.model_control_mode == "none" or "*" in self.load_models:
            return None
        return list(self.load_models)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving.kserve",
        description="The CPU engine: KServe v2 over gRPC and HTTP, started like tritonserver.",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--model-repository", "--model-store", dest="model_repository", type=Path, required=True)
    add("--id", dest="server_id", default="triton")
    add("--http-address", default="0.0.0.0")
    add("--http-port", type=port, default=8000)
    add("--grpc-address", default="0.0.0.0")
    add("--grpc-port", type=port, default=8001)
    add("--metrics-address", default="0.0.0.0")
    add("--metrics-port", type=port, default=8002)
    add("--allow-http", type=triton_bool, default=True)
    add("--allow-grpc", type=triton_bool, default=True)
    add("--allow-metrics", type=triton_bool, default=True)
    add("--allow-gpu-metrics", type=triton_bool, default=True)
    add("--model-control-mode", default="none")
    add("--load-model", dest="load_models", action="append", default=[])
    add("--strict-readiness", type=triton_bool, default=True)
    add("--exit-on-error", type=triton_bool, default=True)
    add("--exit-timeout-secs", type=non_negative, default=30)
    add("--log-verbose", type=non_negative, default=0)
    add("--log-info", type=triton_bool, default=True)
    add("--log-warning", type=triton_bool, default=True)
    add("--log-error", type=triton_bool, default=True)
    add("--log-format", default="default")
    add("--log-file", type=Path, default=None)
    add("--backend-directory", type=Path, default=None)
    add("--backend-config", type=backend_setting, action="append", default=[])
    return parser


# Values the CPU engine does not reproduce; a start that asks for them is refused.
REQUIRED_TRUE = {
    "allow_http": "the CPU engine always serves HTTP (the supervisor checks readiness over it)",
    "allow_grpc": "the CPU engine always serves gRPC",
    "strict_readiness": "the CPU engine opens its ports only once every model is ready",
    "exit_on_error": "the CPU engine stops when a model fails to load at start",
}


def parse_options(argv: list[str] | None = None) -> ServerOptions:
    """Parse tritonserver's flags; exits 2 with a message on anything refused."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _options(args)
    except OptionError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _options(args: argparse.Namespace) -> ServerOptions:
    for name, why in REQUIRED_TRUE.items():
        if not getattr(args, name):
            raise OptionError(f"--{name.replace('_', '-')}=false is not supported: {why}")
    if args.model_control_mode not in CONTROL_MODES:
        raise OptionError(
            f"--model-control-mode={args.model_control_mode} is not supported "
            f"(one of: {', '.join(CONTROL_MODES)})"
        )
    if args.load_models and args.model_control_mode != "explicit":
        raise OptionError("--load-model requires --model-control-mode=explicit")
    if args.log_format not in LOG_DATE_FORMATS:
        raise OptionError(f"--log-format must be one of {sorted(LOG_DATE_FORMATS)}")
    return ServerOptions(
        model_repository=args.model_repository,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models),
        exit_timeout_secs=args.exit_timeout_secs,
        server_id=args.server_id,
        log_level=_log_level(args),
        log_format=args.log_format,
        log_file=args.log_file,
        backend_directory=args.backend_directory,
        backend_config=tuple(args.backend_config),
    )


def _log_level(args: argparse.Namespace) -> int:
    """Triton's switches as one threshold: verbose → DEBUG, then info, warning, error."""
    if args.log_verbose > 0:
        return logging.DEBUG
    for enabled, level in (
        (args.log_info, logging.INFO),
        (args.log_warning, logging.WARNING),
        (args.log_error, logging.ERROR),
    ):
        if enabled:
            return level
    return logging.CRITICAL + 1


def option_names() -> set[str]:
    """Every long option this engine accepts, without the leading dashes."""
    names: set[str] = set()
    for action in _parser()._actions:
        names.update(s[2:] for s in action.option_strings if s.startswith("--"))
    names.discard("help")
    return names
