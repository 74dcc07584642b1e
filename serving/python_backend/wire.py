"""Messages between the server and a model's stub process: length-prefixed pickles over a
Unix socket pair.

The server unpickles what a model's process sends, and that process runs an author's code, so
the server side only accepts the few classes numpy arrays are rebuilt from
(:class:`SafeUnpickler`); anything else is refused rather than executed.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import socket
import struct
import threading
from typing import Any

_HEADER = struct.Struct("!Q")
_ALLOWED = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class WireError(RuntimeError):
    """The other side sent something that is not a message of this protocol."""


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "numpy.dtypes" and name.endswith("DType")):
            return super().find_class(module, name)
        raise WireError(f"refused to unpickle {module}.{name} from a model process")


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def decode_safe(body: bytes) -> Any:
    return SafeUnpickler(io.BytesIO(body)).load()


async def read_message(reader: asyncio.StreamReader) -> Any:
    """The next message, or ``None`` at end of stream."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None
    return decode_safe(body)


class BlockingChannel:
    """The stub's end: blocking reads from one thread, writes from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._file = sock.makefile("rb")
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        data = encode(message)
        with self._lock:
            self._sock.sendall(data)

    def receive(self) -> Any:
        header = self._file.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack(header)
        body = self._file.read(size)
        if len(body) < size:
            return None
        return pickle.loads(body)  # the server is trusted by the model's process
