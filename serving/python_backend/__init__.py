"""A CPU runner for Triton Python-backend models: an author's ``model.py`` and
``config.pbtxt`` run here unchanged, each model instance in a process of its own, driven from
the server's event loop through :class:`PythonModelHandle`. See ``docs/python_backend.md``.

The names below are imported on first use: the model's own process imports this package too
(for :mod:`serving.python_backend.stub` and :mod:`~serving.python_backend.pb_utils`) and needs
none of the server's side (protobuf, gRPC, asyncio subprocesses).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.python_backend.handle import (
        BlsCallback,
        ExecutionStats,
        PythonModelHandle,
        State,
    )
    from serving.python_backend.types import (
        ModelError,
        ModelLoadError,
        ModelRequest,
        ModelResponse,
        Tensor,
    )

_WHERE = {
    "BlsCallback": "handle",
    "ExecutionStats": "handle",
    "PythonModelHandle": "handle",
    "State": "handle",
    "ModelError": "types",
    "ModelLoadError": "types",
    "ModelRequest": "types",
    "ModelResponse": "types",
    "Tensor": "types",
}

__all__ = [
    "BlsCallback",
    "ExecutionStats",
    "ModelError",
    "ModelLoadError",
    "ModelRequest",
    "ModelResponse",
    "PythonModelHandle",
    "State",
    "Tensor",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
