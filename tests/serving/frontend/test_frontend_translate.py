"""The OpenAI → Triton vLLM-backend translation, as pure functions (no engine needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serving.constraints.json_schema import json_object_grammar, json_schema_grammar
from serving.frontend.errors import OpenAIError
from serving.frontend.kserve_client import _classify
from serving.frontend.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from serving.frontend.translate import build_payload, check_embedding, check_token_ids
from serving.sampling.params import BOTH_LOGIT_BIASES, parse_sampling_parameters

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
    inside the ``sampling_parameters`` JSON string (vLLM 0.24 name, never guided_decoding), and a
    JSON schema travels as the corrected grammar both engines compile, not as vLLM's ``json``."""
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
    grammar = json_schema_grammar(SCHEMA)
    assert payload.sampling_parameters == json.dumps(
        {
            "max_tokens": 32,
            "temperature": 0.0,
            "seed": 7,
            "stop": ["\n\n"],
            "structured_outputs": json.dumps({"grammar": grammar}),
        }
    )
    assert r'root_prop_0 ::= (("\"red\"") | ("\"green\""))' in grammar
    outer = json.loads(payload.sampling_parameters)
    assert "guided_decoding" not in outer
    options = parse_sampling_parameters(payload.sampling_parameters)
    assert options.structured is not None and options.structured.grammar == grammar
    assert payload.exclude_input_in_output and not payload.return_logprobs


def test_json_object_and_text_formats() -> None:
    params = json.loads(
        build_payload(
            chat(response_format={"type": "json_object"}), default_max_tokens=16
        ).sampling_parameters
    )
    assert params == {
        "max_tokens": 16,
        "structured_outputs": json.dumps({"grammar": json_object_grammar()}),
    }
    text = build_payload(chat(response_format={"type": "text"}), default_max_tokens=16)
    assert json.loads(text.sampling_parameters) == {"max_tokens": 16}


def test_vllm_json_field_travels_as_the_same_grammar() -> None:
    """vLLM callers' own ``structured_outputs.json`` gets the same correction, with their
    whitespace choice kept."""
    schema = {"type": "string", "maxLength": 4}
    for compact in (True, False):
        fields = {"json": schema, "disable_any_whitespace": compact}
        payload = build_payload(completion(structured_outputs=fields), default_max_tokens=8)
        sent = json.loads(json.loads(payload.sampling_parameters)["structured_outputs"])
        assert sent == {"grammar": json_schema_grammar(schema, any_whitespace=not compact)}
        assert "[^\\0-\\x1f" in sent["grammar"]


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "string", "not": {"const": "a"}}, "not"),
        ({"type": "string", "pattern": '^a"$'}, "pattern"),
    ],
)
def test_unenforceable_schemas_are_refused_by_keyword(schema: dict[str, Any], keyword: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(OpenAIError) as caught:
        build_payload(chat(response_format=fmt), default_max_tokens=8)
    assert caught.value.status == 400
    assert caught.value.param == "response_format.json_schema.schema"
    assert keyword in caught.value.message


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


def test_other_vllm_xargs_keys_pass_through_into_extra_args() -> None:
    """As vLLM's own server does (extra_args = vllm_xargs): an author's logits processor reads
    its own key; the platform's constraint and logit_bias travel beside it."""
    constraint = {"choice": ["yes", "no"]}
    xargs = {"no_repeat_window": 3, "label": "x", "weights": [1, 2.5], "constraint": constraint}
    for request in (chat(vllm_xargs=xargs), completion(vllm_xargs=xargs)):
        text = build_payload(request, default_max_tokens=8).sampling_parameters
        assert json.loads(text)["extra_args"] == xargs
        options = parse_sampling_parameters(text)
        assert options.extra_args == xargs
        assert options.constraint is not None
    text = build_payload(
        chat(vllm_xargs={"no_repeat_window": 2}, logit_bias={"5": 1}), default_max_tokens=8
    ).sampling_parameters
    assert json.loads(text)["extra_args"] == {"no_repeat_window": 2, "logit_bias": {"5": 1.0}}
    assert parse_sampling_parameters(text).logit_bias == ((5, 1.0),)


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


def test_penalties_min_p_and_logit_bias_travel_under_vllm_names() -> None:
    fields: dict[str, Any] = {"presence_penalty": 0.5, "frequency_penalty": -1, "min_p": 0.1}
    fields |= {"repetition_penalty": 1.2, "logit_bias": {"5": 1.0, "007": -100}}
    for request in (chat(**fields), completion(**fields)):
        sent = json.loads(build_payload(request, default_max_tokens=4).sampling_parameters)
        assert sent["presence_penalty"] == 0.5 and sent["frequency_penalty"] == -1
        assert sent["repetition_penalty"] == 1.2 and sent["min_p"] == 0.1
        # JSON object keys are strings; sent as canonical decimal token ids, in extra_args.
        assert sent["extra_args"] == {"logit_bias": {"5": 1.0, "7": -100}}
    plain = json.loads(build_payload(chat(), default_max_tokens=4).sampling_parameters)
    assert not set(plain) & {
        "presence_penalty",
        "min_p",
        "logit_bias",
        "repetition_penalty",
        "extra_args",
    }


def test_logit_bias_travels_in_extra_args_never_as_the_top_level_field() -> None:
    """Triton's vLLM backend hands a top-level ``logit_bias`` to vLLM with JSON's string keys
    and vLLM fails the request, so the bias goes where the platform's own logits processor
    reads it, next to the constraint, and the engine's parser reads it back as the bias."""
    constraint = '{"choice": ["red", "green"]}'
    for request in (
        chat(logit_bias={"11": 5, "3": -100.0}, vllm_xargs={"constraint": constraint}),
        completion(logit_bias={"11": 5, "3": -100.0}, vllm_xargs={"constraint": constraint}),
    ):
        text = build_payload(request, default_max_tokens=4).sampling_parameters
        sent = json.loads(text)
        assert "logit_bias" not in sent
        assert sent["extra_args"] == {
            "constraint": constraint,
            "logit_bias": {"11": 5.0, "3": -100.0},
        }
        options = parse_sampling_parameters(text)
        assert options.logit_bias == ((3, -100.0), (11, 5.0))
        assert options.constraint is not None
    # Without a bias, extra_args carries only the constraint, as before.
    sent = json.loads(
        build_payload(
            chat(vllm_xargs={"constraint": constraint}), default_max_tokens=4
        ).sampling_parameters
    )
    assert sent["extra_args"] == {"constraint": constraint}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"five": 1.0}}, "logit_bias"),
        ({"logit_bias": {"+5": 1.0}}, "logit_bias"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"not": {"type": "object"}}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
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
        # Any key passes (vLLM's extra_args), but only with the values vLLM's field allows.
        ({"vllm_xargs": {"other": {"nested": 1}}}, "vllm_xargs.other"),
        ({"vllm_xargs": {"other": None}}, "vllm_xargs.other"),
        ({"vllm_xargs": {"other": [[1]]}}, "vllm_xargs.other"),
        ({"vllm_xargs": {"logit_bias": {"3": 1}}, "logit_bias": {"4": 1}}, "vllm_xargs.logit_bias"),
        ({"vllm_xargs": {"logit_bias": {"cat": 1}}}, "vllm_xargs.logit_bias"),
        ({"vllm_xargs": {"constraint": {"choice": []}}}, "vllm_xargs.constraint"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"top_logprobs": 2}, "top_logprobs"),
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


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("sampling_parameters.extra_args.logit_bias: key 'x' is not a token id", "logit_bias"),
        ("sampling_parameters.extra_args.logit_bias['7'] must be a finite number", "logit_bias"),
        (BOTH_LOGIT_BIASES, "logit_bias"),
        (
            "sampling_parameters.logit_bias: token id(s) [600] are outside the vocabulary "
            "(size 512)",
            "logit_bias",
        ),
        ("token_id(s) [600] in logit_bias contain out-of-vocab token ids", "logit_bias"),
        ("sampling_parameters.min_p must be in [0, 1]", "min_p"),
        ("the prompt is 9000 tokens; this model's context is 4096 tokens", None),
    ],
)
def test_engine_refusals_name_the_openai_field(message: str, param: str | None) -> None:
    """The bias travels in extra_args, but a refusal of it names the field the caller sent."""
    error = _classify(message)
    assert (error.status, error.param) == (400, param)


def test_max_completion_tokens_wins_over_its_deprecated_name() -> None:
    """Both sent: ``max_completion_tokens`` is the one used, as vLLM's server and Triton's front
    end use it; alone, either name is used."""
    both = build_payload(chat(max_tokens=3, max_completion_tokens=4), default_max_tokens=16)
    assert json.loads(both.sampling_parameters)["max_tokens"] == 4
    old = build_payload(chat(max_tokens=3), default_max_tokens=16)
    assert json.loads(old.sampling_parameters)["max_tokens"] == 3
    neither = build_payload(chat(), default_max_tokens=16)
    assert json.loads(neither.sampling_parameters)["max_tokens"] == 16


def test_logit_bias_ids_outside_the_vocabulary_are_refused_by_the_front_end() -> None:
    check_token_ids(chat(logit_bias={"511": 1, "0": -1}), 512)
    check_token_ids(chat(logit_bias={"100000": 1}), None)  # vocabulary unknown: the engine checks
    with pytest.raises(OpenAIError) as info:
        check_token_ids(completion(logit_bias={"3": 1, "512": 1, "9999": 2}), 512)
    assert info.value.param == "logit_bias"
    assert "[512, 9999]" in str(info.value.body())
