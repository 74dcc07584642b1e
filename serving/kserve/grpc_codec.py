"""KServe v2 gRPC tensors <-> :class:`~serving.kserve.contract.Tensor`.

Inputs arrive either typed (``InferTensorContents``) or, as ``tritonclient`` sends them, as
``raw_input_contents`` (BYTES elements each prefixed by a little-endian uint32 length).
Outputs always go back as ``raw_output_contents``, as Triton sends them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from serving.kserve.contract import Tensor
from serving.kserve.errors import invalid

NUMPY_TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
_CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def decode_raw(name: str, datatype: str, raw: bytes, count: int) -> np.ndarray:
    """A tensor's raw bytes (gRPC raw contents, HTTP binary data) as numpy, read-only for
    fixed-size types; a size that does not match ``count`` elements is INVALID_ARG."""
    if datatype == "BYTES":
        try:
            data = deserialize_bytes_tensor(raw)
        except Exception:  # struct.error and friends: a malformed length prefix
            raise invalid(f"input '{name}': malformed BYTES tensor data") from None
    else:
        dtype = np.dtype(NUMPY_TYPES[datatype])
        if len(raw) != count * dtype.itemsize:
            raise invalid(
                f"unexpected total byte size {len(raw)} for input '{name}', expecting "
                f"{count * dtype.itemsize}"
            )
        data = np.frombuffer(raw, dtype=dtype)
    return data


def decode_inputs(request: pb.ModelInferRequest) -> dict[str, Tensor]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(
            f"expected {len(request.inputs)} raw input contents, got {len(raw)}: raw contents "
            "must be given for every input or for none"
        )
    tensors: dict[str, Tensor] = {}
    for i, item in enumerate(request.inputs):
        name, datatype, shape = item.name, item.datatype, tuple(item.shape)
        if name in tensors:
            raise invalid(f"input '{name}' already exists in request")
        if datatype not in _CONTENTS and datatype not in NUMPY_TYPES:
            raise invalid(f"invalid datatype '{datatype}' for input '{name}'")
        if any(d < 0 for d in shape):
            raise invalid(f"input '{name}' has a negative dimension in shape {list(shape)}")
        count = math.prod(shape)
        if raw:
            data = decode_raw(name, datatype, raw[i], count)
        else:
            field = _CONTENTS.get(datatype)
            if field is None:
                raise invalid(f"input '{name}': {datatype} data must be sent as raw contents")
            values: Any = list(getattr(item.contents, field))
            data = np.array(
                values, dtype=np.object_ if datatype == "BYTES" else NUMPY_TYPES[datatype]
            )
        if data.size != count:
            raise invalid(
                f"unexpected number of elements {data.size} for input '{name}', expecting "
                f"{count} for shape {list(shape)}"
            )
        tensors[name] = Tensor(name, datatype, shape, data.reshape(shape))
    return tensors


def parameters_of(params: Any) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as plain values."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, choice) if choice else None
    return out


def encode_outputs(response: pb.ModelInferResponse, outputs: list[Tensor]) -> None:
    for tensor in outputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        if tensor.datatype == "BYTES":
            serialized = serialize_byte_tensor(tensor.data)
            response.raw_output_contents.append(serialized.item() if serialized.size else b"")
        else:
            response.raw_output_contents.append(np.ascontiguousarray(tensor.data).tobytes())
