"""The engine as a child process, watched from the instance.

A separate process because the engine is the part that loads weights, can run out of memory or
crash; the supervisor notices (the child's exit) and exits nonzero itself, so whoever launched
the instance sees the failure. The child is ``tritonserver`` or the CPU engine started with
tritonserver's flags (:mod:`serving.instance.engines`); either is ready when Triton says so:
``/v2/health/ready`` and the package model's ``/v2/models/<name>/ready`` both answer 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import httpx

from serving.instance.engines import EnginePorts
from serving.instance.log import event

READY_POLL_SECONDS = 0.25


class EngineStartError(RuntimeError):
    """The engine exited or did not report ready in time."""


class EngineProcess:
    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str],
        ports: EnginePorts,
        address: str,
        model: str,
    ) -> None:
        self.command = command
        self.env = env
        self.ports = ports
        self.model = model
        self.ready_urls = [
            f"http://{address}:{ports.http}/v2/health/ready",
            f"http://{address}:{ports.http}/v2/models/{model}/ready",
        ]
        self.proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, ready_timeout: float, stop: asyncio.Event) -> EnginePorts | None:
        """Spawn the child and wait until Triton's health endpoints say ready. ``None`` when
        ``stop`` was set first; raises :class:`EngineStartError` if the child exits or is not
        ready in time."""
        # stderr is inherited: the engine's own log goes where the instance's goes.
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdout=asyncio.subprocess.PIPE, env=self.env
        )
        event("engine_spawned", pid=self.proc.pid)
        self._pump = asyncio.create_task(self._forward_stdout())
        ready = asyncio.ensure_future(self._wait_ready())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, stopped}, timeout=ready_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopped.cancel()
        if ready in done:
            ready.result()  # raises EngineStartError if the child exited first
            return self.ports
        ready.cancel()
        if stopped in done:
            return None
        raise EngineStartError(f"engine did not report ready within {ready_timeout:g}s")

    async def _wait_ready(self) -> None:
        assert self.proc is not None
        async with httpx.AsyncClient(timeout=2.0) as client:
            while self.proc.returncode is None:
                if await self._ready(client):
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.proc.wait()), READY_POLL_SECONDS)
        raise EngineStartError(
            f"engine exited with status {self.proc.returncode} before it was ready"
        )

    async def _ready(self, client: httpx.AsyncClient) -> bool:
        for url in self.ready_urls:
            try:
                response = await client.get(url)
            except httpx.HTTPError:
                return False
            if response.status_code != 200:
                return False
        return True

    async def _forward_stdout(self) -> None:
        """Keep reading the child's stdout (into the instance's log) so a chatty child never
        blocks on a full pipe."""
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
