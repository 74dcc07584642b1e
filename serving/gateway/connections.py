"""What a caller's connection may hold of a gateway process before it is a request.

aiohttp closes a connection idle between requests after ``keepalive_timeout`` (set by the
gateway), but a new connection that sends its request line and headers slowly, a byte now and
then, holds its slot for as long as it likes, and one address may open as many as it likes.
:class:`GuardedSite` listens like aiohttp's ``TCPSite`` and puts each connection behind a
:class:`_Guarded` protocol that hands everything to aiohttp's own handler, and:

- closes a connection whose first request's headers have not all arrived ``header_timeout``
  seconds after it opened (later requests on a kept-alive connection are bounded by the
  keep-alive timeout, which runs from the end of the previous answer);
- answers ``429`` and closes a connection from an address that already holds
  ``max_per_client`` of this process's connections (0: no cap). Behind a load balancer every
  connection comes from the balancer's addresses: raise the cap, or set 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from aiohttp import web

log = logging.getLogger("serving.gateway.connections")

#: The end of a request's headers.
_HEADERS_END = b"\r\n\r\n"
#: Bytes of a first request kept to look for the end of its headers (aiohttp refuses longer).
_HEADERS_MAX = 64 * 1024
_TOO_MANY_BODY = b"too many open connections from this address\n"
TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    + f"Content-Length: {len(_TOO_MANY_BODY)}\r\n\r\n".encode()
    + _TOO_MANY_BODY
)


class ConnectionGuard:
    """The connections of one gateway process, by client address."""

    def __init__(self, header_timeout: float, max_per_client: int) -> None:
        self.header_timeout = header_timeout
        self.max_per_client = max_per_client
        self.open: Counter[str] = Counter()

    def protocol(self, handler: asyncio.Protocol) -> _Guarded:
        return _Guarded(self, handler)


class _Guarded(asyncio.Protocol):
    """aiohttp's handler for one connection, behind the guard's checks."""

    def __init__(self, guard: ConnectionGuard, handler: asyncio.Protocol) -> None:
        self.guard = guard
        self.handler = handler
        self.client: str | None = None
        self.transport: asyncio.Transport | None = None
        self.head = b""  # the first request's bytes, until its headers ended
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if peer else "?"
        guard = self.guard
        if guard.max_per_client and guard.open[client] >= guard.max_per_client:
            self.transport.write(TOO_MANY)  # type: ignore[union-attr]
            transport.close()
            return
        self.client = client
        guard.open[client] += 1
        if guard.header_timeout > 0:
            self.deadline = asyncio.get_running_loop().call_later(
                guard.header_timeout, self._headers_too_slow
            )
        self.handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.client is None:
            return  # refused: nothing reaches the handler
        if self.deadline is not None:
            self.head = (self.head + data)[-_HEADERS_MAX:]
            if _HEADERS_END in self.head:
                self.deadline.cancel()
                self.deadline, self.head = None, b""
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self.client is None:
            return None
        return self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client is None:
            return
        if self.deadline is not None:
            self.deadline.cancel()
        self.guard.open[self.client] -= 1
        if self.guard.open[self.client] <= 0:
            del self.guard.open[self.client]
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()

    def _headers_too_slow(self) -> None:
        self.deadline = None
        if self.transport is not None and not self.transport.is_closing():
            log.info(
                "closing a connection from %s: no whole request header in %g s",
                self.client,
                self.guard.header_timeout,
            )
            self.transport.close()


class GuardedSite(web.BaseSite):
    """aiohttp's ``TCPSite`` (SO_REUSEPORT: the gateway's processes share the port), with each
    connection behind ``guard``."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard, **kwargs: Any
    ) -> None:
        super().__init__(runner, **kwargs)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self._guard.protocol(server()),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=True,
        )
