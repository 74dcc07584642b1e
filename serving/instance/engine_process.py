"""The engine as a child process: ``python -m serving.kserve``, watched from the instance.

A separate process because the engine is the part that loads weights, can run out of memory or
crash; the supervisor notices (the child's exit) and exits nonzero itself, so whoever launched
the instance sees the failure. The child says it is serving by printing
``KSERVE READY http=<port> grpc=<port> metrics=<port>`` on stdout, only once its engines are
loaded and every port listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from serving.instance.log import event

READY_LINE = re.compile(rb"^KSERVE READY http=(\d+) grpc=(\d+) metrics=(\d+)\s*$")


class EngineStartError(RuntimeError):
    """The engine exited or did not report ready in time."""


@dataclass(frozen=True)
class EnginePorts:
    http: int
    grpc: int
    metrics: int


class EngineProcess:
    def __init__(
        self,
        repository: Path,
        *,
        host: str,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        multiproc_dir: Path,
        drain_timeout: float,
    ) -> None:
        self.command = [
            sys.executable, "-m", "serving.kserve",
            "--model-repository", str(repository),
            "--host", host,
            "--http-port", str(http_port),
            "--grpc-port", str(grpc_port),
            "--metrics-port", str(metrics_port),
            "--drain-timeout", str(drain_timeout),
        ]  # fmt: skip
        self.env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir)}
        self.proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, ready_timeout: float, stop: asyncio.Event) -> EnginePorts | None:
        """Spawn the child and wait for its ready line. ``None`` when ``stop`` was set first;
        raises :class:`EngineStartError` if the child exits or stays silent too long."""
        # stderr is inherited: the engine's own log goes where the instance's goes.
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdout=asyncio.subprocess.PIPE, env=self.env
        )
        event("engine_spawned", pid=self.proc.pid)
        ready = asyncio.ensure_future(self._read_ready())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, stopped}, timeout=ready_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopped.cancel()
        if ready in done:
            ports = ready.result()  # raises EngineStartError if the child exited first
            self._pump = asyncio.create_task(self._forward_stdout())
            return ports
        ready.cancel()
        if stopped in done:
            return None
        raise EngineStartError(f"engine did not report ready within {ready_timeout:g}s")

    async def _read_ready(self) -> EnginePorts:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            match = READY_LINE.match(line)
            if match:
                http, grpc, metrics = (int(g) for g in match.groups())
                return EnginePorts(http=http, grpc=grpc, metrics=metrics)
            event("engine_stdout", line=line.decode(errors="replace").rstrip())
        code = await self.proc.wait()
        raise EngineStartError(f"engine exited with status {code} before it was ready")

    async def _forward_stdout(self) -> None:
        """Keep reading the child's stdout so a chatty child never blocks on a full pipe."""
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            event("engine_stdout", line=line.decode(errors="replace").rstrip())

    async def wait(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self, timeout: float) -> int | None:
        """SIGTERM (the child drains its own in-flight requests), then SIGKILL after
        ``timeout``. Returns the exit status, ``None`` if it was never started."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                event("engine_kill", reason=f"still running {timeout:g}s after SIGTERM")
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._pump is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump, 1.0)
        return self.proc.returncode
