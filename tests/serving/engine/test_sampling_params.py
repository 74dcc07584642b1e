"""Triton's ``sampling_parameters`` payload: what is honoured, and what is refused by name."""

from __future__ import annotations

import json

import pytest

from serving.sampling.constraint_spec import Choice
from serving.sampling.params import (
    OPTIONAL_INT_FIELDS,
    TRITON_CONVERTED_FIELDS,
    parse_sampling_parameters,
)
from serving.sampling.types import InvalidRequestError, SamplingOptions, StructuredOutput


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


def test_logit_bias_is_read_from_extra_args_too() -> None:
    """The OpenAI front end sends logit_bias in extra_args (Triton's backend would hand the
    top-level field to vLLM with string keys); Triton clients may still send it at the top."""
    bias = {"42": -100, "7": 2.5, "0": 0}
    expected = ((0, 0.0), (7, 2.5), (42, -100.0))
    assert parse_sampling_parameters({"extra_args": {"logit_bias": bias}}).logit_bias == expected
    assert parse_sampling_parameters({"logit_bias": bias}).logit_bias == expected
    both = parse_sampling_parameters(
        json.dumps({"extra_args": {"constraint": {"choice": ["x"]}, "logit_bias": {"3": 1}}})
    )
    assert both.logit_bias == ((3, 1.0),) and both.constraint == Choice(("x",))
    assert parse_sampling_parameters({"extra_args": {"logit_bias": None}}).logit_bias == ()
    assert parse_sampling_parameters({"extra_args": {"logit_bias": {}}}).logit_bias == ()
    # A top-level null is no bias, wherever it comes in the object: the extra_args one stands.
    for payload in (
        {"extra_args": {"logit_bias": {"3": 1}}, "logit_bias": None},
        {"logit_bias": None, "extra_args": {"logit_bias": {"3": 1}}},
        {"logit_bias": {"3": 1}, "extra_args": {"logit_bias": None}},
        {"extra_args": {"constraint": {"choice": ["x"]}}, "logit_bias": {"3": 1}},
    ):
        assert parse_sampling_parameters(json.dumps(payload)).logit_bias == ((3, 1.0),), payload


@pytest.mark.parametrize(
    "payload",
    [
        {"logit_bias": {"3": 1}, "extra_args": {"logit_bias": {"4": 1}}},
        {"extra_args": {"logit_bias": {"4": 1}}, "logit_bias": {"3": 1}},
        {"logit_bias": {}, "extra_args": {"logit_bias": {"4": 1}}},
        {"extra_args": {"logit_bias": {}}, "logit_bias": {"3": 1}},
        {"logit_bias": {"3": 1}, "extra_args": {"logit_bias": {"3": 1}}},
    ],
)
def test_logit_bias_at_the_top_and_in_extra_args_at_once_is_refused(payload) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_sampling_parameters(json.dumps(payload))
    assert str(info.value) == (
        "sampling_parameters.logit_bias and sampling_parameters.extra_args.logit_bias are both "
        "set; send logit_bias once"
    )


@pytest.mark.parametrize(
    ("bias", "message"),
    [
        ([1, 2], "extra_args.logit_bias must be an object of token id to bias"),
        ({"cat": 1}, "extra_args.logit_bias: key 'cat' is not a token id"),
        ({"-3": 1}, "extra_args.logit_bias: key '-3' is not a token id"),
        ({"1.5": 1}, "extra_args.logit_bias: key '1.5' is not a token id"),
        ({"7": "5"}, "extra_args.logit_bias\\['7'\\] must be a finite number"),
        ({"7": None}, "extra_args.logit_bias\\['7'\\] must be a finite number"),
    ],
)
def test_a_bad_logit_bias_in_extra_args_is_refused_by_its_name(bias, message) -> None:
    """The same messages as the top-level field's, naming where the bias was sent."""
    with pytest.raises(InvalidRequestError, match="^sampling_parameters." + message):
        parse_sampling_parameters(json.dumps({"extra_args": {"logit_bias": bias}}))
    top = message.replace("extra_args.", "")
    with pytest.raises(InvalidRequestError, match="^sampling_parameters." + top):
        parse_sampling_parameters(json.dumps({"logit_bias": bias}))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not json", "not valid JSON"),
        ("[]", "JSON object"),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be in \\[-2, 2\\]"),
        ({"presence_penalty": "-2.1"}, "presence_penalty must be in \\[-2, 2\\]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
        ({"repetition_penalty": "inf"}, "repetition_penalty='inf' is not a finite number"),
        ({"min_p": 1.5}, "min_p must be in \\[0, 1\\]"),
        ({"min_p": "lots"}, "min_p='lots' is not a number"),
        ({"logit_bias": [1, 2]}, "logit_bias must be an object"),
        ({"logit_bias": {"cat": 1}}, "logit_bias: key 'cat' is not a token id"),
        ({"logit_bias": {"-3": 1}}, "logit_bias: key '-3' is not a token id"),
        ({"logit_bias": {"1.5": 1}}, "logit_bias: key '1.5' is not a token id"),
        ({"logit_bias": {"7": "5"}}, "logit_bias\\['7'\\] must be a finite number"),
        ({"logit_bias": {"7": True}}, "logit_bias\\['7'\\] must be a finite number"),
        ({"logprobs": -1}, "logprobs must be >= 0"),
        ({"n": 0}, "sampling_parameters.n"),
        ({"n": "2.5"}, "n='2.5' is not an integer"),
        ({"temperature": "hot"}, "temperature='hot' is not a number"),
        ({"temperature": "nan"}, "temperature='nan' is not a finite number"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"ignore_eos": "no"}, "ignore_eos='no' is not a boolean"),
        ({"ignore_eos": 2}, "ignore_eos must be true or false"),
        ({"max_tokens": None}, "max_tokens must be an integer"),
        ({"skip_clone": "true"}, "skip_clone is not a known parameter"),
        ({"temprature": 0.5}, "temprature is not a known parameter"),
        ({"guided_decoding": "{}"}, "structured_outputs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "0"}, "max_tokens"),
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
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(payload, message) -> None:
    raw = payload if isinstance(payload, str) else json.dumps(payload)
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(")):
        parse_sampling_parameters(raw)


def test_other_extra_args_pass_through_for_author_processors() -> None:
    """As on vLLM: keys the platform does not read are an author processor's to read."""
    options = parse_sampling_parameters(json.dumps({"extra_args": {"no_repeat_window": 3}}))
    assert options.extra_args == {"no_repeat_window": 3}


def test_penalties_min_p_and_logit_bias_are_read_by_name() -> None:
    options = parse_sampling_parameters(
        json.dumps(
            {
                "presence_penalty": 0.5,
                "frequency_penalty": -1,
                "repetition_penalty": 1.3,
                "min_p": 0.05,
                "logit_bias": {"42": -100, "7": 2.5, "0": 0},
            }
        )
    )
    assert options.presence_penalty == 0.5 and options.frequency_penalty == -1.0
    assert options.repetition_penalty == 1.3 and options.min_p == 0.05
    # JSON keys are strings; the engine holds token ids, sorted, one bias each.
    assert options.logit_bias == ((0, 0.0), (7, 2.5), (42, -100.0))
    assert parse_sampling_parameters({"logit_bias": None}).logit_bias == ()
    assert parse_sampling_parameters({"logit_bias": {}}).logit_bias == ()
    # The bounds are vLLM's, inclusive where vLLM's are.
    bounds = {"presence_penalty": 2, "frequency_penalty": -2, "min_p": 1}
    assert parse_sampling_parameters(bounds).min_p == 1.0
    assert parse_sampling_parameters({"repetition_penalty": 1e-3}).repetition_penalty == 1e-3
    assert parse_sampling_parameters({"logprobs": 50}).logprobs == 50  # the model caps it


def test_penalty_strings_convert_as_tritons_clients_send_them() -> None:
    options = parse_sampling_parameters(
        json.dumps(
            {
                "presence_penalty": "0.5",
                "frequency_penalty": "-0.25",
                "repetition_penalty": "1.2",
                "min_p": "0.1",
            }
        )
    )
    assert options.presence_penalty == 0.5 and options.frequency_penalty == -0.25
    assert options.repetition_penalty == 1.2 and options.min_p == 0.1


def test_strings_convert_by_the_vllm_field_type_as_tritons_backend_does() -> None:
    """What Triton's sample client and CI tests send: every value a string."""
    options = parse_sampling_parameters(
        json.dumps(
            {
                "temperature": "0.1",
                "top_p": "0.95",
                "top_k": "40",
                "max_tokens": "12",
                "seed": "7",
                "n": "2",
                "logprobs": "1",
                "ignore_eos": "true",
                "skip_special_tokens": "False",
                "presence_penalty": "0",
                "repetition_penalty": "1.0",
            }
        )
    )
    assert options.temperature == 0.1 and options.top_p == 0.95 and options.top_k == 40
    assert options.max_tokens == 12 and options.seed == 7 and options.n == 2
    assert options.logprobs == 1 and options.ignore_eos is True
    assert options.skip_special_tokens is False  # the backend's bool("False") would be True
    # Numbers and booleans as JSON types still work, and vLLM's null for Optional[int].
    assert parse_sampling_parameters({"temperature": 0, "seed": None}).seed is None
    assert parse_sampling_parameters({"ignore_eos": 0}).ignore_eos is False


def test_the_request_parameters_path_converts_the_same_way() -> None:
    """Without the ``sampling_parameters`` tensor the backend reads the request parameters,
    which tritonclient sends as strings for string values."""
    assert parse_sampling_parameters({"temperature": "0", "top_p": "1"}) == SamplingOptions(
        temperature=0.0, top_p=1.0
    )


def _tritons_conversion_table() -> dict[str, type]:
    """The fields ``TritonSamplingParams.from_dict`` converts, computed the way it does (its
    ``type_mapping`` over ``SamplingParams.__annotations__``) from the installed vLLM."""
    from typing import Optional

    sampling = pytest.importorskip("vllm.sampling_params")
    type_mapping: dict[object, type] = {
        int: int,
        float: float,
        bool: bool,
        str: str,
        Optional[int]: int,  # noqa: UP045 -- the backend's own spelling of the key
    }
    return {
        key: type_mapping[annotation]
        for key, annotation in sampling.SamplingParams.__annotations__.items()
        if annotation in type_mapping
    }


def test_the_conversion_table_is_vllms_own() -> None:
    import vllm

    assert vllm.__version__.startswith("0.24.0"), "the table is for the pinned vLLM 0.24.0"
    assert _tritons_conversion_table() == TRITON_CONVERTED_FIELDS


def test_optional_int_fields_are_vllms_own() -> None:
    from typing import Optional

    sampling = pytest.importorskip("vllm.sampling_params")
    optional = {
        key
        for key, annotation in sampling.SamplingParams.__annotations__.items()
        if annotation == Optional[int]  # noqa: UP045
    }
    assert optional == OPTIONAL_INT_FIELDS


def test_every_converted_field_is_honoured_or_refused_by_name() -> None:
    """No field Triton would convert is ever silently dropped: each either changes the options
    or is refused naming the key (at a value other than vLLM's default)."""
    sampling = pytest.importorskip("vllm.sampling_params")
    defaults = sampling.SamplingParams()
    for key, kind in TRITON_CONVERTED_FIELDS.items():
        value = {int: "3", float: "0.5", str: "x"}.get(kind)
        if kind is bool:
            value = "false" if getattr(defaults, key) else "true"
        try:
            options = parse_sampling_parameters({key: value})
        except InvalidRequestError as exc:
            assert f"sampling_parameters.{key}" in str(exc)
        else:
            assert options != SamplingOptions(), key


def test_converted_values_match_vllms_own_sampling_params() -> None:
    """The converted options equal what vLLM's ``SamplingParams`` holds for the same payload
    once Triton's conversion is applied (where that conversion is not a trap)."""
    sampling = pytest.importorskip("vllm.sampling_params")
    payload = {"temperature": "0.25", "top_p": "0.5", "top_k": "3", "max_tokens": "9"}
    payload |= {"min_tokens": "2", "seed": "11", "n": "3", "logprobs": "2"}
    payload |= {"presence_penalty": "0.5", "frequency_penalty": "-0.5"}
    payload |= {"repetition_penalty": "1.2", "min_p": "0.1"}
    converted = {k: TRITON_CONVERTED_FIELDS[k](v) for k, v in payload.items()}
    theirs = sampling.SamplingParams(**converted)
    ours = parse_sampling_parameters(payload)
    for key in payload:
        assert getattr(ours, key) == getattr(theirs, key), key
