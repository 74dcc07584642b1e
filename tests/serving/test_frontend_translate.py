"""The OpenAI → Triton vLLM-backend translation, as pure functions (no engine needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serving.engine.sampling_params import parse_sampling_parameters
from serving.frontend.errors import OpenAIError
from serving.frontend.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from serving.frontend.translate import build_payload, check_embedding

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}},
    "required": ["color"],
    "additionalProperties": False,
}


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})


def test_json_schema_payload_is_pinned_exactly() -> None:
    """The exact string Triton's backend receives: ``structured_outputs`` is a JSON string
    inside the ``sampling_parameters`` JSON string (vLLM 0.24 name, never guided_decoding)."""
    request = chat(
        max_completion_tokens=32,
        temperature=0.0,
        seed=7,
        stop=["\n\n"],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "c", "schema": SCHEMA, "strict": True},
        },
    )
    payload = build_payload(request, default_max_tokens=16)
    assert payload.sampling_parameters == (
        '{"max_tokens": 32, "temperature": 0.0, "seed": 7, "stop": ["\\n\\n"], '
        '"structured_outputs": "{\\"json\\": {\\"type\\": \\"object\\", \\"properties\\": '
        '{\\"color\\": {\\"enum\\": [\\"red\\", \\"green\\"]}}, \\"required\\": [\\"color\\"], '
        '\\"additionalProperties\\": false}, \\"disable_any_whitespace\\": true}"}'
    )
    outer = json.loads(payload.sampling_parameters)
    assert isinstance(outer["structured_outputs"], str)
    assert json.loads(outer["structured_outputs"]) == {
        "json": SCHEMA,
        "disable_any_whitespace": True,
    }
    assert "guided_decoding" not in outer
    options = parse_sampling_parameters(payload.sampling_parameters)
    assert options.structured is not None and options.structured.json_schema == SCHEMA
    assert payload.exclude_input_in_output and not payload.return_logprobs


def test_json_object_and_text_formats() -> None:
    params = json.loads(
        build_payload(
            chat(response_format={"type": "json_object"}), default_max_tokens=16
        ).sampling_parameters
    )
    assert params == {
        "max_tokens": 16,
        "structured_outputs": '{"json_object": true, "disable_any_whitespace": true}',
    }
    text = build_payload(chat(response_format={"type": "text"}), default_max_tokens=16)
    assert json.loads(text.sampling_parameters) == {"max_tokens": 16}


def test_vllm_xargs_constraint_becomes_extra_args() -> None:
    constraint = {"choice": ["yes", "no"]}
    payload = build_payload(chat(vllm_xargs={"constraint": constraint}), default_max_tokens=8)
    params = json.loads(payload.sampling_parameters)
    assert params["extra_args"] == {"constraint": constraint}
    assert parse_sampling_parameters(payload.sampling_parameters).constraint is not None
    # vLLM's own request field for structured outputs travels the same way as response_format.
    payload = build_payload(
        completion(structured_outputs={"regex": "[a-z]{3}"}), default_max_tokens=8
    )
    params = json.loads(payload.sampling_parameters)
    assert json.loads(params["structured_outputs"]) == {"regex": "[a-z]{3}"}


def test_n_with_seed_gives_each_choice_its_own_seed() -> None:
    request = completion(n=3, seed=41)
    seeds = [
        json.loads(build_payload(request, default_max_tokens=4, index=i).sampling_parameters)[
            "seed"
        ]
        for i in range(3)
    ]
    assert seeds == [41, 42, 43]


def test_logprobs_and_echo_map_to_the_tensor_contract() -> None:
    chat_payload = build_payload(chat(logprobs=True, top_logprobs=3), default_max_tokens=4)
    assert chat_payload.return_logprobs
    assert json.loads(chat_payload.sampling_parameters)["logprobs"] == 3
    zero = build_payload(chat(logprobs=True), default_max_tokens=4)
    assert json.loads(zero.sampling_parameters)["logprobs"] == 0
    echoed = build_payload(completion(echo=True), default_max_tokens=4)
    assert not echoed.exclude_input_in_output
    # Triton refuses exclude_input_in_output=False when streaming: the front end echoes itself.
    streamed = build_payload(completion(echo=True, stream=True), default_max_tokens=4)
    assert streamed.exclude_input_in_output
    legacy = build_payload(chat(max_tokens=5), default_max_tokens=16)
    assert json.loads(legacy.sampling_parameters)["max_tokens"] == 5


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"store": True}, "store"),
        ({"response_format": {"type": "grammar"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "no-such-type"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
        ),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"vllm_xargs": {"other": 1}}, "vllm_xargs.other"),
        ({"vllm_xargs": {"constraint": {"choice": []}}}, "vllm_xargs.constraint"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ],
)
def test_chat_parameters_that_cannot_be_honoured_are_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(OpenAIError) as info:
        build_payload(chat(**fields), default_max_tokens=16)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"best_of": 3}, "best_of"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"suffix": "tail"}, "suffix"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"echo": True, "logprobs": 1}, "echo"),
    ],
)
def test_completion_parameters_that_cannot_be_honoured_are_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(OpenAIError) as info:
        build_payload(completion(**fields), default_max_tokens=16)
    assert info.value.param == param


def test_embedding_inputs() -> None:
    assert check_embedding(EmbeddingRequest(model="e", input="a")) == ["a"]
    assert check_embedding(EmbeddingRequest(model="e", input=["a", "b"])) == ["a", "b"]
    for fields, param in (({"input": [1, 2]}, "input"), ({"dimensions": 8}, "dimensions")):
        with pytest.raises(OpenAIError) as info:
            check_embedding(EmbeddingRequest.model_validate({"model": "e", "input": "x", **fields}))
        assert info.value.param == param
