"""KServe v2 HTTP ``/infer`` bodies, with Triton's binary tensor data extension, as
``tritonclient.http`` sends and reads them.

A request is a JSON object, optionally followed by binary tensor data: then the
``Inference-Header-Content-Length`` header says where the JSON ends, and each input whose
``parameters`` carry ``binary_data_size`` takes that many bytes, in input order (BYTES
elements each prefixed by a little-endian uint32 length, BOOL one byte each, numbers
little-endian). Otherwise an input's ``data`` is a JSON list (nested or flat, row-major).
The body may be gzip- or deflate-compressed (``Content-Encoding``), as the client can send it.

A response output goes back as binary data when the request asked for it (the output's
``binary_data`` parameter, or the request's ``binary_data_output`` for outputs it did not
list), else as JSON ``data``; with any binary output the response carries
``Inference-Header-Content-Length`` and is ``application/octet-stream``, as Triton answers.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.utils import serialize_byte_tensor

from serving.kserve.contract import Tensor
from serving.kserve.errors import Code, TritonError, invalid
from serving.kserve.grpc_codec import NUMPY_TYPES, decode_raw
from serving.request_limits import BadBody, BodyTooLarge, check_json_body

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class InferCall:
    """A decoded ``/infer`` request."""

    tensors: dict[str, Tensor]
    parameters: dict[str, Any]
    request_id: str
    requested: list[str]
    # Output name -> whether it goes back as binary data; outputs not listed follow
    # ``binary_default``.
    binary: dict[str, bool] = field(default_factory=dict)
    binary_default: bool = False


def decompress(body: bytes, encoding: str | None, limit: int | None = None) -> bytes:
    """The body as sent before compression; with ``limit``, a body that inflates past it is
    refused (413) once that many bytes are out, so a small compressed body cannot make the
    server hold more than an uncompressed one could."""
    if not encoding or encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise invalid(f"unsupported Content-Encoding '{encoding}': only gzip and deflate are")
    # wbits: 16 + MAX_WBITS reads the gzip container, MAX_WBITS the zlib one (gzip.decompress
    # and zlib.decompress respectively).
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    cap = 0 if limit is None else limit + 1
    try:
        out = inflater.decompress(body, cap)
        if limit is not None and (len(out) > limit or inflater.unconsumed_tail):
            raise TritonError(Code.TOO_LARGE, str(BodyTooLarge(limit)) + " once decompressed")
        if not inflater.eof:
            raise invalid(f"failed to decompress the request body ({encoding}): truncated")
    except zlib.error as exc:
        raise invalid(f"failed to decompress the request body ({encoding}): {exc}") from None
    return out


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [value]


def _json_data(name: str, datatype: str, data: Any, count: int) -> np.ndarray:
    values = _flatten(data)
    if len(values) != count:
        raise invalid(
            f"unexpected number of elements {len(values)} for input '{name}', expecting {count}"
        )
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise invalid(f"input '{name}': BYTES data must be JSON strings")
        return np.array([v.encode("utf-8") for v in values] or [], dtype=np.object_)
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise invalid(f"input '{name}': BOOL data must be JSON booleans")
        return np.array(values, dtype=np.bool_)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise invalid(f"input '{name}': {datatype} data must be JSON numbers")
    try:
        return np.array(values, dtype=NUMPY_TYPES[datatype])
    except OverflowError:
        raise invalid(f"input '{name}': a value does not fit {datatype}") from None


def _binary_data(name: str, datatype: str, raw: bytes, count: int) -> np.ndarray:
    data = decode_raw(name, datatype, raw, count)
    if datatype != "BYTES":
        return data.copy()  # a writable array of its own, not a view of the request body
    if data.size != count:
        raise invalid(
            f"unexpected number of string elements {data.size} for input '{name}', "
            f"expecting {count}"
        )
    return data


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a JSON object")
    return value


def load_json(raw: bytes) -> Any:
    """A request's JSON, refused (INVALID_ARG) when it is not UTF-8, nests deeper than
    :data:`serving.request_limits.MAX_JSON_DEPTH` or does not parse."""
    try:
        text = check_json_body(raw)
    except BadBody as exc:
        raise invalid(str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc.msg}") from None


def parse_infer(body: bytes, header_length: str | None) -> InferCall:
    """Decode an ``/infer`` body; INVALID_ARG naming the field or tensor when it is wrong."""
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise invalid(f"{HEADER_LENGTH} must be an integer, got '{header_length}'") from None
        if not 0 <= length <= len(body):
            raise invalid(f"{HEADER_LENGTH} {length} is past the end of the request body")
        header, binary = body[:length], body[length:]
    else:
        header, binary = body, b""
    request = _object(load_json(header), "the request")
    inputs = request.get("inputs")
    if not isinstance(inputs, list):
        raise invalid("the request must have an 'inputs' array")
    tensors: dict[str, Tensor] = {}
    offset = 0
    for item in inputs:
        item = _object(item, "each input")
        name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
        if not isinstance(name, str):
            raise invalid("each input must have a string 'name'")
        if name in tensors:
            raise invalid(f"input '{name}' already exists in request")
        if datatype not in NUMPY_TYPES and datatype != "BYTES":
            raise invalid(f"invalid datatype '{datatype}' for input '{name}'")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise invalid(f"input '{name}': 'shape' must be a list of integers >= 0")
        count = math.prod(shape)
        parameters = _object(item.get("parameters"), f"input '{name}' parameters")
        size = parameters.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise invalid(
                    f"input '{name}': binary_data_size {size} is past the end of the binary data"
                )
            data = _binary_data(name, datatype, binary[offset : offset + size], count)
            offset += size
        elif "data" in item:
            data = _json_data(name, datatype, item["data"], count)
        else:
            raise invalid(f"input '{name}' has neither 'data' nor 'binary_data_size'")
        tensors[name] = Tensor(name, datatype, tuple(shape), data.reshape(shape))
    if offset != len(binary):
        raise invalid(f"{len(binary) - offset} byte(s) of binary data are not claimed by any input")
    parameters = _object(request.get("parameters"), "the request's 'parameters'")
    call = InferCall(
        tensors,
        {k: v for k, v in parameters.items() if k != "binary_data_output"},
        str(request.get("id", "")),
        [],
        binary_default=bool(parameters.get("binary_data_output", False)),
    )
    outputs = request.get("outputs") or []
    if not isinstance(outputs, list):
        raise invalid("'outputs' must be an array")
    for item in outputs:
        item = _object(item, "each output")
        name = item.get("name")
        if not isinstance(name, str):
            raise invalid("each output must have a string 'name'")
        out_parameters = _object(item.get("parameters"), f"output '{name}' parameters")
        if out_parameters.get("classification"):
            raise invalid(f"output '{name}': the classification extension is not supported")
        call.requested.append(name)
        call.binary[name] = bool(out_parameters.get("binary_data", False))
    return call


def _json_values(tensor: Tensor) -> list[Any]:
    flat = tensor.data.reshape(-1)
    if tensor.datatype == "BYTES":
        return [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in flat
        ]
    return [v.item() for v in flat]


def _raw(tensor: Tensor) -> bytes:
    if tensor.datatype == "BYTES":
        serialized = serialize_byte_tensor(tensor.data)
        return bytes(serialized.item()) if serialized.size else b""
    return np.ascontiguousarray(tensor.data).tobytes()


def infer_response(
    call: InferCall, model_name: str, version: str, outputs: list[Tensor]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows it."""
    body: dict[str, Any] = {"model_name": model_name, "model_version": version}
    if call.request_id:
        body["id"] = call.request_id
    described = []
    chunks = []
    for tensor in outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if call.binary.get(tensor.name, call.binary_default):
            raw = _raw(tensor)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_values(tensor)
        described.append(entry)
    body["outputs"] = described
    header = json.dumps(body).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
