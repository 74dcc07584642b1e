"""The checks Triton core makes on a request before the backend sees it (``infer_request.cc``
``Normalize``/``ValidateRequestInputs`` and ``model.cc``): input count and names, datatypes,
shapes against ``dims`` (``-1`` matches any size) with the batch dimension first when
``max_batch_size > 0``, batch size limit, element counts, requested outputs. Messages are
Triton's, so a client sees the same INVALID_ARG text from this runner and from Triton.

BYTES elements are passed to the model as they came: Triton does not check that they are
UTF-8, and neither does this runner (a model that expects text decodes and reports itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.python_backend.config import TensorSpec
from serving.python_backend.types import INVALID_ARG, ModelError, ModelRequest

_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}


@dataclass(frozen=True)
class CheckedRequest:
    """A request the model may see: its inputs as ``(name, array)`` (reshaped where the
    configuration says so), the outputs it must produce, and its batch size."""

    inputs: list[tuple[str, np.ndarray]]
    requested_output_names: list[str]
    wanted_outputs: frozenset[str] | None  # None: the client asked for every output
    batch_size: int


def _dims(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_request(
    model_name: str,
    max_batch_size: int,
    inputs: dict[str, TensorSpec],
    outputs: dict[str, TensorSpec],
    request: ModelRequest,
) -> CheckedRequest:
    tag = f"[request id: {request.request_id or '<id_unknown>'}] "

    def invalid(message: str) -> ModelError:
        return ModelError(INVALID_ARG, tag + message)

    given: dict[str, np.ndarray] = {}
    for tensor in request.inputs:
        spec = inputs.get(tensor.name)
        if spec is None:
            raise invalid(f"unexpected inference input '{tensor.name}' for model '{model_name}'")
        if tensor.name in given:
            raise invalid(f"input '{tensor.name}' already exists in request")
        if tensor.datatype != spec.datatype:
            raise invalid(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
                f"'{model_name}' expects '{spec.datatype}'"
            )
        data = np.asarray(tensor.data)
        if data.dtype != _DTYPES[spec.datatype] and not (
            spec.datatype == "BYTES" and data.dtype.kind == "S"
        ):
            raise invalid(
                f"input '{tensor.name}': data of numpy type {data.dtype} does not match "
                f"datatype {spec.datatype}"
            )
        given[tensor.name] = data

    required = [s.name for s in inputs.values() if not s.optional]
    missing = [name for name in required if name not in given]
    if missing:
        got = "[" + ",".join(f"'{n}'" for n in given) + "]"
        wanted = "[" + ",".join(f"'{n}'" for n in missing) + "]"
        if len(required) == len(inputs):
            count = f"expected {len(inputs)} inputs"
        else:
            count = f"expected number of inputs between {len(required)} and {len(inputs)}"
        raise invalid(
            f"{count} but got {len(given)} inputs for model '{model_name}'. Got input(s) "
            f"{got}, but missing required input(s) {wanted}. Please provide all required "
            "input(s)."
        )

    batch_size = 0
    if max_batch_size > 0:
        for name, data in given.items():
            if data.ndim == 0:
                raise invalid(
                    f"input '{name}' has no shape but model requires batch dimension for "
                    f"'{model_name}'"
                )
            if batch_size == 0:
                batch_size = data.shape[0]
            elif data.shape[0] != batch_size:
                raise invalid(
                    f"input '{name}' batch size does not match other inputs for '{model_name}'"
                )
        if batch_size > max_batch_size:
            raise invalid(
                f"inference request batch-size must be <= {max_batch_size} for '{model_name}'"
            )

    checked: list[tuple[str, np.ndarray]] = []
    for name, data in given.items():
        spec = inputs[name]
        shape = tuple(data.shape[1:]) if max_batch_size > 0 else tuple(data.shape)
        ok = len(shape) == len(spec.dims) and all(
            d == -1 or d == s for d, s in zip(spec.dims, shape, strict=True)
        )
        if not ok:
            full = ((-1,) if max_batch_size > 0 else ()) + spec.dims
            note = ""
            if max_batch_size > 0:
                note = (
                    "NOTE: Setting a non-zero max_batch_size in the model config requires a "
                    "batch dimension to be prepended to each input shape. If you want to "
                    "specify the full shape including the batch dim in your input dims "
                    "config, try setting max_batch_size to zero. See the model configuration "
                    "docs for more info on max_batch_size."
                )
            raise invalid(
                f"unexpected shape for input '{name}' for model '{model_name}'. Expected "
                f"{_dims(full)}, got {_dims(data.shape)}. {note}"
            )
        if spec.datatype == "BYTES" and data.dtype.kind == "S":
            data = np.array([bytes(x) for x in data.reshape(-1)], dtype=np.object_).reshape(
                data.shape
            )
        if spec.reshape is not None:
            wild = iter(s for d, s in zip(spec.dims, shape, strict=True) if d == -1)
            target = tuple(next(wild) if d == -1 else d for d in spec.reshape)
            prefix = (data.shape[0],) if max_batch_size > 0 else ()
            data = data.reshape(prefix + target)
        checked.append((name, data))

    requested = list(request.requested_output_names)
    for name in requested:
        if name not in outputs:
            raise invalid(f"unexpected inference output '{name}' for model '{model_name}'")
    return CheckedRequest(
        inputs=checked,
        requested_output_names=requested or list(outputs),
        wanted_outputs=frozenset(requested) if requested else None,
        batch_size=max(batch_size, 1),
    )
