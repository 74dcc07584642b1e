"""Triton's ``sampling_parameters`` payload: what is honoured, and what is refused by name."""

from __future__ import annotations

import json

import pytest

from serving.constraints.spec import Choice
from serving.engine.sampling_params import parse_sampling_parameters
from serving.engine.types import InvalidRequestError, SamplingOptions, StructuredOutput


def test_empty_payload_gives_vllm_defaults() -> None:
    assert parse_sampling_parameters(None) == SamplingOptions()
    assert parse_sampling_parameters("{}") == SamplingOptions()


def test_vllm_fields_are_read_by_name() -> None:
    options = parse_sampling_parameters(
        json.dumps(
            {
                "max_tokens": 32,
                "temperature": 0.5,
                "top_p": 0.9,
                "top_k": 40,
                "seed": 3,
                "stop": "END",
                "stop_token_ids": [5],
                "logprobs": 2,
                "ignore_eos": True,
                "n": 1,
                "presence_penalty": 0,
            }
        )
    )
    assert options.max_tokens == 32 and options.top_k == 40 and options.seed == 3
    assert options.stop == ("END",) and options.stop_token_ids == (5,)
    assert options.logprobs == 2 and options.ignore_eos


def test_structured_outputs_is_a_json_string_inside_the_json() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    payload = json.dumps({"structured_outputs": json.dumps({"json": schema})})
    assert parse_sampling_parameters(payload).structured == StructuredOutput(json_schema=schema)
    choice = json.dumps({"structured_outputs": {"choice": ["a", "b"]}})
    assert parse_sampling_parameters(choice).structured == StructuredOutput(choice=("a", "b"))


def test_the_platform_constraint_travels_in_extra_args() -> None:
    payload = {"extra_args": {"constraint": {"choice": ["x", "y"]}}}
    assert parse_sampling_parameters(payload).constraint == Choice(("x", "y"))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not json", "not valid JSON"),
        ("[]", "JSON object"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"n": 2}, "sampling_parameters.n"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"temprature": 0.5}, "temprature is not a known parameter"),
        ({"guided_decoding": "{}"}, "structured_outputs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "12"}, "max_tokens must be an integer"),
        ({"top_p": 0}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"stop": [""]}, "stop"),
        ({"structured_outputs": "{not json"}, "JSON-encoded string"),
        ({"structured_outputs": json.dumps({"regex": "a", "choice": ["a"]})}, "exactly one"),
        ({"structured_outputs": json.dumps({})}, "exactly one"),
        ({"structured_outputs": json.dumps({"json_object": False})}, "json_object must be true"),
        ({"structured_outputs": json.dumps({"choice": []})}, "choice"),
        ({"structured_outputs": json.dumps({"json": "{"})}, "structured_outputs.json"),
        (
            {"structured_outputs": json.dumps({"regex": "a", "whitespace_pattern": " "})},
            "whitespace_pattern",
        ),
        ({"structured_outputs": json.dumps({"structural_tag": "{}"})}, "structural_tag"),
        ({"extra_args": {"constraint": {"choice": []}}}, "extra_args.constraint"),
        ({"extra_args": {"other": 1}}, "extra_args.other"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(payload, message) -> None:
    raw = payload if isinstance(payload, str) else json.dumps(payload)
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(")):
        parse_sampling_parameters(raw)
