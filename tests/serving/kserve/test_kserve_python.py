"""Python-backend models served by the real ``python -m serving.kserve`` process beside a
vLLM-backend model, called with ``tritonclient`` over gRPC and HTTP as Triton answers them;
and Triton's own python_backend examples run with their ``client.py`` as written."""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from serving.kserve.triton_metrics import merge_families
from serving.package import archive_bytes
from tests.serving.conftest import MODEL_NAME, write_repository
from tests.serving.instance_helpers import Instance, manifest
from tests.serving.kserve_helpers import (
    KServeProcess,
    generate_inputs,
    is_final,
    launch,
    start_kserve,
    text_of,
)
from tests.serving.python_backend.helpers import MODELS, PEERS

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

PYTHON_MODELS = ("repeat", "bls_caller", "bls_mixed", "faulty", "observed")


def copy_model(source: Path, root: Path, name: str | None = None) -> None:
    """A model directory into the repository (``name`` renames it, config too)."""
    target = root / (name or source.name)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("client.py", "__pycache__"))
    if name is not None:
        config = target / "config.pbtxt"
        config.write_text(re.sub(r'name: "[^"]*"', f'name: "{name}"', config.read_text(), count=1))


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model_dir) -> Any:
    root = tmp_path_factory.mktemp("python-repository")
    write_repository(root, demo_model_dir)
    copy_model(PEERS / "add_sub", root)
    copy_model(PEERS / "pytorch", root)
    for name in PYTHON_MODELS:
        copy_model(MODELS / name, root)
    copy_model(MODELS / "faulty", root, "crashy")
    server = start_kserve(root, tmp_path_factory.mktemp("python-serving"))
    yield server
    assert server.stop() == 0


@pytest.fixture
def grpc_client(server: KServeProcess) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture
def http_client(server: KServeProcess) -> Any:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


def add_sub_inputs(module: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [
        module.InferInput("INPUT0", list(a.shape), "FP32"),
        module.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def int_input(module: Any, name: str, values: list[int]) -> Any:
    tensor = module.InferInput(name, [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return tensor


def metrics_text(server: KServeProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics") as response:
        return response.read().decode()


def sample(text: str, family: str, **labels: str) -> float:
    """One sample's value (prometheus-client's parser names counter samples ``*_total``)."""
    for found in text_string_to_metric_families(text):
        for s in found.samples:
            named = s.name in (family, f"{family}_total")
            if named and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {family} {labels}")


@pytest.mark.parametrize("example", ["add_sub", "pytorch"])
def test_triton_examples_client_py_as_written(server, tmp_path, example: str) -> None:
    """``client.py`` unchanged but for the server address (it hard-codes localhost:8000)."""
    source = (PEERS / example / "client.py").read_text()
    assert source.count('"localhost:8000"') == 1
    client = tmp_path / "client.py"
    client.write_text(source.replace('"localhost:8000"', f'"{server.http_url}"'))
    done = subprocess.run(
        [sys.executable, str(client)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"PASS: {example}" in done.stdout


def test_the_repository_serves_vllm_and_python_models_together(grpc_client) -> None:
    index = {
        row["name"]: row for row in grpc_client.get_model_repository_index(as_json=True)["models"]
    }
    served = {MODEL_NAME, "add_sub", "pytorch", "crashy", *PYTHON_MODELS}
    assert set(index) == served and all(r["state"] == "READY" for r in index.values())
    assert grpc_client.is_server_ready()
    responses: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    grpc_client.async_stream_infer(
        MODEL_NAME, generate_inputs("hi", {"max_tokens": 3, "temperature": 0})
    )
    result, error = responses.get(timeout=120)
    grpc_client.stop_stream()
    assert error is None and is_final(result) and text_of(result)


def test_infer_over_grpc_and_http(grpc_client, http_client) -> None:
    a = np.random.rand(4).astype(np.float32)
    b = np.random.rand(4).astype(np.float32)
    result = grpc_client.infer("add_sub", add_sub_inputs(grpcclient, a, b), request_id="7")
    assert result.get_response().id == "7" and result.get_response().model_version == "1"
    assert np.allclose(result.as_numpy("OUTPUT0"), a + b)
    assert np.allclose(result.as_numpy("OUTPUT1"), a - b)
    # HTTP: JSON tensors in, one output requested as JSON, the other as binary.
    inputs = add_sub_inputs(httpclient, a, b)
    for tensor in inputs:
        tensor.set_data_from_numpy(tensor_data := (a if tensor.name() == "INPUT0" else b), False)
        assert tensor_data is not None
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
    ]
    answer = http_client.infer("add_sub", inputs, outputs=outputs)
    assert np.allclose(answer.as_numpy("OUTPUT0"), a + b)
    assert np.allclose(answer.as_numpy("OUTPUT1"), a - b)
    only = http_client.infer(
        "add_sub",
        add_sub_inputs(httpclient, a, b),
        outputs=[httpclient.InferRequestedOutput("OUTPUT1")],
        model_version="1",
    )
    assert only.as_numpy("OUTPUT0") is None and np.allclose(only.as_numpy("OUTPUT1"), a - b)
    for algorithm in ("gzip", "deflate"):  # compressed request bodies, as the client sends them
        packed = http_client.infer(
            "add_sub", add_sub_inputs(httpclient, a, b), request_compression_algorithm=algorithm
        )
        assert np.allclose(packed.as_numpy("OUTPUT0"), a + b)


def test_the_generate_extension_serves_python_models(server) -> None:
    """Triton's ``/generate``: inputs by name from the JSON body, outputs by name back."""
    body = {"INPUT0": [1.5, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "id": "g"}
    url = f"http://{server.http_url}/v2/models/add_sub/generate"
    answer = httpx.post(url, json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["OUTPUT0"] == [2.5, 3, 4, 5] and answer.json()["id"] == "g"
    wrong = httpx.post(url, json={**body, "INPUT0": [1, 2]}, timeout=30)
    assert wrong.status_code == 400 and "'INPUT0'" in wrong.json()["error"]


def test_metadata_and_config_are_the_auto_completed_ones(grpc_client, http_client) -> None:
    meta = http_client.get_model_metadata("add_sub")
    assert meta["platform"] == "python" and meta["versions"] == ["1"]
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4]},
    ]
    assert grpc_client.get_model_metadata("add_sub", as_json=True)["inputs"][0]["name"] == "INPUT0"
    config = grpc_client.get_model_config("add_sub", as_json=True)["config"]
    assert config["backend"] == "python"
    assert config["instance_group"][0]["name"] == "add_sub_0"
    assert http_client.get_model_config("repeat")["model_transaction_policy"]["decoupled"]
    assert http_client.is_model_ready("add_sub") and grpc_client.is_model_ready("repeat")


def test_wrong_shape_or_datatype_is_refused_naming_the_tensor(grpc_client, http_client) -> None:
    a = np.random.rand(5).astype(np.float32)
    with pytest.raises(InferenceServerException) as refused:
        grpc_client.infer("add_sub", add_sub_inputs(grpcclient, a, a))
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'INPUT0'" in refused.value.message() and "shape" in refused.value.message()
    ints = np.arange(4, dtype=np.int32)
    inputs = [int_input(httpclient, "INPUT0", list(ints)), *add_sub_inputs(httpclient, a, a)[1:]]
    inputs[1] = httpclient.InferInput("INPUT1", [4], "FP32")
    inputs[1].set_data_from_numpy(np.ones(4, np.float32))
    with pytest.raises(InferenceServerException) as wrong_type:
        http_client.infer("add_sub", inputs)
    assert wrong_type.value.status() == "400"
    assert "'INPUT0'" in wrong_type.value.message() and "FP32" in wrong_type.value.message()


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (b"{not json", {}, "failed to parse the request JSON"),
        (b'{"inputs": 3}', {}, "'inputs' array"),
        (
            b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], '
            b'"parameters": {"binary_data_size": 16}}]}',
            {"Inference-Header-Content-Length": "<the whole body>"},
            "past the end",
        ),
        (
            b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2]}]}',
            {},
            "'INPUT0'",
        ),
        (b"{}", {"Content-Encoding": "br"}, "Content-Encoding"),
    ],
)
def test_malformed_http_infer_bodies_are_400_naming_the_field(
    server, body: bytes, headers: dict[str, str], message: str
) -> None:
    url = f"http://{server.http_url}/v2/models/add_sub/infer"
    if "Inference-Header-Content-Length" in headers:  # JSON only: the binary data is missing
        headers = {**headers, "Inference-Header-Content-Length": str(len(body))}
    response = httpx.post(url, content=body, headers=headers, timeout=30)
    assert response.status_code == 400
    assert message in response.json()["error"]


def test_a_decoupled_model_streams_and_refuses_unary_calls(grpc_client, http_client) -> None:
    responses: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    grpc_client.async_stream_infer("repeat", [int_input(grpcclient, "IN", [7, 8, 9])])
    got = [responses.get(timeout=60) for _ in range(3)]
    assert [int(r.as_numpy("OUT")[0]) for r, e in got if e is None] == [7, 8, 9]
    # With triton_enable_empty_final_response the flag-only final response comes too.
    grpc_client.async_stream_infer(
        "repeat", [int_input(grpcclient, "IN", [1])], enable_empty_final_response=True
    )
    first, last = responses.get(timeout=60), responses.get(timeout=60)
    grpc_client.stop_stream()
    assert int(first[0].as_numpy("OUT")[0]) == 1 and not is_final(first[0])
    assert is_final(last[0]) and last[0].as_numpy("OUT") is None
    with pytest.raises(InferenceServerException) as unary:
        grpc_client.infer("repeat", [int_input(grpcclient, "IN", [1])])
    assert unary.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as http:
        http_client.infer("repeat", [int_input(httpclient, "IN", [1])])
    assert http.value.status() == "501"


def test_a_default_model_answers_on_a_stream_too(grpc_client) -> None:
    a = np.ones(4, np.float32)
    responses: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    grpc_client.async_stream_infer("add_sub", add_sub_inputs(grpcclient, a, a))
    result, error = responses.get(timeout=60)
    grpc_client.stop_stream()
    assert error is None and is_final(result)
    assert np.allclose(result.as_numpy("OUTPUT0"), 2 * a)


def test_bls_reaches_the_other_models_of_the_server(http_client, server) -> None:
    before = sample(metrics_text(server), "nv_inference_request_success", model="add_sub")
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([4, 3, 2, 1], np.float32)
    inputs = [httpclient.InferInput("A", [4], "FP32"), httpclient.InferInput("B", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = http_client.infer("bls_caller", inputs)
    assert np.allclose(result.as_numpy("SUM"), a + b)
    assert np.allclose(result.as_numpy("DIFF"), a - b)
    assert list(result.as_numpy("REPEATED")) == [7, 8, 9]  # a decoupled callee
    missing = result.as_numpy("MISSING")[0].decode()
    assert "not_served" in missing
    after = sample(metrics_text(server), "nv_inference_request_success", model="add_sub")
    assert after == before + 2  # the two BLS calls count for the callee, as in Triton


def test_bls_to_a_vllm_model_and_a_plain_exec_to_a_decoupled_one(grpc_client) -> None:
    prompt = grpcclient.InferInput("PROMPT", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"hello"], dtype=object))
    result = grpc_client.infer("bls_mixed", [prompt], parameters={"target": MODEL_NAME})
    direct: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: direct.put((result, error)))
    grpc_client.async_stream_infer(
        MODEL_NAME, generate_inputs("hello", {"max_tokens": 3, "temperature": 0})
    )
    expected, error = direct.get(timeout=120)
    grpc_client.stop_stream()
    assert error is None
    assert result.as_numpy("TEXT")[0].decode() == text_of(expected)  # greedy: the same text
    refusal = result.as_numpy("REFUSAL")[0].decode()
    assert "repeat" in refusal and "decoupled=True" in refusal


def test_custom_metrics_and_nv_inference_counts_on_the_metrics_port(grpc_client, server) -> None:
    tensor = grpcclient.InferInput("X", [1], "FP64")
    tensor.set_data_from_numpy(np.array([5.0]))
    for _ in range(2):
        grpc_client.infer("observed", [tensor], parameters={"p": "v"})
    text = metrics_text(server)
    families = {f.name for f in text_string_to_metric_families(text)}  # a valid exposition
    assert text.count("# TYPE observed_requests ") == 1
    assert {
        "observed_requests",
        "observed_last_value",
        "observed_x",
        "repeat_cancelled",
    } <= families
    assert sample(text, "observed_requests", model="observed", version="1") == 2
    assert sample(text, "observed_last_value", model="observed") == 5.0
    assert sample(text, "observed_x_bucket", model="observed", le="10.0") == 2
    assert sample(text, "nv_inference_request_success", model="observed", version="1") == 2
    assert sample(text, "nv_inference_exec_count", model="observed", version="1") == 2
    assert sample(text, "nv_inference_count", model="observed", version="1") == 2
    stats = grpc_client.get_inference_statistics("observed", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 2


def test_an_execute_that_raises_is_an_error_with_tritons_code(grpc_client, http_client) -> None:
    with pytest.raises(InferenceServerException) as raised:
        grpc_client.infer("faulty", [int_input(grpcclient, "MODE", [1])])
    assert raised.value.status() == "StatusCode.INTERNAL"
    assert "mode 1 is not allowed" in raised.value.message()
    with pytest.raises(InferenceServerException) as http:
        http_client.infer("faulty", [int_input(httpclient, "MODE", [1])])
    assert http.value.status() == "500" and "ValueError" in http.value.message()
    with pytest.raises(InferenceServerException) as not_found:  # TritonError(NOT_FOUND)
        http_client.infer("faulty", [int_input(httpclient, "MODE", [2])])
    assert not_found.value.status() == "404" and "no such thing" in not_found.value.message()
    ok = grpc_client.infer("faulty", [int_input(grpcclient, "MODE", [0])])
    assert int(ok.as_numpy("OUT")[0]) == 0  # the model keeps serving


def test_a_crashing_model_is_reported_and_the_others_keep_serving(grpc_client, http_client) -> None:
    """Last in the module: the server stays up without ``crashy`` (strict readiness false)."""
    with pytest.raises(InferenceServerException) as crashed:
        grpc_client.infer("crashy", [int_input(grpcclient, "MODE", [3])])
    assert crashed.value.status() == "StatusCode.INTERNAL"
    assert "exited with code 3" in crashed.value.message()
    assert not grpc_client.is_model_ready("crashy") and not http_client.is_model_ready("crashy")
    with pytest.raises(InferenceServerException) as after:
        http_client.infer("crashy", [int_input(httpclient, "MODE", [0])])
    assert after.value.status() == "503" and "not ready" in after.value.message()
    row = next(r for r in http_client.get_model_repository_index() if r["name"] == "crashy")
    assert row["state"] == "UNAVAILABLE" and "exited with code 3" in row["reason"]
    assert not http_client.is_server_ready()  # Triton's strict readiness
    a = np.ones(4, np.float32)
    result = http_client.infer("add_sub", add_sub_inputs(httpclient, a, a))
    assert np.allclose(result.as_numpy("OUTPUT0"), 2 * a)
    assert grpc_client.is_model_ready("faulty")


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bad_import", "a_module_that_does_not_exist"),
        ("no_class", "TritonPythonModel"),
        ("init_raises", "weights are missing"),
    ],
)
def test_a_python_model_that_cannot_load_stops_the_start(tmp_path, model: str, reason: str) -> None:
    root = tmp_path / "repo"
    copy_model(PEERS / "add_sub", root)
    copy_model(MODELS / model, root)
    proc = launch(root, tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "KSERVE READY" not in out
    log = (tmp_path / "kserve.log").read_text()
    assert "model failed to load, not serving" in log and reason in log


def test_a_python_model_without_model_py_is_refused_before_loading(tmp_path) -> None:
    root = tmp_path / "repo"
    copy_model(PEERS / "add_sub", root)
    (root / "add_sub" / "1" / "model.py").unlink()
    proc = launch(root, tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "KSERVE READY" not in out
    assert "model.py" in (tmp_path / "kserve.log").read_text()


def test_explicit_model_control_loads_and_unloads_python_models(tmp_path) -> None:
    root = tmp_path / "repo"
    copy_model(PEERS / "add_sub", root)
    copy_model(MODELS / "init_raises", root)
    server = start_kserve(root, tmp_path, "--model-control-mode=explicit")
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert not client.is_model_ready("add_sub")
        client.load_model("add_sub")
        a = np.ones(4, np.float32)
        result = client.infer("add_sub", add_sub_inputs(grpcclient, a, a))
        assert np.allclose(result.as_numpy("OUTPUT1"), 0 * a)
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("init_raises")
        assert failed.value.status() == "StatusCode.INTERNAL"
        assert "failed to load 'init_raises'" in failed.value.message()
        client.unload_model("add_sub")
        assert not client.is_model_ready("add_sub")
        index = {r["name"]: r for r in client.get_model_repository_index(as_json=True)["models"]}
        assert index["add_sub"]["state"] == "UNAVAILABLE"
        assert index["init_raises"]["state"] == "UNAVAILABLE"
        client.close()
    finally:
        assert server.stop() == 0


def test_a_python_backend_package_runs_on_a_cpu_instance(tmp_path) -> None:
    """The supervisor starts the CPU engine for a Python-backend package laid out as the portal
    packages one (a ``specific`` version policy); ``api_surface: grpc`` leaves the front end
    with health and the unified ``/metrics`` only."""
    name = "demo--add-sub"
    config = (PEERS / "add_sub" / "config.pbtxt").read_text()
    config = config.replace('name: "add_sub"', f'name: "{name}"')
    config += "\nversion_policy { specific { versions: 3 } }\n"
    files = {
        f"{name}/config.pbtxt": config.encode(),
        f"{name}/3/model.py": (PEERS / "add_sub" / "1" / "model.py").read_bytes(),
    }
    meta = manifest(
        files, name, tmp_path, backend="python", api_surface="grpc", constraint_plugins=[]
    )
    package = tmp_path / "pkg.tar"
    package.write_bytes(archive_bytes(files, meta))
    instance = Instance(package, tmp_path / "work")
    try:
        ports = instance.wait_ready(240)
        base = f"http://127.0.0.1:{ports['openai']}"
        assert instance.step("start_frontend")["openai"] is False
        assert httpx.get(f"{base}/health/ready").status_code == 200
        assert httpx.get(f"{base}/v1/models").status_code == 404
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        a = np.ones(4, np.float32)
        result = client.infer(name, add_sub_inputs(grpcclient, a, a))
        assert np.allclose(result.as_numpy("OUTPUT0"), 2 * a)
        assert client.get_model_metadata(name, as_json=True)["versions"] == ["3"]
        client.close()
        text = httpx.get(f"{base}/metrics", timeout=10).text
        assert sample(text, "nv_inference_request_success", model=name, version="3") == 1
        assert instance.stop() == 0
    finally:
        if instance.proc.poll() is None:
            instance.stop()


def test_families_two_models_share_are_merged_once() -> None:
    first = '# HELP shared a\n# TYPE shared counter\nshared{model="a"} 1.0\n'
    second = '# HELP shared b\n# TYPE shared counter\nshared{model="b"} 2.0\n'
    merged = merge_families([first, second, ""])
    assert merged.count("# TYPE shared") == 1 and merged.count("# HELP shared") == 1
    (family,) = text_string_to_metric_families(merged)
    assert sorted(s.value for s in family.samples) == [1.0, 2.0]
