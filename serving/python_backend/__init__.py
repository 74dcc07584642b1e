"""A CPU runner for Triton Python-backend models: an author's ``model.py`` and
``config.pbtxt`` run here unchanged, each model in a process of its own, driven from the
server's event loop through :class:`PythonModelHandle`. See ``docs/python_backend.md``."""

from serving.python_backend.handle import BlsCallback, ExecutionStats, PythonModelHandle, State
from serving.python_backend.types import (
    ModelError,
    ModelLoadError,
    ModelRequest,
    ModelResponse,
    Tensor,
)

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
