"""The tritonclient programs the deployment page shows, for every Triton data type: the inputs
they build are accepted by tritonclient itself (HTTP and gRPC) with the declared wire datatype
and shape. (Calling a live model with them: tests/deployments/test_python_backend_rollout.py.)"""

from __future__ import annotations

import pytest

from portal.registry.validation import TRITON_DATA_TYPES
from portal.web.snippets import API_KEY_ENV, tritonclient_snippet, wire_datatype

#: What a caller exported, as the caller keys page tells them to.
CALLER_KEY = "mlk_0123abcd_not-a-real-secret"


@pytest.fixture(autouse=True)
def _caller_key(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, CALLER_KEY)


def run_without_calling(program: str) -> dict:
    """Run the program up to (not including) its client and its call: what it would send."""
    kept = [
        line
        for line in program.splitlines()
        if not line.startswith(("client =", "result =", "print("))
    ]
    namespace: dict = {}
    exec(compile("\n".join(kept), "snippet", "exec"), namespace)
    return namespace


def inputs_built_by(program: str) -> list:
    return run_without_calling(program)["inputs"]


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


def test_the_http_program_sends_the_caller_key_from_the_environment_and_grpc_none():
    """The HTTP program goes through the gateway, which checks caller keys; the gRPC one calls
    an instance directly. The key is read from the environment, never written into the code."""
    io_spec = {
        "inputs": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        "outputs": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
    }
    http = tritonclient_snippet(io_spec, "t--m", "http://127.0.0.1:8080/models/t/m")
    assert run_without_calling(http)["headers"] == {"Authorization": f"Bearer {CALLER_KEY}"}
    assert "client.infer('t--m', inputs, headers=headers)" in http
    assert CALLER_KEY not in http
    grpc = tritonclient_snippet(io_spec, "t--m", "127.0.0.1:8001", grpc=True)
    assert "headers" not in run_without_calling(grpc) and API_KEY_ENV not in grpc
