"""Triton's model control with ``--model-control-mode=explicit``: load, unload and the
repository index over gRPC and HTTP, against the real ``tritonclient``, as Triton answers."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serving.kserve.__main__ import main
from tests.serving.conftest import MODEL_NAME, write_repository
from tests.serving.kserve.test_kserve import one
from tests.serving.kserve_helpers import (
    KServeProcess,
    generate_inputs,
    is_final,
    start_kserve,
    text_of,
)

SECOND = "second"
BROKEN = "broken"  # model.json with an engine argument the CPU engine refuses


@pytest.fixture(scope="module")
def explicit(tmp_path_factory, demo_model_dir) -> Any:
    root = tmp_path_factory.mktemp("explicit-repository")
    write_repository(root, demo_model_dir)
    write_repository(root, demo_model_dir, name=SECOND)
    write_repository(root, demo_model_dir, name=BROKEN)
    args_path = root / BROKEN / "1" / "model.json"
    args_path.write_text(json.dumps({**json.loads(args_path.read_text()), "no_such_arg": 1}))
    server = start_kserve(
        root,
        tmp_path_factory.mktemp("explicit"),
        "--model-control-mode=explicit",
        f"--load-model={MODEL_NAME}",
    )
    yield server
    assert server.stop() == 0


@pytest.fixture
def grpc_client(explicit: KServeProcess) -> Any:
    client = grpcclient.InferenceServerClient(explicit.grpc_url)
    yield client
    client.close()


@pytest.fixture
def http_client(explicit: KServeProcess) -> Any:
    client = httpclient.InferenceServerClient(explicit.http_url)
    yield client
    client.close()


def index_of(client: Any) -> dict[str, dict[str, str]]:
    if isinstance(client, grpcclient.InferenceServerClient):
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    else:
        rows = client.get_model_repository_index()
    return {row["name"]: row for row in rows}


def test_only_the_named_model_loads_at_start_and_the_index_lists_every_model(
    grpc_client, http_client
) -> None:
    assert grpc_client.is_model_ready(MODEL_NAME)
    assert not grpc_client.is_model_ready(SECOND)
    index = index_of(grpc_client)
    assert index[MODEL_NAME] == {"name": MODEL_NAME, "version": "1", "state": "READY"}
    assert index[SECOND] == {"name": SECOND}  # in the repository, never loaded
    assert index_of(http_client) == index


def test_load_serve_unload_over_grpc_and_http(grpc_client, http_client) -> None:
    for loader in (grpc_client, http_client):
        loader.load_model(SECOND)
        assert grpc_client.is_model_ready(SECOND) and http_client.is_model_ready(SECOND)
        inputs = generate_inputs("Hello", {"temperature": "0", "max_tokens": "3"})
        [result] = one_for(grpc_client, SECOND, inputs)
        assert text_of(result)
        loader.load_model(SECOND)  # loading a served model again leaves it as it is
        loader.unload_model(SECOND)
        assert not grpc_client.is_model_ready(SECOND)
        assert index_of(grpc_client)[SECOND]["state"] == "UNAVAILABLE"
        assert index_of(grpc_client)[SECOND]["reason"] == "unloaded"
        message = one_error_for(grpc_client, SECOND, inputs)
        assert f"'{SECOND}'" in message
    # The model loaded at start is untouched throughout.
    [result] = one(grpc_client, generate_inputs("Hello", {"max_tokens": 2}))
    assert text_of(result)


def test_a_model_that_cannot_load_fails_with_the_reason(grpc_client, http_client) -> None:
    for client in (grpc_client, http_client):
        with pytest.raises(InferenceServerException, match=f"failed to load '{BROKEN}'") as info:
            client.load_model(BROKEN)
        assert "no_such_arg" in str(info.value)
        assert not client.is_model_ready(BROKEN)
    row = index_of(grpc_client)[BROKEN]
    assert row["state"] == "UNAVAILABLE" and "no_such_arg" in row["reason"]
    with pytest.raises(InferenceServerException, match="failed to load 'missing'"):
        grpc_client.load_model("missing")


def test_load_overrides_are_refused_not_ignored(grpc_client) -> None:
    with pytest.raises(InferenceServerException, match="not supported"):
        grpc_client.load_model(SECOND, config=json.dumps({"backend": "vllm"}))
    assert not grpc_client.is_model_ready(SECOND)


def one_for(client: Any, model: str, inputs: list[Any]) -> list[Any]:
    return _stream(client, model, inputs, expect_error=False)


def one_error_for(client: Any, model: str, inputs: list[Any]) -> str:
    return _stream(client, model, inputs, expect_error=True)


def _stream(client: Any, model: str, inputs: list[Any], *, expect_error: bool) -> Any:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, request_id="r")
        collected = []
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                assert expect_error, str(error)
                return str(error)
            collected.append(result)
            if is_final(result):
                assert not expect_error, "expected an error response"
                return collected
    finally:
        client.stop_stream()


def test_the_repository_must_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert main([f"--model-repository={missing}", "--model-control-mode=explicit"]) == 2
