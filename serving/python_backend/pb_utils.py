"""What a model author's ``import triton_python_backend_utils as pb_utils`` gives, inside the
model's own process.

Triton builds this module from a Python file plus C++ bindings of its stub; here it is plain
Python over numpy. Everything that needs the server (sending a response, a BLS call, a metric,
a log line, "was this request cancelled") goes through :data:`_runtime`, which the stub process
(:mod:`serving.python_backend.stub`) installs before the model is imported. Behaviour follows
Triton's python_backend README (error codes, response-sender rules, ``ModelConfig`` checks of
``auto_complete_config``, metric kinds); messages are worded so that an author who knows
Triton's recognises them.

The shim ``author_path/triton_python_backend_utils.py`` re-exports this module under the name
authors import, so ``pb_utils.Tensor`` here and there are the same class.
"""

from __future__ import annotations

import contextlib
import enum
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

# --- constants Triton's module exposes -------------------------------------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 2
TRITONSERVER_MEMORY_CPU = 0

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# The numeric DataType values of model_config.proto, as triton_to_numpy_type takes them.
_ENUM_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
# KServe protocol datatype of each numpy kind, the way Triton names a tensor's type.
_NUMPY_TO_PROTOCOL: dict[Any, str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.object_): "BYTES",
}


class _Runtime(Protocol):
    """The stub's side of the module: the only way anything here reaches the server."""

    model_dir: str

    def send(self, request_key: int, response: InferenceResponse | None, flags: int) -> None: ...
    def is_cancelled(self, request_key: int) -> bool: ...
    def bls(self, request: InferenceRequest, decoupled: bool) -> Iterator[InferenceResponse]: ...
    def call(self, op: str, *args: Any) -> Any: ...
    def notify(self, op: str, *args: Any) -> None: ...


_runtime: _Runtime | None = None


def _rt() -> _Runtime:
    if _runtime is None:
        raise TritonModelException(
            "triton_python_backend_utils is only usable inside a model served by the Python "
            "backend runner"
        )
    return _runtime


# --- errors ----------------------------------------------------------------------------------


class ErrorCode(enum.IntEnum):
    """``TRITONSERVER_Error_Code`` (tritonserver.h), the values TritonError codes carry."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error a response carries: ``TritonError(message, code=TritonError.INTERNAL)``."""

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    def __init__(self, message: str, code: ErrorCode | int = ErrorCode.INTERNAL) -> None:
        if message is None:
            raise TypeError("TritonError: message must not be None")
        self._message = str(message)
        self._code = ErrorCode(int(code))

    def code(self) -> ErrorCode:
        return self._code

    def message(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"


class TritonModelException(Exception):
    """Raised by the model (or by this module on its behalf) to fail the current call."""


# --- tensors ---------------------------------------------------------------------------------


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    """BYTES tensors are object arrays of ``bytes``; ``str`` elements are UTF-8 encoded as
    Triton's serializer does, ``np.bytes_`` arrays (which lose trailing NULs) are converted."""
    out = np.empty(array.shape, dtype=np.object_)
    flat_in = array.reshape(-1)
    flat_out = out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, bytes):
            flat_out[i] = item
        elif isinstance(item, np.bytes_):
            flat_out[i] = bytes(item)
        else:
            flat_out[i] = str(item).encode("utf-8")
    return out


class _Capsule:
    """Lets ``np.from_dlpack`` consume a bare DLPack capsule (what ``torch.utils.dlpack
    .to_dlpack`` returns); CPU memory only."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class Tensor:
    """``Tensor(name, numpy_array)``: one named input or output."""

    def __init__(self, name: str, data: np.ndarray) -> None:
        if not isinstance(name, str):
            raise TritonModelException("Tensor name must be a string")
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}' expects a numpy array, got {type(data).__name__}"
            )
        if data.dtype.kind in ("O", "S", "U"):
            data = _as_bytes_array(data)
        elif data.dtype not in _NUMPY_TO_PROTOCOL:
            raise TritonModelException(f"Tensor '{name}': unsupported numpy dtype {data.dtype}")
        self._name = name
        self._data = np.ascontiguousarray(data)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def shape(self) -> list[int]:
        return list(self._data.shape)

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._data.dtype.type) or 0

    def datatype(self) -> str:
        """The KServe protocol name of the tensor's type (``FP32``, ``BYTES``...)."""
        return _NUMPY_TO_PROTOCOL[self._data.dtype]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._data.dtype == np.object_:
            raise TritonModelException(f"Tensor '{self._name}': BYTES tensors have no DLPack form")
        return self._data.__dlpack__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        source = dlpack_tensor if hasattr(dlpack_tensor, "__dlpack__") else _Capsule(dlpack_tensor)
        if hasattr(dlpack_tensor, "__dlpack_device__"):
            device_type = dlpack_tensor.__dlpack_device__()[0]
            if int(device_type) != 1:
                raise TritonModelException(
                    f"Tensor '{name}': only CPU tensors are supported by this runner"
                )
        if hasattr(dlpack_tensor, "is_contiguous") and not dlpack_tensor.is_contiguous():
            raise TritonModelException(
                f"Tensor '{name}': DLPack tensors must be contiguous and in C order"
            )
        try:
            array = np.from_dlpack(source)
        except (BufferError, TypeError, RuntimeError) as exc:
            raise TritonModelException(f"Tensor '{name}': {exc}") from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._data.shape)}, dtype={self._data.dtype})"


# --- requests and responses ------------------------------------------------------------------


def _parameters_json(parameters: Mapping[str, Any] | None) -> str:
    params = dict(parameters or {})
    for key, value in params.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | str | float):
            raise TritonModelException(
                f"Expect parameters keys to have type str and values to have type bool, int "
                f"or str, found '{key}': {type(value).__name__}"
            )
    return json.dumps(params)


class PreferredMemory:
    """Accepted for compatibility; every tensor here is in CPU memory."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceResponseSender:
    """What ``request.get_response_sender()`` returns; streams responses of one request."""

    def __init__(self, request_key: int, decoupled: bool) -> None:
        self._key = request_key
        self._decoupled = decoupled
        self._sent = 0
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if not self._decoupled:
            if response is not None and self._sent >= 1:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if response is None and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response."
                )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Expected an 'InferenceResponse' object, found type '{type(response).__name__}'"
            )
        if response is not None:
            self._sent += 1
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        _rt().send(self._key, response, flags)

    def is_cancelled(self) -> bool:
        return _rt().is_cancelled(self._key)

    def _is_closed(self) -> bool:
        return self._closed

    def _close(self) -> None:
        self._closed = True


class InferenceRequest:
    """A request ``execute`` receives, or (built by the model) a BLS request to another model:
    ``InferenceRequest(model_name=..., inputs=[...], requested_output_names=[...])``."""

    def __init__(
        self,
        *,
        inputs: Sequence[Tensor],
        requested_output_names: Sequence[str],
        model_name: str,
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"inputs must be pb_utils.Tensor objects, found '{type(tensor).__name__}'"
                )
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._model_name = model_name
        self._model_version = int(model_version)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = int(timeout)
        self._parameters = _parameters_json(parameters)
        self._key = -1
        self._sender: InferenceResponseSender | None = None
        self.release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _incoming(
        cls,
        key: int,
        *,
        model_name: str,
        model_version: int,
        inputs: list[Tensor],
        requested_output_names: list[str],
        request_id: str,
        correlation_id: int | str,
        flags: int,
        parameters_json: str,
        decoupled: bool,
    ) -> InferenceRequest:
        request = cls(
            inputs=inputs,
            requested_output_names=requested_output_names,
            model_name=model_name,
            model_version=model_version,
            request_id=request_id,
            correlation_id=correlation_id,
            flags=flags,
        )
        request._parameters = parameters_json
        request._key = key
        request._sender = InferenceResponseSender(key, decoupled)
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender is only available on requests passed to execute"
            )
        return self._sender

    def is_cancelled(self) -> bool:
        if self._key < 0:
            return False
        return _rt().is_cancelled(self._key)

    def set_release_flags(self, flags: int) -> None:
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(
                "Request rescheduling needs iterative sequence batching, which this runner "
                "does not support"
            )
        self.release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on another model of the same server and wait for its response
        (``decoupled=True``: an iterator over its responses)."""
        responses = _rt().bls(self, decoupled)
        if decoupled:
            return ResponseIterator(responses)
        return next(responses)

    def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` run in the event loop's executor, as Triton does: an awaitable."""
        import asyncio

        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self.exec, decoupled)


class ResponseIterator:
    """The responses of a decoupled BLS call, in the order the other model sent them."""

    def __init__(self, responses: Iterator[InferenceResponse]) -> None:
        self._responses = responses

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._responses)

    def cancel(self) -> None:
        close = getattr(self._responses, "close", None)
        if close is not None:
            close()


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters=None)``."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        tensors = list(output_tensors or [])
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors must be pb_utils.Tensor objects, found "
                    f"'{type(tensor).__name__}'"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f"error must be a pb_utils.TritonError, found '{type(error).__name__}'"
            )
        self._outputs = tensors
        self._error = error
        self._parameters = _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


# --- helpers ---------------------------------------------------------------------------------


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    for entry in model_config.get("input", []):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    for entry in model_config.get("output", []):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy and policy.get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _ENUM_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type in (np.object_, np.bytes_):
        return 13
    for number, numpy_type in _ENUM_TO_NUMPY.items():
        if numpy_type is not np.object_ and np.dtype(numpy_type) == np.dtype(data_type):
            return number
    return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """BYTES elements as Triton lays them out on the wire: a little-endian uint32 length
    before each element, in C order."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    parts = []
    for item in _as_bytes_array(input_tensor).reshape(-1):
        parts.append(struct.pack("<I", len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    items = []
    offset = 0
    buffer = bytes(encoded_tensor)
    while offset < len(buffer):
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        items.append(buffer[offset : offset + length])
        offset += length
    return np.array(items, dtype=np.object_)


def get_model_dir() -> str:
    """The directory ``model.py`` was loaded from (``<repository>/<model>/<version>``)."""
    return _rt().model_dir


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_rt().call("is_model_ready", model_name, model_version))


def load_model(model_name: str, config: str = "", files: Any = None) -> None:
    raise TritonModelException(
        "load_model is not supported: the models an instance serves are fixed at its start"
    )


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    raise TritonModelException(
        "unload_model is not supported: the models an instance serves are fixed at its start"
    )


# --- auto-complete ---------------------------------------------------------------------------


class ModelConfig:
    """The configuration ``auto_complete_config`` receives and returns. ``as_dict()`` is the
    configuration as Triton's JSON; the setters refuse what Triton refuses (a conflicting
    datatype, dims or policy, an unknown property, a smaller max_batch_size)."""

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._model_config.get(other):
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    f"scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _add_io(self, kind: str, io: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        label = f"{kind} '{io.get('name', '')}'" if "name" in io else kind
        for prop in io:
            if prop not in allowed:
                raise ValueError(
                    f"{label} in auto-complete-config function for model '{self._name}' "
                    f"contains property other than {', '.join(repr(a) for a in allowed)}."
                )
        for prop in ("name", "data_type", "dims"):
            if prop not in io:
                raise ValueError(
                    f"{label} in auto-complete-config function for model '{self._name}' is "
                    f"missing '{prop}' property."
                )
        for existing in self._model_config[kind]:
            if existing["name"] != io["name"]:
                continue
            have_type = existing.get("data_type", "TYPE_INVALID")
            if have_type != "TYPE_INVALID" and have_type != io["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{have_type} for {kind} '{io['name']}', model provides {io['data_type']}"
                )
            have_dims = existing.get("dims") or []
            if have_dims and [int(d) for d in have_dims] != [int(d) for d in io["dims"]]:
                raise ValueError(
                    f"model '{self._name}', tensor '{io['name']}': the model expects dims "
                    f"{list(io['dims'])} but the model configuration specifies dims "
                    f"{list(have_dims)}"
                )
            if (
                "optional" in io
                and "optional" in existing
                and bool(existing["optional"]) != bool(io["optional"])
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{io['name']}': the model expects optional "
                    f"{io['optional']} but the model configuration specifies optional "
                    f"{existing['optional']}"
                )
            existing["data_type"] = io["data_type"]
            existing["dims"] = list(io["dims"])
            if "optional" in io:
                existing["optional"] = io["optional"]
            return
        self._model_config[kind].append(dict(io))

    def add_input(self, input: Mapping[str, Any]) -> None:  # Triton's name
        self._add_io("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add_io("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        for prop in transaction_policy_dict:
            if prop != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted


# --- logging ---------------------------------------------------------------------------------


class LogLevel(enum.IntEnum):
    """``Logger.INFO`` & co.: the levels Triton's log has."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """``pb_utils.Logger.log_info(msg)`` and friends; the lines land in the server's log."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        import inspect

        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        # log_info & co. add one frame; report the author's line, not ours.
        if caller is not None and caller.f_code.co_filename == __file__ and caller.f_back:
            caller = caller.f_back
        where = (
            f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}" if caller else ""
        )
        _rt().notify("log", int(level), str(message), where)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)


# --- custom metrics --------------------------------------------------------------------------


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class Metric:
    """One labelled series of a :class:`MetricFamily`; its value lives in the server."""

    def __init__(self, family: MetricFamily, metric_id: int) -> None:
        self._family = family
        self._id = metric_id

    def increment(self, value: float) -> None:
        self._op("increment", "Failed to increment metric value: ", value)

    def set(self, value: float) -> None:
        self._op("set", "Failed to set metric value: ", value)

    def observe(self, value: float) -> None:
        self._op("observe", "Failed to observe metric value: ", value)

    def value(self) -> float:
        return float(self._op("value", "Failed to get metric value: "))

    def _op(self, op: str, prefix: str, *args: Any) -> Any:
        try:
            return _rt().call("metric_" + op, self._id, *(float(a) for a in args))
        except TritonModelException as exc:
            raise TritonModelException(prefix + str(exc)) from None

    def __del__(self) -> None:
        runtime = _runtime
        if runtime is not None:
            with contextlib.suppress(Exception):  # the process may be shutting down
                runtime.notify("metric_delete", self._id)


class MetricFamily:
    """``MetricFamily(name, description, kind)`` with ``kind`` COUNTER, GAUGE or HISTOGRAM;
    exposed by the server in Prometheus text beside its own metrics."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind | int) -> None:
        try:
            kind = MetricKind(int(kind))
        except ValueError:
            raise TritonModelException(
                "Error when creating MetricFamily: Unsupported kind passed to MetricFamily "
                "constructor."
            ) from None
        try:
            self._id = int(_rt().call("family_create", str(name), str(description), int(kind)))
        except TritonModelException as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None
        self._kind = kind
        self.name = name

    def Metric(  # Triton's method name
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        if labels is not None and not isinstance(labels, Mapping):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        label_items = [(str(k), str(v)) for k, v in (labels or {}).items()]
        bucket_list = None if buckets is None else [float(b) for b in buckets]
        try:
            metric_id = _rt().call("metric_create", self._id, label_items, bucket_list)
        except TritonModelException as exc:
            raise TritonModelException(f"Error when creating Metric: {exc}") from None
        return Metric(self, int(metric_id))

    def __del__(self) -> None:
        runtime = _runtime
        if runtime is not None:
            with contextlib.suppress(Exception):  # the process may be shutting down
                runtime.notify("family_delete", self._id)


__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
