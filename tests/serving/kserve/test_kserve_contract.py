"""In-process checks of the pieces behind the KServe server: configuration reading, the
vLLM-backend request/response contract, the gRPC tensor codec and the metrics exposition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import serialize_byte_tensor

from serving import model_config
from serving.kserve import contract
from serving.kserve.contract import GenerateResponder, Tensor, parse_embed, parse_generate
from serving.kserve.errors import TritonError
from serving.kserve.grpc_codec import decode_inputs, encode_outputs
from serving.kserve.triton_metrics import StatsRecorder, render
from serving.repository import RepositoryError, read_config
from serving.sampling.types import Delta, InvalidRequestError, TokenLogprob


def _config(tmp_path: Path, text: str, name: str = "m") -> Path:
    model_dir = tmp_path / name
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir


def test_config_is_auto_completed_like_the_vllm_backend(tmp_path) -> None:
    model_dir = _config(
        tmp_path,
        'backend: "vllm"\ninput { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }\n'
        'parameters { key: "REPORT_CUSTOM_METRICS" value { string_value: "true" } }\n',
    )
    config = read_config(model_dir)
    assert config.name == "m" and config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled
    assert [i.name for i in config.input].count("text_input") == 1  # declared, not duplicated
    assert {i.name for i in config.input} == {s.name for s in model_config.INPUTS}
    assert [o.name for o in config.output] == [s.name for s in model_config.OUTPUTS]
    assert config.instance_group[0].name == "m_0"
    assert config.parameters["REPORT_CUSTOM_METRICS"].string_value == "true"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('backend: "onnxruntime"', "backend 'onnxruntime' is not served here"),
        ('backend: "vllm"\nmodel_transaction_policy { decoupled: false }', "decoupled"),
        ('name: "other"\nbackend: "vllm"', "does not match its directory"),
        ("backend: {{", "not a valid model configuration"),
        ('backend: "vllm"\nmax_batch_size: 8', "max_batch_size must be 0"),
    ],
)
def test_configs_triton_would_refuse_are_refused(tmp_path, text: str, message: str) -> None:
    with pytest.raises(RepositoryError, match=message):
        read_config(_config(tmp_path, text))


def _bytes(name: str, value: str) -> Tensor:
    return Tensor(name, "BYTES", (1,), np.array([value.encode()], dtype=object))


def _bool(name: str, value: bool) -> Tensor:
    return Tensor(name, "BOOL", (1,), np.array([value]))


def _tensors(*items: Tensor) -> dict[str, Tensor]:
    return {t.name: t for t in items}


def test_prompt_prepending_follows_the_backend() -> None:
    base = _bytes("text_input", "hi")
    assert parse_generate(_tensors(base), {}).prepend_input
    assert not parse_generate(_tensors(base, _bool("stream", True)), {}).prepend_input
    excluded = _tensors(base, _bool("exclude_input_in_output", True))
    assert not parse_generate(excluded, {}).prepend_input
    with pytest.raises(InvalidRequestError, match="When streaming"):
        parse_generate(
            _tensors(base, _bool("stream", True), _bool("exclude_input_in_output", False)), {}
        )
    with pytest.raises(InvalidRequestError, match="'text_input' is required"):
        parse_generate(_tensors(_bool("stream", False)), {})


def test_sampling_parameters_tensor_wins_over_request_parameters() -> None:
    tensors = _tensors(
        _bytes("text_input", "x"), _bytes("sampling_parameters", '{"max_tokens": 3}')
    )
    assert parse_generate(tensors, {"max_tokens": 9}).options.max_tokens == 3
    only_params = parse_generate(_tensors(_bytes("text_input", "x")), {"max_tokens": 9})
    assert only_params.options.max_tokens == 9
    with pytest.raises(InvalidRequestError, match="bogus"):
        parse_generate(_tensors(_bytes("text_input", "x")), {"bogus": 1})


def _delta(text: str, n: int, reason: str | None = None) -> Delta:
    logprobs = ((TokenLogprob(7, -0.5, 1, "a"), TokenLogprob(9, -1.5, 2, "b")),)
    return Delta(text, (7,), 4, n, -0.5 * n, logprobs, reason)


def _values(outputs: list[Tensor]) -> dict[str, object]:
    return {t.name: t.data.reshape(-1)[0] for t in outputs}


def test_responses_match_the_backends_create_response() -> None:
    flags = {f"return_{k}": True for k in ("finish_reason", "logprobs", "num_output_tokens")}
    tensors = _tensors(
        _bytes("text_input", "Q:"),
        _bytes("sampling_parameters", json.dumps({"logprobs": 1})),
        *(_bool(k, v) for k, v in flags.items()),
    )
    whole = GenerateResponder(parse_generate(tensors, {}))
    assert whole.add(_delta(" a", 1)) is None
    assert whole.add(_delta("b", 2, "length")) is None
    final = _values(whole.final())
    assert final["text_output"] == b"Q: ab" and final["finish_reason"] == b"length"
    assert final["num_output_tokens"] == 2
    steps = json.loads(final["logprobs"])  # type: ignore[arg-type]
    assert (
        steps
        == [
            {
                "7": {"logprob": -0.5, "rank": 1, "decoded_token": "a"},
                "9": {"logprob": -1.5, "rank": 2, "decoded_token": "b"},
            }
        ]
        * 2
    )

    streaming = {**tensors, "stream": _bool("stream", True)}
    streaming["exclude_input_in_output"] = _bool("exclude_input_in_output", True)
    stream = GenerateResponder(parse_generate(streaming, {}))
    first = stream.add(_delta(" a", 1))
    assert first is not None
    assert _values(first)["text_output"] == b" a" and _values(first)["finish_reason"] == b"None"
    assert len(json.loads(_values(first)["logprobs"])) == 1  # type: ignore[arg-type]


def test_embedding_requests_follow_the_openai_front_ends_payload() -> None:
    body = json.dumps({"input": "hello", "pooling_params": {}})
    call = parse_embed(_tensors(_bytes("embedding_request", body)))
    assert call.text == "hello"
    outputs = contract.embed_outputs(call, np.array([0.6, 0.8], dtype=np.float32), 3)
    assert json.loads(_values(outputs)["text_output"]) == pytest.approx([0.6, 0.8])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="dimensions"):
        parse_embed(
            _tensors(
                _bytes("embedding_request", '{"input": "x", "pooling_params": {"dimensions": [8]}}')
            )
        )


def test_grpc_codec_reads_typed_and_raw_contents_and_writes_raw() -> None:
    typed = pb.ModelInferRequest(model_name="m")
    item = typed.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    item.contents.bytes_contents.append("héllo".encode())
    flag = typed.inputs.add(name="stream", datatype="BOOL", shape=[1])
    flag.contents.bool_contents.append(True)
    decoded = decode_inputs(typed)
    assert decoded["text_input"].data[0] == "héllo".encode() and decoded["stream"].data[0]

    raw = pb.ModelInferRequest(model_name="m")
    raw.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    raw.raw_input_contents.append(serialize_byte_tensor(np.array([b"hey"], dtype=object)).item())
    assert decode_inputs(raw)["text_input"].data[0] == b"hey"

    bad = pb.ModelInferRequest(model_name="m")
    bad.inputs.add(name="stream", datatype="BOOL", shape=[2])
    bad.raw_input_contents.append(b"\x01")
    with pytest.raises(TritonError, match="unexpected total byte size 1"):
        decode_inputs(bad)

    response = pb.ModelInferResponse()
    encode_outputs(
        response,
        [_bytes("text_output", "ok"), Tensor("n", "UINT32", (1,), np.array([5], dtype=np.uint32))],
    )
    assert response.raw_output_contents[0] == b"\x02\x00\x00\x00ok"
    assert np.frombuffer(response.raw_output_contents[1], dtype=np.uint32)[0] == 5


def test_metrics_exposition_parses_and_counts() -> None:
    recorder = StatsRecorder()
    recorder.add_model("m", "1")
    timer = recorder.timer("m")
    timer.responded()
    timer.succeeded()
    recorder.timer("m").failed("CANCELED")
    families = {f.name: f for f in text_string_to_metric_families(render(recorder))}
    success = families["nv_inference_request_success"]
    assert success.type == "counter" and success.samples[0].value == 1
    failures = {
        s.labels["reason"]: s.value for s in families["nv_inference_request_failure"].samples
    }
    assert failures == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert families["nv_inference_pending_request_count"].samples[0].value == 0
