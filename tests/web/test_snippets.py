"""The tritonclient programs the deployment page shows, for every Triton data type: the inputs
they build are accepted by tritonclient itself (HTTP and gRPC) with the declared wire datatype
and shape. (Calling a live model with them: tests/deployments/test_python_backend_rollout.py.)"""

from __future__ import annotations

import pytest

from portal.registry.validation import TRITON_DATA_TYPES
from portal.web.snippets import tritonclient_snippet, wire_datatype


def inputs_built_by(program: str) -> list:
    """Run the program up to (not including) its client and its call: what it sends."""
    kept = [
        line
        for line in program.splitlines()
        if not line.startswith(("client =", "result =", "print("))
    ]
    namespace: dict = {}
    exec(compile("\n".join(kept), "snippet", "exec"), namespace)
    return namespace["inputs"]


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
@pytest.mark.parametrize("data_type", sorted(TRITON_DATA_TYPES))
def test_every_data_type_gives_inputs_tritonclient_accepts(data_type, grpc):
    io_spec = {
        "max_batch_size": 4,
        "inputs": [
            {"name": "A", "data_type": data_type, "dims": [-1, 3]},
            {"name": "B", "data_type": "TYPE_STRING", "dims": [1]},
        ],
        "outputs": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}],
    }
    address = "127.0.0.1:8001" if grpc else "http://127.0.0.1:8080/models/t/m"
    program = tritonclient_snippet(io_spec, "t--m", address, grpc=grpc)
    first, second = inputs_built_by(program)
    assert (first.name(), first.datatype(), first.shape()) == (
        "A",
        wire_datatype(data_type),
        [1, 1, 3],
    )
    assert (second.name(), second.datatype(), second.shape()) == ("B", "BYTES", [1, 1])
    assert "print('OUT', result.as_numpy('OUT'))" in program


def test_an_https_gateway_is_called_with_ssl():
    io_spec = {
        "inputs": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        "outputs": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
    }
    program = tritonclient_snippet(io_spec, "t--m", "https://gw.example/models/t/m")
    assert "InferenceServerClient('gw.example/models/t/m', ssl=True)" in program
    [x] = inputs_built_by(program)
    assert x.shape() == [2]  # no batch dimension: the model does not batch
