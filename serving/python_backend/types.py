"""What the server and a :class:`~serving.python_backend.handle.PythonModelHandle` exchange:
requests of protocol-typed numpy tensors, responses, and errors with Triton's codes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# Triton's error codes, by the names the KServe servers map to gRPC and HTTP statuses.
UNKNOWN = "UNKNOWN"
INTERNAL = "INTERNAL"
NOT_FOUND = "NOT_FOUND"
INVALID_ARG = "INVALID_ARG"
UNAVAILABLE = "UNAVAILABLE"
UNSUPPORTED = "UNSUPPORTED"
ALREADY_EXISTS = "ALREADY_EXISTS"
CANCELLED = "CANCELLED"
CODES = (
    UNKNOWN,
    INTERNAL,
    NOT_FOUND,
    INVALID_ARG,
    UNAVAILABLE,
    UNSUPPORTED,
    ALREADY_EXISTS,
    CANCELLED,
)  # in TRITONSERVER_Error_Code order: the index is the numeric code


class ModelError(Exception):
    """A request failed: ``code`` is one of :data:`CODES`, ``message`` what Triton would say."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"ModelError({self.code}, {self.message!r})"


class ModelLoadError(RuntimeError):
    """The model cannot be served: its ``model.py``, configuration or ``initialize`` failed."""


class TensorLike(Protocol):
    """Any tensor with a KServe datatype (``FP32``, ``BYTES``...) and a numpy array; BYTES as
    an object array of ``bytes``. The KServe servers' decoded tensors qualify as they are."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def data(self) -> np.ndarray: ...


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    data: np.ndarray


@dataclass(frozen=True)
class ModelRequest:
    inputs: Sequence[TensorLike]
    requested_output_names: Sequence[str] = ()
    request_id: str = ""
    correlation_id: int | str = 0
    parameters: Mapping[str, Any] = field(default_factory=dict)
    flags: int = 0


@dataclass(frozen=True)
class ModelResponse:
    """One response. ``final`` is set on the last one of its request (a decoupled model may
    send a last response with no outputs: only the flag). ``error`` is set when the model (or
    the runner on its behalf) answered this request with an error."""

    outputs: list[Tensor]
    parameters: dict[str, Any]
    final: bool
    error: ModelError | None = None

    def output(self, name: str) -> Tensor | None:
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        return None
