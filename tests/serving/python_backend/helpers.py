"""Shared pieces of the Python-backend runner tests: where the models are, a request builder,
and a router of handles standing in for the server's BLS routing (real handles, real
processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from serving.python_backend import (
    ModelError,
    ModelRequest,
    ModelResponse,
    PythonModelHandle,
    Tensor,
)

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
PEERS = HERE / "peer_models"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def request(
    *tensors: tuple[str, str, Any], outputs: tuple[str, ...] = (), **kw: Any
) -> ModelRequest:
    return ModelRequest(
        [Tensor(name, datatype, np.asarray(data)) for name, datatype, data in tensors],
        requested_output_names=outputs,
        **kw,
    )


class Router:
    """Routes BLS calls by model name to the handles it holds, as the server will."""

    def __init__(self) -> None:
        self.handles: dict[str, PythonModelHandle] = {}

    def handle(self, path: Path, **kw: Any) -> PythonModelHandle:
        handle = PythonModelHandle(path, bls=self.route, model_ready=self.ready, **kw)
        self.handles[handle.name] = handle
        return handle

    def ready(self, name: str, version: str) -> bool:
        handle = self.handles.get(name)
        return handle is not None and handle.is_ready()

    async def route(
        self, name: str, version: str, req: ModelRequest, decoupled: bool
    ) -> AsyncIterator[ModelResponse]:
        handle = self.handles.get(name)
        if handle is None:
            raise ModelError("NOT_FOUND", f"Request for unknown model: '{name}' is not found")
        async for response in handle.stream(req):
            yield response

    async def close(self) -> None:
        for handle in self.handles.values():
            await handle.close()
