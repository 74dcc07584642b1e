"""``tritonclient`` snippets for a KServe v2 model, written from the version's real I/O spec.

Each snippet is a complete program: sample inputs of the declared names, wire datatypes and
shapes (a variable dimension as 1, a leading batch dimension of 1 when the model batches), one
``infer`` call, and every declared output printed. The deployments' integration test runs
them against a live deployment, so what the page shows is known to work.

The HTTP program goes through the gateway, which wants a caller key: it reads it from the
environment variable :data:`API_KEY_ENV` (a key pasted into a program ends up in its history).
The gRPC one calls an instance directly, which the gateway does not stand in front of.
"""

from __future__ import annotations

from typing import Any

from portal.deployments.models import Deployment
from portal.deployments.traffic.routing import call_endpoints
from portal.registry.packaging import triton_model_name

#: Where the programs the pages show read the caller key from.
API_KEY_ENV = "MODEL_API_KEY"
#: Sample values per config data type: the numpy expression ``np.full`` fills the shape with.
_SAMPLE_TEXT = "The quick brown fox jumps over the lazy dog."
_NUMPY_DTYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "np.uint8",
    "TYPE_UINT16": "np.uint16",
    "TYPE_UINT32": "np.uint32",
    "TYPE_UINT64": "np.uint64",
    "TYPE_INT8": "np.int8",
    "TYPE_INT16": "np.int16",
    "TYPE_INT32": "np.int32",
    "TYPE_INT64": "np.int64",
    "TYPE_FP16": "np.float16",
    "TYPE_FP32": "np.float32",
    "TYPE_FP64": "np.float64",
    # tritonclient (r26.06 on) takes BF16 only as ml_dtypes.bfloat16 arrays; ml_dtypes is one
    # of its own dependencies.
    "TYPE_BF16": "ml_dtypes.bfloat16",
    "TYPE_STRING": "object",
}


def wire_datatype(data_type: str) -> str:
    """A config data type (``TYPE_FP32``) as KServe v2 names it on the wire (``FP32``);
    ``TYPE_STRING`` is ``BYTES``."""
    name = data_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def sample_shape(io_spec: dict[str, Any], dims: list[int]) -> list[int]:
    shape = [1 if d == -1 else d for d in dims]
    return [1, *shape] if io_spec.get("max_batch_size", 0) > 0 else shape


def _sample(tensor: dict[str, Any], shape: list[int]) -> str:
    data_type = tensor["data_type"]
    dtype = _NUMPY_DTYPES.get(data_type, "np.float32")
    fill = repr(_SAMPLE_TEXT) if data_type == "TYPE_STRING" else "1"
    if data_type == "TYPE_BOOL":
        fill = "True"
    return f"np.full({shape}, {fill}, dtype={dtype})"


def tritonclient_snippet(
    io_spec: dict[str, Any], model_name: str, url: str, *, grpc: bool = False
) -> str:
    """The program calling ``model_name`` at ``url`` (an ``http(s)://`` base for HTTP, a
    ``host:port`` for gRPC) with sample inputs built from ``io_spec``."""
    module, alias = (
        ("tritonclient.grpc", "grpcclient") if grpc else ("tritonclient.http", "httpclient")
    )
    address = url
    ssl = False
    if not grpc:
        ssl = url.startswith("https://")
        address = url.removeprefix("https://").removeprefix("http://")
    bf16 = any(t["data_type"] == "TYPE_BF16" for t in io_spec["inputs"])
    lines = [
        *(["import ml_dtypes"] if bf16 else []),
        *([] if grpc else ["import os", ""]),
        "import numpy as np",
        f"import {module} as {alias}",
        "",
        f"client = {alias}.InferenceServerClient({address!r}{', ssl=True' if ssl else ''})",
        "inputs = []",
    ]
    for tensor in io_spec["inputs"]:
        shape = sample_shape(io_spec, tensor["dims"])
        lines += [
            f"tensor = {alias}.InferInput("
            f"{tensor['name']!r}, {shape}, {wire_datatype(tensor['data_type'])!r})",
            f"tensor.set_data_from_numpy({_sample(tensor, shape)})",
            "inputs.append(tensor)",
        ]
    if grpc:
        lines.append(f"result = client.infer({model_name!r}, inputs)")
    else:
        lines += [
            f'headers = {{"Authorization": f"Bearer {{os.environ[{API_KEY_ENV!r}]}}"}}',
            f"result = client.infer({model_name!r}, inputs, headers=headers)",
        ]
    lines += [f"print({t['name']!r}, result.as_numpy({t['name']!r}))" for t in io_spec["outputs"]]
    return "\n".join(lines) + "\n"


def call_context(deployment: Deployment) -> dict:
    """How to call the deployment: its OpenAI base URL when the version serves OpenAI routes,
    else its KServe v2 endpoints and tritonclient programs written from the version's I/O
    spec (a vLLM version without OpenAI routes has no I/O spec: only its endpoints show)."""
    endpoints = call_endpoints(deployment)
    version = deployment.target_version
    context: dict[str, Any] = {"kserve": endpoints, "openai": endpoints.openai is not None}
    if endpoints.openai is None and version.io_spec.get("inputs"):
        name = triton_model_name(version)
        grpc_address = endpoints.kserve_grpc[0] if endpoints.kserve_grpc else "INSTANCE_HOST:8001"
        context["snippet_http"] = tritonclient_snippet(version.io_spec, name, endpoints.kserve_http)
        context["snippet_grpc"] = tritonclient_snippet(
            version.io_spec, name, grpc_address, grpc=True
        )
    return context
