"""The server's side of one Python-backend model: :class:`PythonModelHandle`.

The model's ``model.py`` runs in processes of its own (:mod:`serving.python_backend.stub`), one
per model instance as under Triton's stub, so whatever the author's code does (crash, hang,
exhaust memory) ends those processes only: the handle reports it, fails the requests they had,
and can :meth:`restart` the model.

What the handle does on the server's event loop:

* **load**: read ``config.pbtxt``, start the process, import ``model.py`` and run
  ``auto_complete_config``, check and normalize the completed configuration, ``initialize``.
  Any failure is a :class:`ModelLoadError` whose message says where and why; nothing serves.
* **requests**: checked as Triton core checks them (:mod:`validation`), queued, and handed to
  ``execute`` one batch at a time per instance. With ``max_batch_size > 0`` and ``dynamic_batching``, the
  requests waiting (up to ``max_queue_delay_microseconds`` for more) go to one ``execute`` call
  as a list, each request keeping its own tensors: Triton's Python backend does not concatenate
  them either. Otherwise each ``execute`` gets one request.
* **responses** stream back as the model sends them (decoupled mode, or the response sender in
  default mode); a request's last one has ``final`` set. Closing a stream early cancels its
  request: ``request.is_cancelled()`` turns true in the model, or it never reaches ``execute``.
* **BLS**: ``InferenceRequest(...).exec()`` in the model calls the ``bls`` callback the server
  gave, which routes to any model the server serves.
* **custom metrics** live here (:mod:`metrics`); :meth:`metrics_text` is their exposition.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from serving.python_backend import config as model_config
from serving.python_backend.metrics import CustomMetrics, MetricError
from serving.python_backend.types import (
    CANCELLED,
    CODES,
    INTERNAL,
    UNAVAILABLE,
    UNSUPPORTED,
    ModelError,
    ModelLoadError,
    ModelRequest,
    ModelResponse,
    Tensor,
)
from serving.python_backend.validation import CheckedRequest, check_request
from serving.python_backend.wire import encode, read_message

logger = logging.getLogger(__name__)

# The callback BLS calls go through: (model name, version or "", request, decoupled) -> the
# callee's responses. Raise ModelError for a model that is not served or refuses the request.
BlsCallback = Callable[[str, str, ModelRequest, bool], AsyncIterator[ModelResponse]]
ModelReadyCallback = Callable[[str, str], bool]

PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
READY_CHECK_TIMEOUT_S = 5.0  # Triton's limit on a model's is_ready()
_LOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)


@dataclass
class ExecutionStats:
    """What Triton's per-model ``nv_inference_exec_count``/``nv_inference_count`` and compute
    duration report: execute calls, the requests (batch-size units) they carried, and the
    time spent in them."""

    execution_count: int = 0
    inference_count: int = 0
    compute_ns: int = 0


class State:
    UNLOADED = "UNLOADED"
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"


@dataclass(eq=False)
class _Pending:
    key: int
    checked: CheckedRequest
    request: ModelRequest
    responses: asyncio.Queue[ModelResponse] = field(default_factory=asyncio.Queue)
    done: bool = False
    cancelled: bool = False

    def payload(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "inputs": self.checked.inputs,
            "requested_output_names": self.checked.requested_output_names,
            "request_id": self.request.request_id,
            "correlation_id": self.request.correlation_id,
            "flags": self.request.flags,
            "parameters": json.dumps(dict(self.request.parameters)),
        }


def _datatype(array: Any) -> str:
    from serving.python_backend.pb_utils import _NUMPY_TO_PROTOCOL

    return _NUMPY_TO_PROTOCOL[array.dtype]


def _response(payload: Any, final: bool, wanted: frozenset[str] | None) -> ModelResponse:
    outputs, error, parameters = payload
    if error is not None:
        code = CODES[error[0]] if 0 <= error[0] < len(CODES) else INTERNAL
        return ModelResponse([], json.loads(parameters), final, ModelError(code, error[1]))
    return ModelResponse(
        [Tensor(n, _datatype(d), d) for n, d in outputs if wanted is None or n in wanted],
        json.loads(parameters),
        final,
    )


def _payload(response: ModelResponse) -> tuple[Any, ...]:
    error = None
    if response.error is not None:
        code = CODES.index(response.error.code) if response.error.code in CODES else 1
        error = (code, response.error.message)
    return (
        [(t.name, t.data) for t in response.outputs],
        error,
        json.dumps(response.parameters),
    )


@dataclass(eq=False)
class _Instance:
    """One process of the model (Triton: one stub per model instance)."""

    name: str  # Triton's instance name: <instance group>_<index in the group>
    process: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    control: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    kill_reason: str | None = None
    busy: bool = False
    has_is_ready: bool = False
    ready_check: asyncio.Future[bool] | None = None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def write(self, message: Any) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(encode(message))

    async def send(self, message: Any) -> None:
        if self.writer is None:
            raise ModelError(UNAVAILABLE, f"model instance '{self.name}' has no process")
        self.writer.write(encode(message))
        await self.writer.drain()

    def kill(self, reason: str | None = None) -> None:
        if reason is not None and self.kill_reason is None:
            self.kill_reason = reason
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def expect(self, kind: str) -> Any:
        message = await self.control.get()
        if message[0] == kind:
            return message[1]
        raise ModelLoadError(str(message[1]))


class PythonModelHandle:
    """One Python-backend model of a repository, served from processes of its own: one per
    model instance its ``instance_group`` asks for, as Triton's Python backend does.

    ``model_dir`` is ``<repository>/<model name>``; ``version`` picks a version directory
    (default: the one the repository serves, :func:`serving.repository.served_version`).
    ``bls`` routes the model's BLS calls; ``model_ready`` answers its
    ``pb_utils.is_model_ready``. ``execute_timeout_s`` bounds one ``execute`` call (Triton has
    no such limit; a hung model otherwise holds its requests forever): past it the processes
    are killed and the handle reports FAILED. ``memory_limit_bytes`` caps each process's
    address space (``RLIMIT_AS``): a model that exceeds it gets ``MemoryError`` in its code.
    """

    def __init__(
        self,
        model_dir: Path | str,
        *,
        version: str | None = None,
        bls: BlsCallback | None = None,
        model_ready: ModelReadyCallback | None = None,
        execute_timeout_s: float | None = None,
        load_timeout_s: float = 120.0,
        memory_limit_bytes: int | None = None,
        auto_complete: bool = True,
        python: str = sys.executable,
    ) -> None:
        self.model_dir = Path(model_dir).resolve()
        self._version_wanted = version
        self._bls = bls
        self._model_ready = model_ready
        self.execute_timeout_s = execute_timeout_s
        self.load_timeout_s = load_timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self.auto_complete = auto_complete
        self.python = python
        self.name = self.model_dir.name
        self.version = ""
        self.config = mc.ModelConfig()
        self.state = State.UNLOADED
        self.failure: str | None = None
        self.metrics = CustomMetrics()
        self.stats = ExecutionStats()
        # The configuration's tensors (for metadata); filled at load.
        self.inputs: dict[str, model_config.TensorSpec] = {}
        self.outputs: dict[str, model_config.TensorSpec] = {}
        self.log = logging.getLogger(f"serving.python_backend.model.{self.name}")
        self._instances: list[_Instance] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._queue: deque[_Pending] = deque()
        self._arrived = asyncio.Event()
        self._freed = asyncio.Event()
        self._in_flight: dict[int, _Pending] = {}
        self._where: dict[int, _Instance] = {}  # request key -> the instance executing it
        self._batches: dict[int, asyncio.Future[None]] = {}
        self._ready_checks: dict[int, asyncio.Future[bool]] = {}
        self._bls_calls: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._ids = itertools.count(1)

    # --- what the server reads -----------------------------------------------------------------

    @property
    def decoupled(self) -> bool:
        return model_config.is_decoupled(self.config)

    @property
    def instance_names(self) -> list[str]:
        return [instance.name for instance in self._instances]

    def config_dict(self) -> dict[str, Any]:
        """The configuration as Triton's JSON (what ``initialize`` got)."""
        return model_config.to_dict(self.config)

    def is_ready(self) -> bool:
        """Loaded and every process alive (Triton's readiness when ``is_ready`` is not
        defined)."""
        return (
            self.state == State.READY
            and bool(self._instances)
            and all(i.alive() for i in self._instances)
        )

    async def model_ready(self) -> bool:
        """:meth:`is_ready`, then the model's own ``is_ready()`` in every instance if it has
        one (at most one call in flight per instance, a 5 s limit, as in Triton)."""
        if not self.is_ready():
            return False
        results = await asyncio.gather(*(self._instance_ready(i) for i in self._instances))
        return all(results)

    async def _instance_ready(self, instance: _Instance) -> bool:
        if not instance.has_is_ready:
            return True
        if instance.ready_check is None or instance.ready_check.done():
            call_id = next(self._ids)
            future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._ready_checks[call_id] = future
            instance.ready_check = future
            await instance.send(("is_ready", call_id))
        try:
            return await asyncio.wait_for(
                asyncio.shield(instance.ready_check), READY_CHECK_TIMEOUT_S
            )
        except TimeoutError:
            return False

    def metrics_text(self) -> str:
        """The model's custom metric families in Prometheus text format."""
        return self.metrics.render()

    # --- life cycle ----------------------------------------------------------------------------

    async def load(self) -> None:
        """Start the processes and load the model; :class:`ModelLoadError` says why not."""
        if self.state in (State.LOADING, State.READY):
            raise ModelLoadError(f"model '{self.name}' is already {self.state.lower()}")
        await self._stop(0)  # what is left of failed processes
        self.state = State.LOADING
        self.failure = None
        try:
            await asyncio.wait_for(self._load(), self.load_timeout_s)
        except TimeoutError:
            await self._stop(0)
            self._failed(
                f"loading model '{self.name}' did not finish within {self.load_timeout_s:g} s"
            )
            raise ModelLoadError(self.failure or "") from None
        except model_config.ConfigError as exc:
            await self._stop(0)
            self._failed(str(exc))
            raise ModelLoadError(self.failure or "") from None
        except (ModelLoadError, OSError) as exc:
            await self._stop(0)  # nothing of it is worth waiting for
            self._failed(f"model '{self.name}': {exc}")
            raise ModelLoadError(self.failure or "") from None
        self.state = State.READY
        self._spawn(self._schedule(), "scheduler")

    async def _load(self) -> None:
        config = model_config.read_config(self.model_dir)
        version_dir = model_config.find_version(self.model_dir, config, self._version_wanted)
        self.version = version_dir.name
        named = mc.ModelConfig()
        named.CopyFrom(config)
        model_config.normalize(named)
        first = await self._start_instance(f"{named.instance_group[0].name}_0")
        info = {
            "name": self.name,
            "version": self.version,
            "version_dir": str(version_dir),
            "filename": config.default_model_filename or "model.py",
            "config": model_config.to_json(config),
            "auto_complete": self.auto_complete,
        }
        await first.send(("load", info))
        completed = await first.expect("auto_completed")
        if completed is not None:
            origin = f"auto_complete_config of model '{self.name}'"
            config = model_config.from_json(completed, origin)
            if config.name != self.name:
                raise ModelLoadError(f"{origin} changed the model's name to '{config.name}'")
        model_config.normalize(config)
        model_config.validate(config)
        self.config = config
        self.inputs = model_config.input_specs(config)
        self.outputs = model_config.output_specs(config)
        names = [f"{g.name}_{i}" for g in config.instance_group for i in range(g.count)]
        first.name = names[0]
        others = [await self._start_instance(name) for name in names[1:]]
        for instance in others:
            await instance.send(("load", {**info, "auto_complete": False}))
        await asyncio.gather(*(instance.expect("auto_completed") for instance in others))
        args = {
            "model_config": model_config.to_json(config),
            "model_instance_kind": "CPU",
            "model_instance_device_id": "0",
            "model_repository": str(self.model_dir),
            "model_version": self.version,
            "model_name": self.name,
        }
        for instance in self._instances:
            await instance.send(("initialize", args))
        ready = await asyncio.gather(*(i.expect("initialized") for i in self._instances))
        for instance, has_is_ready in zip(self._instances, ready, strict=True):
            instance.has_is_ready = bool(has_is_ready)

    async def close(self, timeout_s: float = 10.0) -> None:
        """``finalize()`` the model in every process and end them; pending requests fail
        UNAVAILABLE."""
        if self.is_ready():
            self.state = State.UNLOADED
            self._fail_all(UNAVAILABLE, f"model '{self.name}' is being unloaded")
            await asyncio.gather(*(self._finalize(i, timeout_s) for i in self._instances))
        await self._stop(timeout_s)
        self.state = State.UNLOADED

    async def _finalize(self, instance: _Instance, timeout_s: float) -> None:
        with contextlib.suppress(Exception):
            await instance.send(("finalize",))
            with contextlib.suppress(TimeoutError):
                message = await asyncio.wait_for(instance.control.get(), timeout_s)
                if message[0] == "finalized" and message[1]:
                    self.log.error("finalize of model '%s' failed: %s", self.name, message[1])

    async def restart(self) -> None:
        """Fresh processes for the model (after a crash, a hang or on demand)."""
        await self.close()
        await self.load()

    def _spawn(self, coro: Any, what: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"{self.name}-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start_instance(self, name: str) -> _Instance:
        instance = _Instance(name)
        self._instances.append(instance)
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        if self.memory_limit_bytes:
            env["PYTHON_BACKEND_MEMORY_LIMIT"] = str(self.memory_limit_bytes)
        try:
            instance.process = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "serving.python_backend.stub",
                str(child.fileno()),
                pass_fds=(child.fileno(),),
                env=env,
                start_new_session=True,  # the model's own children go with it on a kill
            )
        finally:
            child.close()
        reader, instance.writer = await asyncio.open_unix_connection(sock=parent)
        self._spawn(self._read(instance, reader), f"reader-{name}")
        return instance

    async def _stop(self, timeout_s: float = 10.0) -> None:
        """End every process (waiting up to ``timeout_s`` for those finalizing) and every
        task of the handle."""
        for instance in self._instances:
            process = instance.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), timeout_s)
                instance.kill()
                await process.wait()
            if instance.writer is not None:
                instance.writer.close()
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._instances = []
        self._bls_calls.clear()
        self.metrics.clear()

    def _kill_all(self, reason: str) -> None:
        for instance in self._instances:
            instance.kill(reason)

    def _failed(self, reason: str) -> None:
        self.state = State.FAILED
        self.failure = reason
        self.log.error("%s", reason)

    # --- requests ------------------------------------------------------------------------------

    def _submit(self, request: ModelRequest) -> _Pending:
        if not self.is_ready():
            reason = f": {self.failure}" if self.failure else ""
            raise ModelError(UNAVAILABLE, f"model '{self.name}' is not ready{reason}")
        checked = check_request(
            self.name, self.config.max_batch_size, self.inputs, self.outputs, request
        )
        pending = _Pending(next(self._ids), checked, request)
        self._queue.append(pending)
        self._arrived.set()
        return pending

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelResponse, None]:
        """Every response of one request, the last with ``final`` set. Raises
        :class:`ModelError` for a request refused before it is queued; errors of the model
        arrive as responses with ``error`` set. Leaving early cancels the request."""
        pending = self._submit(request)
        try:
            while True:
                response = await pending.responses.get()
                yield response
                if response.final:
                    return
        finally:
            if not pending.done:
                self._cancel(pending)

    async def infer(self, request: ModelRequest) -> ModelResponse:
        """The one response of a default-mode model; its error is raised as
        :class:`ModelError`."""
        if self.decoupled:
            raise ModelError(
                UNSUPPORTED,
                f"model '{self.name}' uses the decoupled transaction policy: use a stream",
            )
        result: ModelResponse | None = None
        async with contextlib.aclosing(self.stream(request)) as responses:
            async for response in responses:
                if response.error is not None:
                    raise response.error
                if response.outputs or result is None:
                    result = response
        assert result is not None
        return ModelResponse(result.outputs, result.parameters, True)

    def _cancel(self, pending: _Pending) -> None:
        pending.cancelled = True
        if pending in self._queue:
            self._queue.remove(pending)
            pending.done = True
            return
        instance = self._where.get(pending.key)
        if instance is not None:
            instance.write(("cancel", pending.key))

    def _deliver(self, pending: _Pending, response: ModelResponse) -> None:
        if response.final:
            pending.done = True
            self._in_flight.pop(pending.key, None)
            self._where.pop(pending.key, None)
        if not pending.cancelled:
            pending.responses.put_nowait(response)

    def _fail_all(self, code: str, message: str) -> None:
        error = ModelError(code, message)
        for pending in list(self._in_flight.values()) + list(self._queue):
            self._deliver(pending, ModelResponse([], {}, True, error))
        self._in_flight.clear()
        self._where.clear()
        self._queue.clear()
        for future in self._batches.values():
            if not future.done():
                future.set_result(None)
        self._batches.clear()
        for check in self._ready_checks.values():
            if not check.done():
                check.set_result(False)
        self._ready_checks.clear()

    # --- scheduling ----------------------------------------------------------------------------

    def _batching(self) -> tuple[int, float, int]:
        """(max batch size, queue delay in s, preferred size) when dynamic batching is on."""
        if self.config.max_batch_size > 0 and self.config.HasField("dynamic_batching"):
            batching = self.config.dynamic_batching
            preferred = max(batching.preferred_batch_size, default=self.config.max_batch_size)
            return (
                self.config.max_batch_size,
                batching.max_queue_delay_microseconds / 1e6,
                preferred,
            )
        return (0, 0.0, 0)

    async def _next_batch(self) -> list[_Pending]:
        while not self._queue:
            self._arrived.clear()
            await self._arrived.wait()
        batch = [self._queue.popleft()]
        limit, delay, preferred = self._batching()
        if limit == 0:
            return batch
        size = batch[0].checked.batch_size
        deadline = time.monotonic() + delay
        while size < min(limit, preferred):
            while self._queue and size + self._queue[0].checked.batch_size <= limit:
                pending = self._queue.popleft()
                batch.append(pending)
                size += pending.checked.batch_size
            if size >= min(limit, preferred) or (
                self._queue and size + self._queue[0].checked.batch_size > limit
            ):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        return batch

    async def _free_instance(self) -> _Instance:
        while True:
            for instance in self._instances:
                if not instance.busy:
                    return instance
            self._freed.clear()
            await self._freed.wait()

    async def _schedule(self) -> None:
        """Hand batches to free instances, one batch per instance at a time."""
        while self.is_ready():
            instance = await self._free_instance()
            batch = await self._next_batch()
            if not self.is_ready():
                for pending in batch:
                    error = ModelError(UNAVAILABLE, f"model '{self.name}' is not ready")
                    self._deliver(pending, ModelResponse([], {}, True, error))
                return
            instance.busy = True
            self._spawn(self._execute(instance, batch), f"execute-{instance.name}")

    async def _execute(self, instance: _Instance, batch: list[_Pending]) -> None:
        if not self.is_ready():  # an instance died since the batch was formed
            for pending in batch:
                error = ModelError(INTERNAL, self.failure or f"model '{self.name}' is not ready")
                self._deliver(pending, ModelResponse([], {}, True, error))
            instance.busy = False
            return
        batch_id = next(self._ids)
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._batches[batch_id] = finished
        for pending in batch:
            self._in_flight[pending.key] = pending
            self._where[pending.key] = instance
        started = time.perf_counter_ns()
        self.stats.execution_count += 1
        self.stats.inference_count += sum(p.checked.batch_size for p in batch)
        try:
            await instance.send(("execute", batch_id, [p.payload() for p in batch]))
            await asyncio.wait_for(asyncio.shield(finished), self.execute_timeout_s)
            self.stats.compute_ns += time.perf_counter_ns() - started
        except TimeoutError:
            instance.kill(
                f"execute of model '{self.name}' did not return within "
                f"{self.execute_timeout_s:g} s; its process was stopped"
            )
            await finished
        except (ModelError, ConnectionError, OSError):
            await finished  # the process is gone; its end fails the batch
        finally:
            self._batches.pop(batch_id, None)
            instance.busy = False
            self._freed.set()

    # --- what the processes send ---------------------------------------------------------------

    async def _read(self, instance: _Instance, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                message = await read_message(reader)
                if message is None:
                    break
                self._dispatch(instance, message)
        except (ConnectionError, OSError):
            pass
        except Exception as exc:  # a garbled stream ends the process
            instance.kill(f"model instance '{instance.name}' sent an invalid message: {exc}")
        await self._exited(instance)

    async def _exited(self, instance: _Instance) -> None:
        process = instance.process
        if process is not None:
            if process.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 5.0)
            if process.returncode is None:
                instance.kill()
                await process.wait()
        code = process.returncode if process is not None else None
        how = (
            f"killed by signal {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        reason = instance.kill_reason or (
            f"Stub process '{instance.name}' is not healthy: the process of model "
            f"'{self.name}' {how}"
        )
        instance.control.put_nowait(("died", reason))  # for a load or a close waiting on it
        if self.state == State.LOADING:
            return
        if self.state == State.READY:
            # Like Triton, the model is not ready once one of its instances is unhealthy; the
            # other processes are stopped too, so a restart starts from a clean slate.
            self._failed(reason)
            self._kill_all(reason)
        self._fail_all(INTERNAL, reason)

    def _dispatch(self, instance: _Instance, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "send":
            _, key, payload, flags = message
            pending = self._in_flight.get(key)
            if pending is None:
                return
            final = bool(flags & 1)
            if payload is None:
                response = ModelResponse([], {}, final)
            else:
                response = _response(payload, final, pending.checked.wanted_outputs)
            self._deliver(pending, response)
        elif kind == "responses":
            _, batch_id, keys, payloads = message
            for key, payload in zip(keys, payloads, strict=True):
                pending = self._in_flight.get(key)
                if pending is None:
                    continue
                if payload is None:
                    error = ModelError(INTERNAL, "request rescheduling is not supported")
                    self._deliver(pending, ModelResponse([], {}, True, error))
                else:
                    self._deliver(pending, _response(payload, True, pending.checked.wanted_outputs))
            self._batch_done(batch_id)
        elif kind == "executed":
            self._batch_done(message[1])
        elif kind == "batch_error":
            _, batch_id, text, open_keys = message
            for key in open_keys:
                pending = self._in_flight.get(key)
                if pending is not None:
                    self._deliver(pending, ModelResponse([], {}, True, ModelError(INTERNAL, text)))
            self._batch_done(batch_id)
        elif kind == "call":
            _, call_id, op, args = message
            self._answer_call(instance, call_id, op, args)
        elif kind == "notify":
            self._notified(message[1], message[2])
        elif kind == "bls":
            _, call_id, payload, decoupled = message
            self._bls_calls[(id(instance), call_id)] = self._spawn(
                self._run_bls(instance, call_id, payload, decoupled), "bls"
            )
        elif kind == "bls_cancel":
            cancelled = self._bls_calls.pop((id(instance), message[1]), None)
            if cancelled is not None:
                cancelled.cancel()
        elif kind == "ready_result":
            _, call_id, ready, error = message
            if error:
                self.log.error("is_ready() of model '%s' failed: %s", self.name, error)
            check = self._ready_checks.pop(call_id, None)
            if check is not None and not check.done():
                check.set_result(bool(ready))
        else:  # load-phase answers: auto_completed, initialized, load_error, finalized
            instance.control.put_nowait(message)

    def _batch_done(self, batch_id: int) -> None:
        finished = self._batches.get(batch_id)
        if finished is not None and not finished.done():
            finished.set_result(None)

    def _answer_call(
        self, instance: _Instance, call_id: int, op: str, args: tuple[Any, ...]
    ) -> None:
        metrics = self.metrics
        operations: dict[str, Callable[..., Any]] = {
            "family_create": metrics.create_family,
            "metric_create": metrics.create_metric,
            "metric_increment": metrics.increment,
            "metric_set": metrics.set,
            "metric_observe": metrics.observe,
            "metric_value": metrics.value,
            "is_model_ready": self._is_model_ready,
        }
        operation = operations.get(op)
        try:
            if operation is None:
                raise MetricError(f"unknown operation '{op}'")
            instance.write(("reply", call_id, True, operation(*args)))
        except (MetricError, TypeError, ValueError) as exc:
            instance.write(("reply", call_id, False, str(exc)))

    def _is_model_ready(self, name: str, version: str) -> bool:
        if name == self.name and version in ("", self.version):
            return self.is_ready()
        return bool(self._model_ready and self._model_ready(name, version))

    def _notified(self, op: str, args: tuple[Any, ...]) -> None:
        if op == "log":
            level, text, where = args
            self.log.log(
                _LOG_LEVELS[level] if 0 <= level < 4 else logging.INFO, "%s] %s", where, text
            )
        elif op == "metric_delete":
            self.metrics.delete_metric(args[0])
        elif op == "family_delete":
            self.metrics.delete_family(args[0])

    async def _run_bls(
        self, instance: _Instance, call_id: int, payload: dict[str, Any], decoupled: bool
    ) -> None:
        """One BLS call of the model, answered response by response, then an end marker."""
        request = ModelRequest(
            inputs=[Tensor(n, dt, d) for n, dt, d in payload["inputs"]],
            requested_output_names=payload["requested_output_names"],
            request_id=payload["request_id"],
            correlation_id=payload["correlation_id"],
            parameters=payload["parameters"],
            flags=payload["flags"],
        )
        version = str(payload["model_version"]) if payload["model_version"] >= 0 else ""
        timeout = payload["timeout_us"] / 1e6 if payload["timeout_us"] else None
        sent = 0

        def answer(response: ModelResponse) -> None:
            nonlocal sent
            instance.write(("bls_response", call_id, _payload(response)))
            sent += 1

        try:
            if self._bls is None:
                raise ModelError(UNSUPPORTED, "BLS is not available: no router was given")
            async with asyncio.timeout(timeout):
                async for response in self._bls(payload["model_name"], version, request, decoupled):
                    if decoupled or not sent:
                        answer(response)
        except ModelError as exc:
            answer(ModelResponse([], {}, True, exc))
        except TimeoutError:
            error = ModelError(CANCELLED, f"BLS request to '{payload['model_name']}' timed out")
            answer(ModelResponse([], {}, True, error))
        finally:
            self._bls_calls.pop((id(instance), call_id), None)
        if not decoupled and not sent:
            error = ModelError(INTERNAL, f"model '{payload['model_name']}' sent no response")
            answer(ModelResponse([], {}, True, error))
        instance.write(("bls_end", call_id))
