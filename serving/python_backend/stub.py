"""The process one Python-backend model runs in, as Triton's ``triton_python_backend_stub``.

``python -m serving.python_backend.stub <fd>``: ``fd`` is this end of a socket pair whose other
end the server's :class:`~serving.python_backend.handle.PythonModelHandle` holds. A reader
thread takes every message off the socket (cancellations and replies to the model's own calls
are handled at once, so ``is_cancelled()``, BLS and metrics work while ``execute`` runs); the
main thread runs the life cycle: import ``model.py`` and ``auto_complete_config``,
``initialize``, one ``execute`` at a time, ``is_ready``, ``finalize``. ``async def execute``
runs on an event loop in its own thread; for a decoupled model it runs in the background, so
the next batch can start while it waits, as in Triton.

If the server goes away (end of stream) the process exits: a model never outlives its server.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import queue
import resource
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from serving.python_backend import pb_utils
from serving.python_backend.wire import BlockingChannel

AUTHOR_PATH = str(Path(__file__).resolve().parent / "author_path")


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` then the frames, as Triton's stub reports a Python error: for the errors
    only the model's author sees (loading, ``is_ready``, ``finalize``)."""
    head = exception_head(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{head}\n\nAt:\n{where}" if where else head


def exception_head(exc: BaseException) -> str:
    """``Type: message``: what a caller is told of an error in ``execute``. The frames name the
    serving machine's paths (the run directory, this module), so they go to the instance's log
    only (:func:`log_exception`)."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def log_exception(model: str, exc: BaseException) -> None:
    """The whole traceback on stderr, which the server passes on to the instance's log."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    print(f"model '{model}': execute failed:\n{text}", file=sys.stderr, end="", flush=True)


def _response_payload(response: pb_utils.InferenceResponse) -> tuple[Any, ...]:
    error = response.error()
    return (
        [(t.name(), t.as_numpy()) for t in response.output_tensors()],
        None if error is None else (int(error.code()), error.message()),
        response.parameters(),
    )


def _response_from_payload(payload: tuple[Any, ...]) -> pb_utils.InferenceResponse:
    outputs, error, parameters = payload
    response = pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, data) for name, data in outputs],
        error=None if error is None else pb_utils.TritonError(error[1], error[0]),
    )
    response._parameters = parameters
    return response


class Stub:
    def __init__(self, channel: BlockingChannel) -> None:
        self.channel = channel
        self.model_dir = ""
        self.tasks: queue.Queue[Any] = queue.Queue()
        self.cancelled: set[int] = set()
        self.replies: dict[int, queue.Queue[Any]] = {}
        self.replies_lock = threading.Lock()
        self.call_ids = itertools.count(1)
        self.model_class: Any = None
        self.model: Any = None
        self.name = ""
        self.version = -1
        self.decoupled = False
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- the runtime pb_utils talks to ---------------------------------------------------------

    def send(
        self, request_key: int, response: pb_utils.InferenceResponse | None, flags: int
    ) -> None:
        payload = None if response is None else _response_payload(response)
        self.channel.send(("send", request_key, payload, flags))
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.cancelled.discard(request_key)

    def is_cancelled(self, request_key: int) -> bool:
        return request_key in self.cancelled

    def _open_call(self) -> tuple[int, queue.Queue[Any]]:
        call_id = next(self.call_ids)
        replies: queue.Queue[Any] = queue.Queue()
        with self.replies_lock:
            self.replies[call_id] = replies
        return call_id, replies

    def _close_call(self, call_id: int) -> None:
        with self.replies_lock:
            self.replies.pop(call_id, None)

    def call(self, op: str, *args: Any) -> Any:
        call_id, replies = self._open_call()
        try:
            self.channel.send(("call", call_id, op, args))
            ok, value = replies.get()
        finally:
            self._close_call(call_id)
        if not ok:
            raise pb_utils.TritonModelException(value)
        return value

    def notify(self, op: str, *args: Any) -> None:
        self.channel.send(("notify", op, args))

    def bls(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> Iterator[pb_utils.InferenceResponse]:
        payload = {
            "model_name": request.model_name(),
            "model_version": request.model_version(),
            "inputs": [(t.name(), t.datatype(), t.as_numpy()) for t in request.inputs()],
            "requested_output_names": request.requested_output_names(),
            "request_id": request.request_id(),
            "correlation_id": request.correlation_id(),
            "flags": request.flags(),
            "timeout_us": request.timeout(),
            "parameters": json.loads(request.parameters()),
        }
        call_id, replies = self._open_call()
        self.channel.send(("bls", call_id, payload, decoupled))
        return self._bls_responses(call_id, replies)

    def _bls_responses(
        self, call_id: int, replies: queue.Queue[Any]
    ) -> Iterator[pb_utils.InferenceResponse]:
        finished = False
        try:
            while True:
                kind, value = replies.get()
                if kind == "response":
                    yield _response_from_payload(value)
                    continue
                finished = True
                return
        finally:
            self._close_call(call_id)
            if not finished:
                self.channel.send(("bls_cancel", call_id))

    # --- the reader thread ---------------------------------------------------------------------

    def read_forever(self) -> None:
        while True:
            message = self.channel.receive()
            if message is None:
                os._exit(0)  # the server is gone
            kind = message[0]
            if kind == "cancel":
                self.cancelled.add(message[1])
            elif kind in ("reply", "bls_response", "bls_end"):
                with self.replies_lock:
                    replies = self.replies.get(message[1])
                if replies is None:
                    continue
                if kind == "reply":
                    replies.put((message[2], message[3]))
                elif kind == "bls_response":
                    replies.put(("response", message[2]))
                else:
                    replies.put(("end", None))
            else:
                self.tasks.put(message)

    # --- the life cycle ------------------------------------------------------------------------

    def run(self) -> None:
        threading.Thread(target=self.read_forever, name="stub-reader", daemon=True).start()
        while True:
            message = self.tasks.get()
            kind = message[0]
            if kind == "load":
                self.load(message[1])
            elif kind == "initialize":
                self.initialize(message[1])
            elif kind == "execute":
                self.execute(message[1], message[2])
            elif kind == "is_ready":
                self.check_ready(message[1])
            elif kind == "finalize":
                self.finalize()
                return

    def load(self, info: dict[str, Any]) -> None:
        """Import ``model.py`` as Triton does (``<version>.model`` with the version directory
        and the model directory on ``sys.path``) and run ``auto_complete_config``."""
        self.model_dir = info["version_dir"]
        self.name = info["name"]
        self.version = int(info["version"])
        version_dir = Path(info["version_dir"])
        sys.path.insert(0, AUTHOR_PATH)
        sys.path.append(str(version_dir))
        sys.path.append(str(version_dir.parent))
        module_name = f"{version_dir.name}.{Path(info['filename']).stem}"
        try:
            module = importlib.import_module(module_name)
        except BaseException as exc:  # SystemExit in a module is the author's too
            self.channel.send(
                (
                    "load_error",
                    f"Failed to import {version_dir / info['filename']}: {describe_exception(exc)}",
                )
            )
            return
        model_class = getattr(module, "TritonPythonModel", None)
        if not isinstance(model_class, type):
            self.channel.send(
                (
                    "load_error",
                    f"{version_dir / info['filename']} does not define the class "
                    "TritonPythonModel that every Python-backend model must have",
                )
            )
            return
        if not hasattr(model_class, "execute"):
            self.channel.send(
                (
                    "load_error",
                    f"Python model {version_dir / info['filename']} does not implement "
                    "`execute` method.",
                )
            )
            return
        self.model_class = model_class
        completed = None
        if info["auto_complete"] and hasattr(model_class, "auto_complete_config"):
            try:
                result = model_class.auto_complete_config(pb_utils.ModelConfig(info["config"]))
                if not isinstance(result, pb_utils.ModelConfig):
                    raise pb_utils.TritonModelException(
                        f"auto_complete_config function in model '{self.name}' must return a "
                        "valid pb.ModelConfig object."
                    )
                completed = json.dumps(result.as_dict())
            except BaseException as exc:
                self.channel.send(
                    ("load_error", f"auto_complete_config failed: {describe_exception(exc)}")
                )
                return
        self.channel.send(("auto_completed", completed))

    def initialize(self, args: dict[str, str]) -> None:
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            json.loads(args["model_config"])
        )
        try:
            self.model = self.model_class()
            if hasattr(self.model, "initialize"):
                self.model.initialize(args)
        except BaseException as exc:
            self.channel.send(
                ("load_error", f"Failed to initialize Python stub: {describe_exception(exc)}")
            )
            return
        self.channel.send(("initialized", hasattr(self.model, "is_ready")))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="stub-asyncio", daemon=True).start()
            self.loop = loop
        return self.loop

    def _requests(self, payloads: list[dict[str, Any]]) -> list[pb_utils.InferenceRequest]:
        return [
            pb_utils.InferenceRequest._incoming(
                p["key"],
                model_name=self.name,
                model_version=self.version,
                inputs=[pb_utils.Tensor(name, data) for name, data in p["inputs"]],
                requested_output_names=p["requested_output_names"],
                request_id=p["request_id"],
                correlation_id=p["correlation_id"],
                flags=p["flags"],
                parameters_json=p["parameters"],
                decoupled=self.decoupled,
            )
            for p in payloads
        ]

    def _fail_open(
        self, batch_id: int, requests: list[pb_utils.InferenceRequest], error: str
    ) -> None:
        open_keys = [r._key for r in requests if not r.get_response_sender()._is_closed()]
        for request in requests:
            request.get_response_sender()._close()
        message = f"Failed to process the request(s) for model '{self.name}', message: {error}"
        self.channel.send(("batch_error", batch_id, message, open_keys))
        for request in requests:
            self.cancelled.discard(request._key)

    def execute(self, batch_id: int, payloads: list[dict[str, Any]]) -> None:
        requests = self._requests(payloads)
        try:
            result = self.model.execute(requests)
            if asyncio.iscoroutine(result):
                future = asyncio.run_coroutine_threadsafe(result, self._event_loop())
                if self.decoupled:

                    def done(f: Any, requests: list[Any] = requests) -> None:
                        exc = f.exception()
                        if exc is not None:
                            self._failed(batch_id, requests, exc)

                    future.add_done_callback(done)
                    self.channel.send(("executed", batch_id))
                    return
                result = future.result()
            self._returned(batch_id, requests, result)
        except BaseException as exc:  # any error of the author's is reported
            self._failed(batch_id, requests, exc)

    def _failed(
        self, batch_id: int, requests: list[pb_utils.InferenceRequest], exc: BaseException
    ) -> None:
        log_exception(self.name, exc)
        self._fail_open(batch_id, requests, exception_head(exc))

    def _returned(
        self, batch_id: int, requests: list[pb_utils.InferenceRequest], result: Any
    ) -> None:
        if result is None:
            self.channel.send(("executed", batch_id))
            return
        if self.decoupled:
            raise pb_utils.TritonModelException(
                f"Python model '{self.name}' is using the decoupled mode and the execute "
                "function must return None."
            )
        if not isinstance(result, list):
            raise pb_utils.TritonModelException(
                f"Expected a list in the execute return, found type '{type(result)}'."
            )
        if len(result) != len(requests):
            raise pb_utils.TritonModelException(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, and "
                f"InferenceResponse(s) size is:{len(result)}\n"
            )
        payloads: list[Any] = []
        for request, response in zip(requests, result, strict=True):
            if response is None:
                payloads.append(None)
                continue
            if not isinstance(response, pb_utils.InferenceResponse):
                raise pb_utils.TritonModelException(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
                )
            if request.get_response_sender()._is_closed():
                raise pb_utils.TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            payloads.append(_response_payload(response))
        for request in requests:
            request.get_response_sender()._close()
        self.channel.send(("responses", batch_id, [r._key for r in requests], payloads))
        for request in requests:
            self.cancelled.discard(request._key)

    def check_ready(self, call_id: int) -> None:
        try:
            result = self.model.is_ready()
            if asyncio.iscoroutine(result):
                result = asyncio.run_coroutine_threadsafe(result, self._event_loop()).result()
            if not isinstance(result, bool | np.bool_):
                raise pb_utils.TritonModelException("is_ready() must return a boolean value")
            self.channel.send(("ready_result", call_id, bool(result), ""))
        except BaseException as exc:
            self.channel.send(("ready_result", call_id, False, describe_exception(exc)))

    def finalize(self) -> None:
        error = None
        try:
            if self.model is not None and hasattr(self.model, "finalize"):
                self.model.finalize()
        except BaseException as exc:
            error = describe_exception(exc)
        self.channel.send(("finalized", error))


def main() -> None:
    fd = int(sys.argv[1])
    limit = os.environ.get("PYTHON_BACKEND_MEMORY_LIMIT")
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))
    stub = Stub(BlockingChannel(socket.socket(fileno=fd)))
    pb_utils._runtime = stub
    stub.run()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
