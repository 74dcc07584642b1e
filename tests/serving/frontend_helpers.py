"""Real processes for the front-end tests: the KServe engine server and the front end itself,
on free ports of 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 180.0


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) | (extra or {})
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class Engine:
    http_port: int
    grpc_port: int
    metrics_port: int
    process: subprocess.Popen[str]
    output: list[str]

    @property
    def frontend_args(self) -> list[str]:
        return [
            "--kserve-grpc",
            f"127.0.0.1:{self.grpc_port}",
            "--kserve-http",
            f"127.0.0.1:{self.http_port}",
            "--kserve-metrics",
            f"http://127.0.0.1:{self.metrics_port}/metrics",
        ]


@contextmanager
def kserve_engine(repository: Path, env: dict[str, str] | None = None) -> Iterator[Engine]:
    """``python -m serving.kserve`` on free ports, once it printed ``KSERVE READY``."""
    http, grpc_, metrics = free_port(), free_port(), free_port()
    command = [sys.executable, "-m", "serving.kserve", "--model-repository", str(repository)]
    command += [
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
    ]
    command += ["--http-port", str(http), "--grpc-port", str(grpc_)]
    command += ["--metrics-port", str(metrics)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith("KSERVE READY"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.wait(0.2):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("serving.kserve did not get ready:\n" + "".join(output[-40:]))
        yield Engine(http, grpc_, metrics, process, output)
    finally:
        _stop(process)


@dataclass
class Frontend:
    port: int
    process: subprocess.Popen[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def frontend(
    repository: Path,
    engine_args: list[str],
    *extra: str,
    wait_ready: bool = True,
    env: dict[str, str] | None = None,
) -> Iterator[Frontend]:
    """``python -m serving.frontend`` on a free port, once it answers (ready, if asked)."""
    port = free_port()
    command = [sys.executable, "-m", "serving.frontend", "--model-repository", str(repository)]
    command += [*engine_args, "--host", "127.0.0.1", "--port", str(port), *extra]
    process = subprocess.Popen(command, cwd=ROOT, env=_env(env), text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"serving.frontend exited with {process.returncode}")
            try:
                path = "/health/ready" if wait_ready else "/health/live"
                if httpx.get(url + path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("serving.frontend did not answer in time")
            time.sleep(0.2)
        yield Frontend(port, process)
    finally:
        _stop(process)


def dead_engine_args() -> list[str]:
    """KServe addresses where nothing listens (ports just found free)."""
    http, grpc_, metrics = free_port(), free_port(), free_port()
    return [
        "--kserve-grpc",
        f"127.0.0.1:{grpc_}",
        "--kserve-http",
        f"127.0.0.1:{http}",
        "--kserve-metrics",
        f"http://127.0.0.1:{metrics}/metrics",
    ]
