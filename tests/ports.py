"""Free loopback ports for the tests' real servers."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(count: int) -> int:
    """A base port whose next ``count - 1`` ports are free too (the demo instance takes four)."""
    for _ in range(100):
        base = free_port()
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no block of free ports")
