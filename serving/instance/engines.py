"""Which engine an instance runs, and the one command line both engines take.

Two engines stand behind one interface:

* ``tritonserver`` — NVIDIA's Triton with the vLLM (or Python) backend, in the serving image,
  on GPU instance types: the production data plane.
* ``cpu`` — ``python -m serving.kserve``, the embedded default and the tests' engine: KServe v2
  over the same tensor contract, on a transformers model.

The supervisor builds a single tritonserver command line (:func:`tritonserver_args`) and only
the executable differs (:func:`engine_executable`), so the code path a GPU pod runs — flags,
readiness over ``/v2/health/ready``, drain through ``--exit-timeout-secs`` — is the one every
test runs. ``TRITONSERVER_BIN`` says where tritonserver is (a path, or a command line split
by shell rules); tests point it at a script that runs the CPU engine with the same argv.
"""

from __future__ import annotations

import math
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINES = ("tritonserver", "cpu")
TRITONSERVER_DEFAULT_BIN = "/opt/tritonserver/bin/tritonserver"
TRITONSERVER_BIN_ENV = "TRITONSERVER_BIN"
ENGINE_ENV = "SERVING_ENGINE"


@dataclass(frozen=True)
class EnginePorts:
    http: int
    grpc: int
    metrics: int


def default_engine() -> str:
    """``$SERVING_ENGINE`` (the serving image sets ``tritonserver``), else the CPU engine."""
    engine = os.environ.get(ENGINE_ENV, "cpu")
    if engine not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={engine!r} is not one of {', '.join(ENGINES)}")
    return engine


def engine_for_gpus(gpus: int) -> str:
    """The instance type decides: any GPU means Triton, none means the CPU engine."""
    return "tritonserver" if gpus > 0 else "cpu"


def engine_executable(engine: str) -> list[str]:
    """The argv prefix that starts ``engine``; ``$TRITONSERVER_BIN`` says where tritonserver
    is (the CPU engine is always this Python's ``-m serving.kserve``)."""
    if engine == "tritonserver":
        return shlex.split(os.environ.get(TRITONSERVER_BIN_ENV) or TRITONSERVER_DEFAULT_BIN)
    if engine == "cpu":
        return [sys.executable, "-m", "serving.kserve"]
    raise ValueError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")


def tritonserver_args(
    repository: Path,
    model: str,
    *,
    host: str,
    ports: EnginePorts,
    drain_timeout: float,
    log_verbose: int = 0,
) -> list[str]:
    """tritonserver's flags for serving one package's model from ``repository``.

    Only the package's model is loaded (explicit control mode), readiness is strict (ready only
    once that model is), the drain budget becomes Triton's exit timeout, and metrics (GPU ones
    too, where there is a GPU) are on. Every name here is checked against Triton's own option
    table in the tests."""
    return [
        f"--model-repository={repository}",
        f"--http-address={host}",
        f"--http-port={ports.http}",
        f"--grpc-address={host}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={host}",
        f"--metrics-port={ports.metrics}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=true",
        "--model-control-mode=explicit",
        f"--load-model={model}",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--exit-timeout-secs={math.ceil(drain_timeout)}",
        f"--log-verbose={log_verbose}",
        "--log-info=true",
        "--log-warning=true",
        "--log-error=true",
    ]


def resolve_ports(host: str, http: int, grpc: int, metrics: int) -> EnginePorts:
    """Ports for the engine, with each 0 replaced by a port free now on ``host``.

    tritonserver cannot listen on "any port" and report it, so the supervisor picks the ports
    and readiness is polled on them. All of them are held open until all are chosen, so the
    three differ; another process could still take one before the engine binds it, in which
    case the engine fails to start and says so."""
    held: list[socket.socket] = []
    chosen = []
    try:
        for wanted in (http, grpc, metrics):
            if wanted:
                chosen.append(wanted)
                continue
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            sock.bind((host, 0))
            held.append(sock)
            chosen.append(sock.getsockname()[1])
    finally:
        for sock in held:
            sock.close()
    return EnginePorts(*chosen)


def local_address(host: str) -> str:
    """Where the supervisor reaches an engine bound to ``host`` (a wildcard means loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
