"""What both protocol front ends share: the served models, Triton's request validation, the
vLLM-backend request handling over the engine, Python-backend models through their
:class:`~serving.python_backend.PythonModelHandle` (and the BLS calls between models),
statistics, and drain state.

The gRPC and HTTP servers only translate wire formats into :class:`Tensor` dicts and back;
every decision that a client could observe is made here once, so both answer alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tritonclient.grpc import model_config_pb2 as mc

from serving import model_config
from serving.engine.core import Engine
from serving.kserve import contract
from serving.kserve.contract import Tensor
from serving.kserve.errors import Code, TritonError, invalid
from serving.kserve.triton_metrics import RequestTimer, StatsRecorder
from serving.model_config import TensorSpec
from serving.python_backend.types import ModelError, ModelRequest, ModelResponse
from serving.python_backend.types import Tensor as ModelTensor
from serving.repository import (
    PYTHON_BACKEND,
    ModelEntry,
    RepositoryError,
    model_names,
    read_model,
)
from serving.sampling.types import (
    Delta,
    EngineUnavailableError,
    GenerateRequest,
    InvalidRequestError,
)

if TYPE_CHECKING:
    from serving.python_backend.handle import PythonModelHandle

logger = logging.getLogger("serving.kserve")

MODEL_CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"

# Request parameters Triton itself consumes; they never reach the backend's ``parameters()``.
RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "triton_enable_empty_final_response",
        "binary_data_output",
    }
)


@dataclass(frozen=True)
class ModelControl:
    """Triton's model control (``--model-control-mode``) over one repository.

    ``explicit``: the repository-extension calls (load, unload) are allowed, as with
    ``--model-control-mode=explicit``; otherwise (``none``) they are refused as Triton refuses
    them. ``load`` turns an entry into a ready engine (slow: reads weights); it runs in a worker
    thread, so serving goes on while a model loads."""

    root: Path
    explicit: bool
    load: Callable[[ModelEntry], Any]


class ModelLoadFailed(RuntimeError):
    """A Python-backend model of the repository could not load; the message says why."""


@dataclass(frozen=True)
class Response:
    """One response of a request. ``error`` is set for an error the model sent as a response
    (a decoupled Python model's stream goes on after it); ``final`` on the last one."""

    outputs: list[Tensor]
    final: bool
    error: TritonError | None = None


@dataclass
class ServedModel:
    """A served model: a vLLM-backend ``engine`` or a Python-backend ``handle`` (one of
    them), with the configuration metadata and ``ModelConfig`` report."""

    engine: Engine | None
    config: mc.ModelConfig
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    handle: PythonModelHandle | None = None

    @property
    def name(self) -> str:
        return self.engine.name if self.engine is not None else self.config.name

    @property
    def version(self) -> str:
        if self.engine is not None:
            return self.engine.version
        assert self.handle is not None
        return self.handle.version

    @property
    def ready(self) -> bool:
        if self.engine is not None:
            return self.engine.ready
        assert self.handle is not None
        return self.handle.is_ready()

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)

    @property
    def failure(self) -> str:
        """Why a Python model stopped serving (its process died), if it did."""
        return (self.handle.failure or "") if self.handle is not None else ""


def python_served(handle: PythonModelHandle) -> ServedModel:
    """A loaded handle as a served model: its auto-completed configuration and tensors."""

    def specs(found: dict[str, Any]) -> dict[str, TensorSpec]:
        return {
            name: TensorSpec(name, spec.datatype, tuple(spec.dims), spec.optional)
            for name, spec in found.items()
        }

    return ServedModel(None, handle.config, specs(handle.inputs), specs(handle.outputs), handle)


def triton_error(error: ModelError) -> TritonError:
    """A Python model's error with its Triton code (unknown names become INTERNAL)."""
    try:
        code = Code(error.code)
    except ValueError:
        code = Code.INTERNAL
    return TritonError(code, error.message)


def default_config(engine: Engine) -> mc.ModelConfig:
    """The configuration Triton would report for a bare ``backend: "vllm"`` config.pbtxt."""
    config = mc.ModelConfig(name=engine.name, backend=model_config.BACKEND)
    config.instance_group.add(
        name=f"{engine.name}_0", count=1, kind=mc.ModelInstanceGroup.KIND_MODEL
    )
    config.version_policy.latest.num_versions = 1
    model_config.auto_complete(config)
    return config


def _request_tag(request_id: str) -> str:
    return f"[request id: {request_id or '<id_unknown>'}] "


@dataclass(frozen=True)
class IndexEntry:
    """One row of the repository index (``RepositoryIndex`` / ``/v2/repository/index``)."""

    name: str
    version: str = ""
    state: str = ""  # "" (never loaded), READY, UNAVAILABLE, LOADING, UNLOADING
    reason: str = ""


class InferenceService:
    def __init__(
        self,
        engines: list[Engine],
        configs: dict[str, mc.ModelConfig] | None = None,
        control: ModelControl | None = None,
    ) -> None:
        configs = configs or {}
        self.models: dict[str, ServedModel] = {}
        self.stats = StatsRecorder()
        for engine in engines:
            self._add(engine, configs.get(engine.name) or default_config(engine))
        self.control = control
        # Models that were loaded or tried since start: (version, state, reason).
        self._states: dict[str, tuple[str, str, str]] = {}
        self._control_lock = asyncio.Lock()
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def _add(self, engine: Engine, config: mc.ModelConfig) -> None:
        self.models[engine.name] = ServedModel(
            engine, config, model_config.input_specs(config), model_config.output_specs(config)
        )
        self.stats.add_model(engine.name, engine.version)

    async def add_python(self, entry: ModelEntry) -> None:
        """Load a Python-backend model and serve it; :class:`ModelLoadFailed` says why not.

        Its BLS calls come back through :meth:`bls`, so they reach every model served here
        and count in the callee's statistics as Triton counts them."""
        from serving.python_backend.handle import PythonModelHandle
        from serving.python_backend.types import ModelLoadError

        handle = PythonModelHandle(
            entry.model_dir,
            version=entry.version,
            bls=self.bls,
            model_ready=self._bls_model_ready,
        )
        try:
            await handle.load()
        except ModelLoadError as exc:
            raise ModelLoadFailed(str(exc)) from None
        stats = handle.stats
        self.models[handle.name] = python_served(handle)
        # Executions and batch-size units are counted where execute runs (one execute may
        # carry several requests); requests, failures and durations here.
        self.stats.add_model(
            handle.name,
            handle.version,
            counts=lambda: (stats.inference_count, stats.execution_count),
        )

    def _bls_model_ready(self, name: str, version: str) -> bool:
        model = self.models.get(name)
        if model is None or (version and version != model.version):
            return False
        return not self.draining and model.ready

    async def bls(
        self, name: str, version: str, request: ModelRequest, decoupled: bool
    ) -> AsyncIterator[ModelResponse]:
        """A Python model's BLS call to ``name``: any model served here, vLLM or Python,
        through :meth:`infer` as a client's request goes. Errors are :class:`ModelError`."""
        try:
            model = self.get(name, version)
            if model.decoupled and not decoupled:
                raise TritonError(
                    Code.INVALID_ARG,
                    f"model '{name}' uses the decoupled transaction policy: call it with "
                    "exec(decoupled=True)",
                )
            tensors = {
                t.name: Tensor(t.name, t.datatype, tuple(t.data.shape), t.data)
                for t in request.inputs
            }
            responses = self.infer(
                model,
                tensors,
                dict(request.parameters),
                request.request_id,
                list(request.requested_output_names),
                internal=True,
            )
            async with aclosing(responses) as iterator:
                async for response in iterator:
                    error = None
                    if response.error is not None:
                        error = ModelError(response.error.code.value, response.error.message)
                    outputs = [ModelTensor(t.name, t.datatype, t.data) for t in response.outputs]
                    yield ModelResponse(outputs, {}, response.final, error)
        except TritonError as exc:
            raise ModelError(exc.code.value, exc.message) from None

    # --- model control (Triton's repository extension) ----------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model of the repository (or only the served ones without one), as Triton's
        index lists them: served models READY, unloaded or failed ones UNAVAILABLE with the
        reason, never-loaded ones with no state."""
        names = set(self.models) | set(self._states)
        if self.control is not None:
            names |= set(model_names(self.control.root))
        rows = []
        for name in sorted(names):
            model = self.models.get(name)
            if model is not None and model.ready:
                rows.append(IndexEntry(name, model.version, "READY"))
            elif ready_only:
                continue
            elif model is not None:  # a Python model whose process died
                rows.append(IndexEntry(name, model.version, "UNAVAILABLE", model.failure))
            elif name in self._states:
                rows.append(IndexEntry(name, *self._states[name]))
            else:
                rows.append(IndexEntry(name))
        return rows

    def _check_control(self) -> ModelControl:
        if self.control is None or not self.control.explicit:
            raise TritonError(Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)
        return self.control

    async def load_model(self, name: str) -> None:
        """Load ``name`` from the repository (explicit mode); a served model is left as is.

        Raises :class:`TritonError` (INTERNAL, as Triton) with the reason when it cannot."""
        control = self._check_control()
        async with self._control_lock:
            if name in self.models:
                return
            try:
                entry = read_model(control.root / name)
            except (RepositoryError, OSError) as exc:
                self._states[name] = ("", "UNAVAILABLE", str(exc))
                raise TritonError(
                    Code.INTERNAL, f"failed to load '{name}', failed to poll from model repository"
                ) from exc
            self._states[name] = (entry.version, "LOADING", "")
            logger.info("loading model %s version %s", name, entry.version)
            try:
                if entry.backend == PYTHON_BACKEND:
                    await self.add_python(entry)
                else:
                    engine = await asyncio.to_thread(control.load, entry)
                    self._add(engine, entry.config)
            except Exception as exc:
                # A Python model's failure already says what failed; an engine's is an exception.
                failed = isinstance(exc, ModelLoadFailed)
                reason = str(exc) if failed else f"{type(exc).__name__}: {exc}"
                self._states[name] = (entry.version, "UNAVAILABLE", reason)
                logger.error("failed to load '%s' version %s: %s", name, entry.version, reason)
                raise TritonError(
                    Code.INTERNAL,
                    f"failed to load '{name}', failed to load '{name}' version "
                    f"{entry.version}: {reason}",
                ) from None
            self._states[name] = (entry.version, "READY", "")
            logger.info("successfully loaded '%s' version %s", name, entry.version)

    async def unload_model(self, name: str, drain_timeout: float = 30.0) -> None:
        """Stop serving ``name``: new requests are refused at once (it leaves the served set),
        those in flight finish within ``drain_timeout``, then the engine is shut down."""
        self._check_control()
        async with self._control_lock:
            model = self.models.pop(name, None)
            if model is None:
                return
            self._states[name] = (model.version, "UNLOADING", "")
            if model.handle is not None:
                await model.handle.close(drain_timeout)
            else:
                assert model.engine is not None
                model.engine.begin_drain()
                await model.engine.wait_idle(drain_timeout)
                await asyncio.to_thread(model.engine.shutdown)
            self._states[name] = (model.version, "UNAVAILABLE", "unloaded")
            logger.info("successfully unloaded '%s' version %s", name, model.version)

    def engines(self) -> list[Engine]:
        """The engines of the models served now."""
        return [model.engine for model in self.models.values() if model.engine is not None]

    def python_handles(self) -> list[PythonModelHandle]:
        """The Python-backend models served now."""
        return [model.handle for model in self.models.values() if model.handle is not None]

    def shutdown(self) -> None:
        """Shut down every served engine (also those loaded at run time)."""
        for engine in self.engines():
            engine.shutdown()

    async def close_python(self, timeout_s: float = 10.0) -> None:
        """``finalize`` every Python model and end its processes."""
        await asyncio.gather(*(h.close(timeout_s) for h in self.python_handles()))

    # --- health -------------------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.draining and all(m.ready for m in self.models.values())

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Served, not draining, and ready: an engine that runs, or a Python model whose
        processes live and whose own ``is_ready()`` (if it has one) says so."""
        try:
            model = self.get(name, version)
        except TritonError:
            return False
        if self.draining:
            return False
        if model.handle is not None:
            return await model.handle.model_ready()
        return model.ready

    def begin_drain(self) -> None:
        """Refuse new requests (readiness turns false); requests in flight run on.

        Admission is decided here, where a request enters (:meth:`infer`), not in the engines:
        a request that entered before the drain began but had not yet reached its engine was
        refused there as "shutting down" though it counted as in flight."""
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """Until every request has sent its final response, or ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # --- models -------------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise invalid(f"Request for unknown model: '{name}' is not found")
        if version:
            if not version.isdigit() or int(version) <= 0:
                raise invalid(
                    f"failed to get model version from specified version string '{version}' "
                    "(details: version should be an integral value > 0)"
                )
            if int(version) != int(model.version):
                raise TritonError(Code.NOT_FOUND, f"'{name}' version {version} is not found")
        return model

    def metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self.get(name, version)
        if model.handle is None:
            return contract.metadata(model.config, model.version)

        def describe(specs: dict[str, TensorSpec]) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "datatype": s.datatype, "shape": list(s.dims)}
                for s in specs.values()
            ]

        return {
            "name": model.name,
            "versions": [model.version],
            "platform": model.config.platform or model.config.backend,
            "inputs": describe(model.inputs),
            "outputs": describe(model.outputs),
        }

    # --- inference ----------------------------------------------------------------------------

    def validate(self, model: ServedModel, tensors: dict[str, Tensor], request_id: str) -> None:
        """The checks Triton core makes before a request reaches the backend."""
        tag = _request_tag(request_id)
        required = [s.name for s in model.inputs.values() if not s.optional]
        if len(tensors) < len(required) or len(tensors) > len(model.inputs):
            raise invalid(
                f"{tag}expected number of inputs between {len(required)} and "
                f"{len(model.inputs)} but got {len(tensors)} inputs for model '{model.name}'"
            )
        for tensor in tensors.values():
            spec = model.inputs.get(tensor.name)
            if spec is None:
                raise invalid(
                    f"{tag}unexpected inference input '{tensor.name}' for model '{model.name}'"
                )
            if tensor.datatype != spec.datatype:
                raise invalid(
                    f"{tag}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                    f"but model '{model.name}' expects '{spec.datatype}'"
                )
            ok = len(tensor.shape) == len(spec.dims) and all(
                d == -1 or d == s for d, s in zip(spec.dims, tensor.shape, strict=True)
            )
            if not ok:
                raise invalid(
                    f"{tag}unexpected shape for input '{tensor.name}' for model "
                    f"'{model.name}'. Expected {list(spec.dims)}, got {list(tensor.shape)}. "
                )

    async def infer_unary(
        self,
        model: ServedModel,
        tensors: dict[str, Tensor],
        parameters: dict[str, Any],
        request_id: str = "",
        requested_outputs: list[str] | None = None,
        input_ns: int = 0,
    ) -> Response:
        """The one answer of a non-decoupled model (gRPC ``ModelInfer``, HTTP ``/infer``): the
        last response that carries outputs, or the only one. Raises :class:`TritonError`."""
        responses = self.infer(model, tensors, parameters, request_id, requested_outputs, input_ns)
        last = None
        async with aclosing(responses) as iterator:
            async for response in iterator:
                if response.error is not None:
                    raise response.error
                if response.outputs or last is None:
                    last = response
        if last is None:
            raise TritonError(Code.INTERNAL, f"model '{model.name}' sent no response")
        return last

    async def infer(
        self,
        model: ServedModel,
        tensors: dict[str, Tensor],
        parameters: dict[str, Any],
        request_id: str = "",
        requested_outputs: list[str] | None = None,
        input_ns: int = 0,
        internal: bool = False,
    ) -> AsyncGenerator[Response, None]:
        """Every response of one request; the last has ``final`` set.

        Raises :class:`TritonError` (before or between responses). Closing the iterator early
        cancels the request in the engine. ``internal``: a BLS call of a model, which runs on
        while the server drains (the request that made it is in flight)."""
        if model.handle is not None:
            python = self._python(
                model, tensors, parameters, request_id, requested_outputs, input_ns, internal
            )
            async with aclosing(python) as responses:  # leaving early cancels in the model
                async for response in responses:
                    yield response
            return
        timer = self.stats.timer(model.name)
        timer.input_ns = input_ns
        self._enter()
        try:
            if self.draining and not internal:
                raise TritonError(
                    Code.UNAVAILABLE,
                    f"{contract.BACKEND_ERROR_PREFIX}model {model.name} is shutting down; "
                    "retry elsewhere",
                )
            try:
                self.validate(model, tensors, request_id)
                wanted = self._wanted_outputs(model, requested_outputs, request_id)
            except TritonError:
                timer.failed("OTHER")
                raise
            params = {k: v for k, v in parameters.items() if k not in RESERVED_PARAMETERS}
            async for response in self._run(model, tensors, params, request_id, timer):
                if wanted is not None:
                    response = Response(
                        [t for t in response.outputs if t.name in wanted], response.final
                    )
                timer.responded()
                yield response
            timer.succeeded()
        except (asyncio.CancelledError, GeneratorExit):
            timer.failed("CANCELED")
            raise
        except TritonError as exc:
            timer.failed("REJECTED" if exc.code is Code.UNAVAILABLE else "BACKEND")
            raise
        except Exception as exc:
            timer.failed("BACKEND")
            raise TritonError(Code.INTERNAL, f"{contract.BACKEND_ERROR_PREFIX}{exc}") from exc
        finally:
            self._exit()

    async def _python(
        self,
        model: ServedModel,
        tensors: dict[str, Tensor],
        parameters: dict[str, Any],
        request_id: str,
        requested_outputs: list[str] | None,
        input_ns: int,
        internal: bool,
    ) -> AsyncGenerator[Response, None]:
        """A Python model's request: its handle checks it as Triton core does (INVALID_ARG
        naming the tensor), runs it in the model's process and streams the responses back."""
        handle = model.handle
        assert handle is not None
        timer = self.stats.timer(model.name)
        timer.input_ns = input_ns
        self._enter()
        failed = False
        try:
            if self.draining and not internal:
                raise TritonError(Code.UNAVAILABLE, f"model '{model.name}' is being unloaded")
            request = ModelRequest(
                inputs=list(tensors.values()),
                requested_output_names=tuple(requested_outputs or ()),
                request_id=request_id,
                parameters={k: v for k, v in parameters.items() if k not in RESERVED_PARAMETERS},
            )
            try:
                stream = handle.stream(request)
                async with aclosing(stream) as responses:
                    async for response in responses:
                        timer.responded()
                        error = None
                        if response.error is not None:
                            failed = True
                            error = triton_error(response.error)
                        started = time.monotonic_ns()
                        outputs = [
                            Tensor(t.name, t.datatype, tuple(t.data.shape), t.data)
                            for t in response.outputs
                        ]
                        timer.output_ns += time.monotonic_ns() - started
                        yield Response(outputs, response.final, error)
            except ModelError as exc:
                raise triton_error(exc) from None
            if failed:
                timer.failed("BACKEND")
            else:
                timer.succeeded()
        except (asyncio.CancelledError, GeneratorExit):
            timer.failed("CANCELED")
            raise
        except TritonError as exc:
            # As for vLLM models: refused before the model saw it is OTHER, unavailable
            # REJECTED.
            reason = {Code.UNAVAILABLE: "REJECTED", Code.INVALID_ARG: "OTHER"}
            timer.failed(reason.get(exc.code, "BACKEND"))
            raise
        finally:
            self._exit()

    def _wanted_outputs(
        self, model: ServedModel, requested: list[str] | None, request_id: str
    ) -> set[str] | None:
        if not requested:
            return None
        for name in requested:
            if name not in model.outputs:
                raise invalid(
                    f"{_request_tag(request_id)}unexpected inference output '{name}' for "
                    f"model '{model.name}'"
                )
        return set(requested)

    async def _run(
        self,
        model: ServedModel,
        tensors: dict[str, Tensor],
        parameters: dict[str, Any],
        request_id: str,
        timer: RequestTimer,
    ) -> AsyncGenerator[Response, None]:
        engine = model.engine
        assert engine is not None
        task = contract.task_of(tensors)
        wanted = "embed" if engine.kind == "embed" else "generate"
        try:
            if task != wanted:
                raise InvalidRequestError(f"Model {model.name} does not support '{task}' request")
            if task == "embed":
                call = contract.parse_embed(tensors)
                vectors, prompt_tokens = await engine.embed([call.text])
                started = time.monotonic_ns()
                outputs = contract.embed_outputs(call, vectors[0], prompt_tokens)
                timer.output_ns += time.monotonic_ns() - started
                yield Response(outputs, final=True)
                return
            generate = contract.parse_generate(tensors, parameters)
            responder = contract.GenerateResponder(generate)
            request_key = request_id or f"kserve-{id(timer)}"
            request = GenerateRequest(request_key, generate.prompt, generate.options)
            try:
                async with aclosing(
                    cast(AsyncGenerator[Delta, None], engine.generate(request))
                ) as deltas:
                    try:
                        async for delta in deltas:
                            started = time.monotonic_ns()
                            streamed = responder.add(delta)
                            timer.output_ns += time.monotonic_ns() - started
                            if streamed is not None:
                                yield Response(streamed, final=responder.finished)
                    except (asyncio.CancelledError, GeneratorExit):
                        logger.info("[vllm] Cancelling the request")  # the backend's words
                        raise
            except (asyncio.CancelledError, GeneratorExit):
                # Closing the engine's stream (above) aborted the request there.
                logger.info("[vllm] Successfully cancelled the request")
                raise
            if not generate.stream:
                yield Response(responder.final(), final=True)
        except InvalidRequestError as exc:
            raise TritonError(Code.INVALID_ARG, f"{contract.BACKEND_ERROR_PREFIX}{exc}") from None
        except EngineUnavailableError as exc:
            raise TritonError(Code.UNAVAILABLE, f"{contract.BACKEND_ERROR_PREFIX}{exc}") from None

    def _enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _exit(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
