"""What both protocol front ends share: the served models, Triton's request validation, the
vLLM-backend request handling over the engine, statistics, and drain state.

The gRPC and HTTP servers only translate wire formats into :class:`Tensor` dicts and back;
every decision that a client could observe is made here once, so both answer alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

from tritonclient.grpc import model_config_pb2 as mc

from serving.engine.core import Engine
from serving.engine.types import Delta, EngineUnavailableError, GenerateRequest, InvalidRequestError
from serving.kserve import contract
from serving.kserve.contract import Tensor, TensorSpec
from serving.kserve.errors import Code, TritonError, invalid
from serving.kserve.repository import ModelControl, RepositoryError, model_names, read_model
from serving.kserve.triton_metrics import RequestTimer, StatsRecorder

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
class Response:
    outputs: list[Tensor]
    final: bool


@dataclass
class ServedModel:
    engine: Engine
    config: mc.ModelConfig
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def version(self) -> str:
        return self.engine.version


def default_config(engine: Engine) -> mc.ModelConfig:
    """The configuration Triton would report for a bare ``backend: "vllm"`` config.pbtxt."""
    config = mc.ModelConfig(name=engine.name, backend=contract.BACKEND)
    config.instance_group.add(
        name=f"{engine.name}_0", count=1, kind=mc.ModelInstanceGroup.KIND_MODEL
    )
    config.version_policy.latest.num_versions = 1
    contract.auto_complete(config)
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
            engine, config, contract.input_specs(config), contract.output_specs(config)
        )
        self.stats.add_model(engine.name, engine.version)

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
            if model is not None and model.engine.ready:
                rows.append(IndexEntry(name, model.version, "READY"))
            elif ready_only:
                continue
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
                engine = await asyncio.to_thread(control.load, entry)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                self._states[name] = (entry.version, "UNAVAILABLE", reason)
                logger.error("failed to load '%s' version %s: %s", name, entry.version, reason)
                raise TritonError(
                    Code.INTERNAL,
                    f"failed to load '{name}', failed to load '{name}' version "
                    f"{entry.version}: {reason}",
                ) from None
            self._add(engine, entry.config)
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
            model.engine.begin_drain()
            await model.engine.wait_idle(drain_timeout)
            await asyncio.to_thread(model.engine.shutdown)
            self._states[name] = (model.version, "UNAVAILABLE", "unloaded")
            logger.info("successfully unloaded '%s' version %s", name, model.version)

    def engines(self) -> list[Engine]:
        """The engines of the models served now."""
        return [model.engine for model in self.models.values()]

    def shutdown(self) -> None:
        """Shut down every served engine (also those loaded at run time)."""
        for model in self.models.values():
            model.engine.shutdown()

    # --- health -------------------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.draining and all(m.engine.ready for m in self.models.values())

    def model_ready(self, name: str, version: str = "") -> bool:
        try:
            model = self.get(name, version)
        except TritonError:
            return False
        return not self.draining and model.engine.ready

    def begin_drain(self) -> None:
        """Refuse new requests (readiness turns false); requests in flight run on."""
        self.draining = True
        for model in self.models.values():
            model.engine.begin_drain()

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
        return contract.metadata(model.config, model.version)

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

    async def infer(
        self,
        model: ServedModel,
        tensors: dict[str, Tensor],
        parameters: dict[str, Any],
        request_id: str = "",
        requested_outputs: list[str] | None = None,
        input_ns: int = 0,
    ) -> AsyncGenerator[Response, None]:
        """Every response of one request; the last has ``final`` set.

        Raises :class:`TritonError` (before or between responses). Closing the iterator early
        cancels the request in the engine."""
        timer = self.stats.timer(model.name)
        timer.input_ns = input_ns
        self._enter()
        try:
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
