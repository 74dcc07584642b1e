"""The KServe v2 server against the real ``tritonclient`` (gRPC, gRPC aio, HTTP), as Triton with
the vLLM backend would answer it. One server process (the demo model) serves the module."""

from __future__ import annotations

import asyncio
import json
import queue
import time
from collections import defaultdict
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from tests.serving.conftest import MODEL_NAME
from tests.serving.kserve_helpers import (
    KServeProcess,
    bool_input,
    bytes_input,
    count_of,
    generate_inputs,
    is_final,
    start_kserve,
    text_of,
)

GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def kserve(model_repository, tmp_path_factory) -> Any:
    server = start_kserve(model_repository, tmp_path_factory.mktemp("kserve"))
    yield server
    assert server.stop() == 0


@pytest.fixture
def grpc_client(kserve: KServeProcess) -> Any:
    client = grpcclient.InferenceServerClient(kserve.grpc_url)
    yield client
    client.close()


@pytest.fixture
def http_client(kserve: KServeProcess) -> Any:
    client = httpclient.InferenceServerClient(kserve.http_url)
    yield client
    client.close()


def stream_requests(
    client: grpcclient.InferenceServerClient, requests: list[tuple[str, list[Any]]], **kwargs: Any
) -> dict[str, list[Any]]:
    """Send ``(request_id, inputs)`` on one stream; every result (or error) by request ID, in
    arrival order, until each request got its final response."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id, inputs in requests:
            client.async_stream_infer(MODEL_NAME, inputs, request_id=request_id, **kwargs)
        by_id: dict[str, list[Any]] = defaultdict(list)
        pending = {request_id for request_id, _ in requests}
        while pending:
            result, error = results.get(timeout=120)
            if error is not None:
                by_id["errors"].append(error)
                pending.discard(next(iter(sorted(pending))))  # errors name no request on the wire
                continue
            request_id = result.get_response().id
            by_id[request_id].append(result)
            if is_final(result):
                pending.discard(request_id)
        return by_id
    finally:
        client.stop_stream()


def one(client: grpcclient.InferenceServerClient, inputs: list[Any]) -> list[Any]:
    responses = stream_requests(client, [("r", inputs)])
    assert "errors" not in responses, responses["errors"]
    return responses["r"]


def one_error(client: grpcclient.InferenceServerClient, inputs: list[Any]) -> str:
    responses = stream_requests(client, [("r", inputs)])
    assert responses["errors"], "expected an error response"
    return str(responses["errors"][0])


def metric_samples(kserve: KServeProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{kserve.metrics}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


# --- health, metadata, configuration ----------------------------------------------------------


def test_health_over_grpc_and_http(grpc_client, http_client, kserve) -> None:
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    assert grpc_client.is_model_ready(MODEL_NAME)
    assert grpc_client.is_model_ready(MODEL_NAME, "1")
    assert not grpc_client.is_model_ready("no-such-model")
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert http_client.is_model_ready(MODEL_NAME)
    assert not http_client.is_model_ready("no-such-model")
    missing = httpx.get(f"http://{kserve.http_url}/v2/models/no-such-model/ready")
    assert missing.status_code == 400
    assert missing.json() == {"error": "Model version not ready"}


def test_server_and_model_metadata(grpc_client, http_client) -> None:
    server = grpc_client.get_server_metadata(as_json=True)
    assert server["name"] == "triton" and "statistics" in server["extensions"]
    assert http_client.get_server_metadata()["name"] == "triton"
    for meta in (
        grpc_client.get_model_metadata(MODEL_NAME, as_json=True),
        http_client.get_model_metadata(MODEL_NAME),
    ):
        assert meta["name"] == MODEL_NAME and meta["versions"] == ["1"]
        assert meta["platform"] == "vllm"
        inputs = {i["name"]: (i["datatype"], [int(d) for d in i["shape"]]) for i in meta["inputs"]}
        assert inputs["text_input"] == ("BYTES", [1])
        assert inputs["sampling_parameters"] == ("BYTES", [1])
        assert inputs["stream"] == ("BOOL", [1])
        assert inputs["image"] == ("BYTES", [-1])
        assert inputs["embedding_request"] == ("BYTES", [1])
        outputs = {
            o["name"]: (o["datatype"], [int(d) for d in o["shape"]]) for o in meta["outputs"]
        }
        assert outputs == {
            "text_output": ("BYTES", [-1]),
            "finish_reason": ("BYTES", [-1]),
            "cumulative_logprob": ("FP32", [-1]),
            "logprobs": ("BYTES", [-1]),
            "num_input_tokens": ("UINT32", [1]),
            "num_output_tokens": ("UINT32", [-1]),
        }
    with pytest.raises(InferenceServerException, match="unknown model: 'nope'"):
        grpc_client.get_model_metadata("nope")
    with pytest.raises(InferenceServerException, match="version 7 is not found"):
        http_client.get_model_metadata(MODEL_NAME, "7")


def test_model_config_is_the_auto_completed_vllm_config(grpc_client, http_client) -> None:
    config = grpc_client.get_model_config(MODEL_NAME).config
    assert isinstance(config, mc.ModelConfig)
    assert config.name == MODEL_NAME and config.backend == "vllm"
    assert config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_MODEL
    text_input = next(i for i in config.input if i.name == "text_input")
    assert text_input.data_type == mc.TYPE_STRING and list(text_input.dims) == [1]
    assert not text_input.optional
    assert all(i.optional for i in config.input if i.name != "text_input")
    as_json = http_client.get_model_config(MODEL_NAME)
    assert as_json["model_transaction_policy"] == {"decoupled": True}
    assert as_json["backend"] == "vllm"
    assert [o["name"] for o in as_json["output"]][:2] == ["text_output", "finish_reason"]


def test_repository_index(grpc_client, http_client) -> None:
    index = grpc_client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": MODEL_NAME, "version": "1", "state": "READY"}]
    assert http_client.get_model_repository_index() == index


# --- inference ----------------------------------------------------------------------------------


def test_unary_infer_refuses_decoupled_models_like_triton(grpc_client, http_client) -> None:
    with pytest.raises(InferenceServerException) as error:
        grpc_client.infer(MODEL_NAME, generate_inputs("hi", GREEDY))
    assert error.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "doesn't support models with decoupled transaction policy" in error.value.message()
    http_input = httpclient.InferInput("text_input", [1], "BYTES")
    http_input.set_data_from_numpy(np.array([b"hi"], dtype=object))
    with pytest.raises(InferenceServerException, match="HTTP end point doesn't support"):
        http_client.infer(MODEL_NAME, [http_input])


def test_streaming_sends_deltas_that_add_up_to_the_full_output(grpc_client) -> None:
    streamed = one(grpc_client, generate_inputs("The sky is", GREEDY, stream=True))
    assert len(streamed) == GREEDY["max_tokens"]
    assert [is_final(r) for r in streamed] == [False] * 5 + [True]
    assert [text_of(r, "finish_reason") for r in streamed] == ["None"] * 5 + ["length"]
    assert [count_of(r, "num_output_tokens") for r in streamed] == [1] * 6
    whole = one(grpc_client, generate_inputs("The sky is", GREEDY))
    assert len(whole) == 1 and is_final(whole[0])
    assert "".join(text_of(r) for r in streamed) == text_of(whole[0])
    assert count_of(whole[0], "num_output_tokens") == 6
    assert count_of(whole[0], "num_input_tokens") == count_of(streamed[0], "num_input_tokens") > 0


def test_non_streaming_output_starts_with_the_prompt_unless_excluded(grpc_client) -> None:
    [with_prompt] = one(grpc_client, generate_inputs("Once upon", GREEDY, exclude_input=None))
    [without] = one(grpc_client, generate_inputs("Once upon", GREEDY))
    assert text_of(with_prompt) == "Once upon" + text_of(without)


def test_streaming_with_the_prompt_in_the_output_is_refused(grpc_client) -> None:
    message = one_error(grpc_client, generate_inputs("x", GREEDY, stream=True, exclude_input=False))
    assert "When streaming, `exclude_input_in_output` = False is not allowed." in message


def test_logprobs_and_cumulative_logprob_in_the_backends_format(grpc_client) -> None:
    returns = ("logprobs", "cumulative_logprob", "finish_reason")
    sampling = {**GREEDY, "max_tokens": 3, "logprobs": 2}
    streamed = one(grpc_client, generate_inputs("a", sampling, stream=True, returns=returns))
    total = 0.0
    for result in streamed:
        [step] = json.loads(text_of(result, "logprobs"))
        token_id, best = next(iter(step.items()))
        assert int(token_id) >= 0 and set(best) == {"logprob", "rank", "decoded_token"}
        assert best["rank"] == 1  # greedy: the sampled token is the most likely
        assert 1 <= len(step) <= 3
        total += best["logprob"]
        assert result.as_numpy("cumulative_logprob").dtype.name == "float32"
    assert float(streamed[-1].as_numpy("cumulative_logprob")[0]) == pytest.approx(total, abs=1e-4)
    [plain] = one(grpc_client, generate_inputs("a", GREEDY, returns=("logprobs",)))
    assert json.loads(text_of(plain, "logprobs")) is None  # no logprobs were asked for


def test_bad_sampling_parameters_name_the_key(grpc_client) -> None:
    message = one_error(grpc_client, generate_inputs("x", {"max_tokens": 2, "bogus_knob": 1}))
    assert "bogus_knob" in message
    message = one_error(grpc_client, generate_inputs("x", {"temperature": "hot"}))
    assert "temperature" in message
    [bad_json] = stream_requests(
        grpc_client,
        [("r", [bytes_input("text_input", "x"), bytes_input("sampling_parameters", "{")])],
    )["errors"]
    assert "sampling_parameters" in str(bad_json)


def test_tensor_contract_violations_are_refused_like_triton(grpc_client) -> None:
    wrong_type = [bytes_input("text_input", "x"), bytes_input("stream", "yes")]
    assert "data-type is 'BYTES', but model" in one_error(grpc_client, wrong_type)
    unknown = [bytes_input("text_input", "x"), bool_input("temperature", True)]
    assert "unexpected inference input 'temperature'" in one_error(grpc_client, unknown)
    image = [bytes_input("text_input", "x"), bytes_input("image", "aGk=")]
    assert "'image' is not supported" in one_error(grpc_client, image)
    embed = [bytes_input("embedding_request", json.dumps({"input": "x"}))]
    assert "does not support 'embed' request" in one_error(grpc_client, embed)


def test_structured_output_choice_produces_one_of_the_choices(grpc_client) -> None:
    choices = ["yes", "no", "maybe"]
    sampling = {
        "temperature": 1.0,
        "seed": 3,
        "max_tokens": 8,
        "structured_outputs": json.dumps({"choice": choices}),
    }
    for seed in range(3):
        [result] = one(grpc_client, generate_inputs("Answer:", {**sampling, "seed": seed}))
        assert text_of(result) in choices
        assert text_of(result, "finish_reason") == "stop"


def test_request_parameters_are_the_sampling_parameters_without_the_tensor(grpc_client) -> None:
    inputs = generate_inputs("The sky is", None)
    responses = stream_requests(
        grpc_client,
        [("r", inputs)],
        parameters={"max_tokens": 6, "temperature": 0.0, "ignore_eos": True},
    )
    [via_params] = responses["r"]
    [via_tensor] = one(grpc_client, generate_inputs("The sky is", GREEDY))
    assert text_of(via_params) == text_of(via_tensor)
    bad = stream_requests(grpc_client, [("r", inputs)], parameters={"not_a_knob": 1})
    assert "not_a_knob" in str(bad["errors"][0])


def test_concurrent_requests_on_one_stream_are_batched_together(grpc_client) -> None:
    sampling = {**GREEDY, "max_tokens": 8}
    requests = [(f"c{i}", generate_inputs(f"prompt {i}", sampling, stream=True)) for i in range(4)]
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    order = []
    try:
        for request_id, inputs in requests:
            grpc_client.async_stream_infer(MODEL_NAME, inputs, request_id=request_id)
        finished: set[str] = set()
        while len(finished) < 4:
            result, error = results.get(timeout=120)
            assert error is None, error
            order.append(result.get_response().id)
            if is_final(result):
                finished.add(order[-1])
    finally:
        grpc_client.stop_stream()
    assert sorted(set(order)) == ["c0", "c1", "c2", "c3"]
    assert all(order.count(f"c{i}") == 8 for i in range(4))
    # Served one after another, each request's 8 responses would be contiguous.
    first_final = min(max(i for i, rid in enumerate(order) if rid == f"c{k}") for k in range(4))
    assert len(set(order[: first_final + 1])) > 1


def test_grpc_aio_stream_infer_serves_several_streams_at_once(kserve) -> None:
    async def run_one(client: aioclient.InferenceServerClient, n: int) -> str:
        async def requests() -> Any:
            yield {
                "model_name": MODEL_NAME,
                "request_id": f"aio{n}",
                "inputs": generate_inputs(f"stream {n}", GREEDY, stream=True),
            }

        text = []
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            text.append(text_of(result))
            if is_final(result):
                break
        return "".join(text)

    async def main() -> list[str]:
        client = aioclient.InferenceServerClient(kserve.grpc_url)
        try:
            return await asyncio.gather(*(run_one(client, n) for n in range(3)))
        finally:
            await client.close()

    texts = asyncio.run(main())
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)


# --- HTTP generate extension ----------------------------------------------------------------------


def test_http_generate_and_generate_stream(kserve, grpc_client) -> None:
    base = f"http://{kserve.http_url}/v2/models/{MODEL_NAME}"
    body = {
        "text_input": "The sky is",
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
        "parameters": GREEDY,
    }
    answer = httpx.post(f"{base}/generate", json=body)
    assert answer.status_code == 200, answer.text
    payload = answer.json()
    assert payload["model_name"] == MODEL_NAME and payload["model_version"] == "1"
    assert payload["num_output_tokens"] == 6
    [via_grpc] = one(grpc_client, generate_inputs("The sky is", GREEDY))
    assert payload["text_output"] == text_of(via_grpc)

    streamed = httpx.post(f"{base}/generate_stream", json={**body, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: ") :]) for line in streamed.text.splitlines() if line]
    assert len(events) == 6
    assert "".join(e["text_output"] for e in events) == payload["text_output"]

    refused = httpx.post(f"{base}/generate", json={"text_input": "x", "parameters": {"nope": 1}})
    assert refused.status_code == 400 and "nope" in refused.json()["error"]
    not_scalar = httpx.post(f"{base}/generate", json={"text_input": "x", "stop": ["a"]})
    assert not_scalar.status_code == 400 and "'stop' has invalid type" in not_scalar.json()["error"]
    assert httpx.post(f"{base}/generate", json={**body, "stream": True}).status_code == 500


# --- statistics and metrics -------------------------------------------------------------------


def test_statistics_and_metrics_move_with_requests(kserve, grpc_client, http_client) -> None:
    key = (("model", MODEL_NAME), ("version", "1"))
    failure = (("model", MODEL_NAME), ("reason", "BACKEND"), ("version", "1"))
    before = metric_samples(kserve)
    stats_before = grpc_client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]
    one(grpc_client, generate_inputs("count me", GREEDY))
    one_error(grpc_client, generate_inputs("x", {"bogus_knob": 1}))
    after = metric_samples(kserve)

    def moved(name: str, labels: tuple[tuple[str, str], ...] = key) -> float:
        # The parser reads Triton's bare counter samples as ``<name>_total``.
        return after[(f"{name}_total", labels)] - before[(f"{name}_total", labels)]

    assert moved("nv_inference_request_success") == 1
    assert moved("nv_inference_count") == 1
    assert moved("nv_inference_exec_count") == 1
    assert moved("nv_inference_request_failure", failure) == 1
    assert moved("nv_inference_request_duration_us") > 0
    assert moved("nv_inference_compute_infer_duration_us") > 0
    assert moved("nv_inference_queue_duration_us") > 0
    assert after[("nv_inference_pending_request_count", key)] == 0
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        labels = (("model", MODEL_NAME), ("reason", reason), ("version", "1"))
        assert ("nv_inference_request_failure_total", labels) in after
    stats = grpc_client.get_inference_statistics(MODEL_NAME, as_json=True)["model_stats"][0]

    def successes(s: dict[str, Any]) -> int:
        return int(s["inference_stats"]["success"].get("count", 0))

    assert successes(stats) == successes(stats_before) + 1
    assert int(stats["inference_stats"]["fail"]["count"]) >= 1
    http_stats = http_client.get_inference_statistics(MODEL_NAME)["model_stats"][0]
    assert http_stats["inference_count"] >= int(stats["inference_count"])
    text = httpx.get(f"http://127.0.0.1:{kserve.metrics}/metrics").text
    assert "# TYPE nv_inference_request_success counter" in text  # Triton's family name


def test_vllm_metrics_go_to_the_multiprocess_dir_and_triton_ones_do_not(
    kserve, grpc_client
) -> None:
    pytest.importorskip(
        "serving.metrics.vllm_metrics", reason="helper C's VllmMetrics not here yet"
    )
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    one(grpc_client, generate_inputs("metrics", GREEDY))
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(kserve.multiproc_dir))
    names = {family.name for family in registry.collect()}
    assert any(name.startswith("vllm:") for name in names), names
    assert not any(name.startswith("nv_") for name in names), names


def test_unknown_model_on_a_stream_is_an_error_response(grpc_client) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        grpc_client.async_stream_infer("nope", generate_inputs("x", GREEDY))
        _, error = results.get(timeout=60)
    finally:
        grpc_client.stop_stream()
    assert "Request for unknown model: 'nope' is not found" in str(error)


def test_cancelling_a_stream_aborts_its_request(kserve) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(kserve.grpc_url)
        sampling = {**GREEDY, "max_tokens": 500}

        async def requests() -> Any:
            yield {
                "model_name": MODEL_NAME,
                "request_id": "cancel-me",
                "inputs": generate_inputs("long", sampling, stream=True),
            }
            await asyncio.sleep(3600)  # keep the stream open

        responses = client.stream_infer(requests())
        async for _result, error in responses:
            assert error is None
            break
        responses.cancel()
        await client.close()

    key = (
        "nv_inference_request_failure_total",
        (("model", MODEL_NAME), ("reason", "CANCELED"), ("version", "1")),
    )
    before = metric_samples(kserve)[key]
    asyncio.run(main())
    for _ in range(200):
        if metric_samples(kserve)[key] == before + 1:
            break
        time.sleep(0.05)
    assert metric_samples(kserve)[key] == before + 1
    # The engine is free again: a new request completes normally.
    client = grpcclient.InferenceServerClient(kserve.grpc_url)
    try:
        assert len(one(client, generate_inputs("after", GREEDY, stream=True))) == 6
    finally:
        client.close()


def test_grpc_status_codes_for_unary_errors(grpc_client) -> None:
    with pytest.raises(InferenceServerException) as error:
        grpc_client.get_model_config("nope")
    assert error.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(InferenceServerException) as error:
        grpc_client.get_model_config(MODEL_NAME, "2")
    assert error.value.status() == str(grpc.StatusCode.NOT_FOUND)


def test_enable_empty_final_response_adds_nothing_as_with_the_vllm_backend(grpc_client) -> None:
    # The backend's last response carries the final flag with its data, so Triton has no
    # empty final response to send even when the client opts in.
    inputs = generate_inputs("x", {**GREEDY, "max_tokens": 3}, stream=True)
    responses = stream_requests(grpc_client, [("r", inputs)], enable_empty_final_response=True)
    assert [is_final(r) for r in responses["r"]] == [False, False, True]
    assert "errors" not in responses


def test_enable_empty_final_response_must_be_a_bool(kserve) -> None:
    # tritonclient refuses to send the reserved parameter by hand; a raw stub can.
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=MODEL_NAME, id="raw")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.inputs[0].contents.bytes_contents.append(b"x")
    request.parameters["triton_enable_empty_final_response"].string_param = "yes"
    with grpc.insecure_channel(kserve.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        [response] = list(stub.ModelStreamInfer(iter([request]), timeout=60))
    assert "expected bool_param" in response.error_message
    assert response.infer_response.id == "raw"
    assert response.infer_response.parameters["triton_final_response"].bool_param


# --- Triton's clients: string values, n > 1, model control in "none" mode ---------------------


def test_string_sampling_values_convert_as_tritons_backend_does(grpc_client, kserve) -> None:
    """What Triton's sample client and CI tests send: every value a string."""
    as_strings = {"temperature": "0", "max_tokens": "6", "ignore_eos": "true"}
    [typed] = one(grpc_client, generate_inputs("Hello", GREEDY))
    [converted] = one(grpc_client, generate_inputs("Hello", as_strings))
    assert text_of(converted) == text_of(typed)
    assert count_of(converted, "num_output_tokens") == 6
    # Without the tensor, the request parameters (strings on the wire) convert the same way.
    inputs = [bytes_input("text_input", "Hello"), bool_input("exclude_input_in_output", True)]
    [from_parameters] = one_with_parameters(grpc_client, inputs, as_strings)
    assert text_of(from_parameters) == text_of(typed)
    # What does not convert is refused naming the key, on the stream and over HTTP (400).
    assert "temperature='hot'" in one_error(
        grpc_client, generate_inputs("x", {"temperature": "hot"})
    )
    response = httpx.post(
        f"http://{kserve.http_url}/v2/models/{MODEL_NAME}/generate",
        json={"text_input": "x", "parameters": {"ignore_eos": "maybe"}},
    )
    assert response.status_code == 400
    assert "sampling_parameters.ignore_eos='maybe'" in response.json()["error"]


def one_with_parameters(
    client: grpcclient.InferenceServerClient, inputs: list[Any], parameters: dict[str, Any]
) -> list[Any]:
    responses = stream_requests(client, [("r", inputs)], parameters=parameters)
    assert "errors" not in responses, responses["errors"]
    return responses["r"]


def test_n_completions_in_one_response_in_index_order(grpc_client) -> None:
    """Not streaming, ``n`` = 3 answers once with three completions, completion i being what
    the same request with n = 1 and seed + i gives (vLLM's parallel sampling)."""
    sampling = {"n": 3, "seed": 5, "temperature": 1.0, "max_tokens": 4, "ignore_eos": True}
    [result] = one(grpc_client, generate_inputs("Hello", sampling, exclude_input=False))
    texts = [t.decode() for t in result.as_numpy("text_output")]
    assert result.as_numpy("text_output").shape == (3,)
    assert [r.decode() for r in result.as_numpy("finish_reason")] == ["length"] * 3
    assert list(result.as_numpy("num_output_tokens")) == [4, 4, 4]
    assert result.as_numpy("num_input_tokens").shape == (1,)
    for i, text in enumerate(texts):
        single = {**sampling, "n": 1, "seed": 5 + i}
        [alone] = one(grpc_client, generate_inputs("Hello", single, exclude_input=False))
        assert text == text_of(alone)
        assert text.startswith("Hello")


def test_n_completions_streamed_one_completion_per_response(grpc_client) -> None:
    sampling = {"n": 2, "temperature": 0, "max_tokens": 5, "ignore_eos": True}
    responses = one(grpc_client, generate_inputs("Hello", sampling, stream=True))
    assert len(responses) == 2 * 5  # one per completion per step
    assert all(r.as_numpy("text_output").shape == (1,) for r in responses)
    assert [is_final(r) for r in responses] == [False] * 9 + [True]
    assert [count_of(r, "num_output_tokens") for r in responses] == [1] * 10
    # Greedy: both completions are the text of the same request with n = 1, so the responses
    # carry that request's deltas twice over (the two completions' steps interleave).
    alone = one(grpc_client, generate_inputs("Hello", {**sampling, "n": 1}, stream=True))
    assert sorted(text_of(r) for r in responses) == sorted(2 * [text_of(r) for r in alone])


def test_model_control_is_refused_without_explicit_mode(grpc_client, http_client) -> None:
    for client in (grpc_client, http_client):
        with pytest.raises(InferenceServerException, match="explicit model load / unload"):
            client.load_model(MODEL_NAME)
        with pytest.raises(InferenceServerException, match="explicit model load / unload"):
            client.unload_model(MODEL_NAME)
    assert grpc_client.is_model_ready(MODEL_NAME)
