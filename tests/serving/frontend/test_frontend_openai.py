"""The front end end to end: the official ``openai`` client → ``serving.frontend`` (its own
process) → KServe v2 gRPC → ``serving.kserve`` with the random-weights demo model.

With random weights only the engine's constraints can make output valid JSON or one of a list
of choices, so those tests check what the caller gets, and ``finish_reason`` as reported.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.serving.conftest import MODEL_NAME, error_of, greedy
from tests.serving.frontend_helpers import (
    Engine,
    Frontend,
    dead_engine_args,
    frontend,
)

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

CHOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "enum": [1, 2, 3]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["a", "b"]},
            "maxItems": 2,
        },
        "name": {"type": "string", "maxLength": 4},
    },
    "required": ["color", "size", "tags", "name"],
    "additionalProperties": False,
}


# -- models and health ------------------------------------------------------------------------


def test_models_health_and_metrics(client: openai.OpenAI, front: Frontend) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert error_of(info.value)["param"] == "model"
    assert httpx.get(front.url + "/health/live").status_code == 200
    assert httpx.get(front.url + "/health/ready").status_code == 200
    metrics = httpx.get(front.url + "/metrics")
    assert metrics.status_code == 200 and "# TYPE" in metrics.text


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert error_of(info.value)["code"] == "model_not_found"


# -- chat and completions ---------------------------------------------------------------------


def test_chat_completion_with_usage_and_length_finish(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Hello there"}], max_tokens=5),
        extra_body={"ignore_eos": True},
    )
    (choice,) = response.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert response.usage is not None
    assert response.usage.completion_tokens == 5
    assert response.usage.prompt_tokens > 3  # the chat template wraps the message
    assert response.usage.total_tokens == response.usage.prompt_tokens + 5


def test_streaming_equals_whole_response_for_greedy_decoding(client: openai.OpenAI) -> None:
    body = greedy(prompt="The quick brown fox", max_tokens=12, seed=3)
    whole = client.completions.create(**body, extra_body={"ignore_eos": True})
    chunks = list(
        client.completions.create(
            **body,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert whole.usage is not None and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streaming_chat_chunks(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=6),
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 6


def test_n_choices_with_seed(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL_NAME,
        prompt="Once upon a time",
        n=2,
        seed=11,
        temperature=1.0,
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in response.choices) == [0, 1]
    assert response.usage is not None and response.usage.completion_tokens == 8
    again = client.completions.create(
        model=MODEL_NAME,
        prompt="Once upon a time",
        n=2,
        seed=11,
        temperature=1.0,
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    # Each choice has its own derived seed, so the same request gives the same choices.
    assert [c.text for c in again.choices] == [c.text for c in response.choices]


def test_several_prompts_in_one_completion_request(client: openai.OpenAI) -> None:
    response = client.completions.create(
        **greedy(prompt=["first prompt", "second"], max_tokens=2), extra_body={"ignore_eos": True}
    )
    assert [c.index for c in response.choices] == [0, 1]
    single = client.completions.create(**greedy(prompt="second", max_tokens=2))
    assert response.usage is not None and single.usage is not None
    assert response.usage.completion_tokens == 4
    assert response.usage.prompt_tokens > single.usage.prompt_tokens


def test_stop_string_ends_the_text_before_it(client: openai.OpenAI) -> None:
    body = greedy(prompt="abc", max_tokens=24)
    text = client.completions.create(**body, extra_body={"ignore_eos": True}).choices[0].text
    assert len(text) >= 8, text
    stop = text[4:7]
    stopped = client.completions.create(**body, stop=[stop], extra_body={"ignore_eos": True})
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Hi"}], max_tokens=4),
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 4
    for token in logprobs.content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob)
    completion = client.completions.create(
        **greedy(prompt="Hi", max_tokens=3), logprobs=2, extra_body={"ignore_eos": True}
    )
    lp = completion.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert len(lp.tokens) == 3 and all(len(top) <= 2 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == completion.choices[0].text


def sampled(**fields: Any) -> dict[str, Any]:
    """Seeded sampling (not greedy): the sampled token is not always the most likely one, so the
    tests see the alternatives' order; the seed makes a stream and a whole response agree."""
    return {"model": MODEL_NAME, "temperature": 1.0, "seed": 7, **fields}


def streamed_completion_logprobs(
    client: openai.OpenAI, body: dict[str, Any]
) -> dict[int, dict[str, list[Any]]]:
    """Each choice's logprobs lists, concatenated over the stream's chunks."""
    out: dict[int, dict[str, list[Any]]] = {}
    stream = client.completions.create(**body, stream=True, extra_body={"ignore_eos": True})
    for chunk in stream:
        for choice in chunk.choices:
            lists = out.setdefault(choice.index, {"tokens": [], "offsets": [], "top": []})
            if choice.logprobs is not None:
                lists["tokens"] += choice.logprobs.tokens or []
                lists["offsets"] += choice.logprobs.text_offset or []
                lists["top"] += choice.logprobs.top_logprobs or []
    return out


def test_completion_logprobs_stream_as_the_whole_response(client: openai.OpenAI) -> None:
    """``text_offset`` counts from the start of each choice's text in a stream as in a whole
    response (vLLM's ``initial_text_offset``), and the alternatives are the same."""
    body = sampled(prompt="Offsets", max_tokens=12, n=2, logprobs=2)
    whole = client.completions.create(**body, extra_body={"ignore_eos": True})
    streamed = streamed_completion_logprobs(client, body)
    assert sorted(streamed) == [0, 1]
    for choice in whole.choices:
        lp = choice.logprobs
        assert lp is not None and lp.tokens and lp.text_offset and lp.top_logprobs
        assert len(lp.tokens) == 12
        assert lp.text_offset[0] == 0
        for i in range(1, len(lp.tokens)):
            assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])
        stream = streamed[choice.index]
        assert (stream["tokens"], stream["offsets"]) == (lp.tokens, lp.text_offset)
        # The same alternatives; their values may differ in the last float32 digits, as the two
        # requests' rows can be batched (and padded) differently.
        assert [set(top) for top in stream["top"]] == [set(top) for top in lp.top_logprobs]
        for got, want in zip(stream["top"], lp.top_logprobs, strict=True):
            assert got == pytest.approx(want, abs=1e-5)


def test_completion_logprobs_list_the_sampled_token_first(client: openai.OpenAI) -> None:
    """As vLLM: ``top_logprobs`` holds up to ``logprobs`` + 1 entries, the sampled token first;
    ``logprobs=0`` gives the sampled token alone (not an empty dict, not ``null``)."""
    for stream in (False, True):
        body = sampled(prompt="Zero", max_tokens=6, logprobs=0)
        if stream:
            lists = streamed_completion_logprobs(client, body)[0]
            tokens, tops = lists["tokens"], lists["top"]
        else:
            whole = client.completions.create(**body, extra_body={"ignore_eos": True})
            lp = whole.choices[0].logprobs
            assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
            tokens, tops = lp.tokens, lp.top_logprobs
            assert tops == [{t: v} for t, v in zip(tokens, lp.token_logprobs, strict=True)]
        assert len(tokens) == 6
        assert [list(top) for top in tops] == [[token] for token in tokens]
    three = client.completions.create(
        **sampled(prompt="Three", max_tokens=16, logprobs=3), extra_body={"ignore_eos": True}
    ).choices[0]
    lp = three.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 4 and next(iter(top)) == token
        if len(top) == 4:  # the sampled token was not among the 3 most likely
            assert logprob < min(list(top.values())[1:])


def test_chat_top_logprobs_start_with_the_sampled_token(client: openai.OpenAI) -> None:
    """As vLLM's chat server: ``top_logprobs`` = k entries, the sampled token first, then the
    most likely others; a stream carries the same ones."""
    body = sampled(
        messages=[{"role": "user", "content": "Hi"}], max_tokens=10, logprobs=True, top_logprobs=3
    )
    whole = client.chat.completions.create(**body, extra_body={"ignore_eos": True})
    content = whole.choices[0].logprobs.content if whole.choices[0].logprobs else None
    assert content is not None and len(content) == 10
    for token in content:
        assert len(token.top_logprobs) == 3
        assert (token.top_logprobs[0].token, token.top_logprobs[0].logprob) == (
            token.token,
            token.logprob,
        )
        others = [t.logprob for t in token.top_logprobs[1:]]
        assert others == sorted(others, reverse=True)
    stream = client.chat.completions.create(**body, stream=True, extra_body={"ignore_eos": True})
    streamed = [
        token
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content
        for token in chunk.choices[0].logprobs.content
    ]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]


def test_completion_logprobs_above_5_is_refused(client: openai.OpenAI) -> None:
    """OpenAI's limit for completions is 5 (chat's ``top_logprobs`` goes to 20)."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**greedy(prompt="Hi", max_tokens=2), logprobs=6)
    assert error_of(info.value)["param"] == "logprobs"
    five = client.completions.create(**greedy(prompt="Hi", max_tokens=2), logprobs=5)
    assert five.choices[0].logprobs is not None


def test_echo(client: openai.OpenAI) -> None:
    body = greedy(prompt="Echo me", max_tokens=3, echo=True)
    whole = client.completions.create(**body, extra_body={"ignore_eos": True})
    assert whole.choices[0].text.startswith("Echo me")
    streamed = client.completions.create(**body, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


# -- structured outputs -----------------------------------------------------------------------


def test_json_schema_response_format_validates(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Describe a thing"}], max_tokens=200),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": CHOICE_SCHEMA, "strict": True},
        },
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    value = json.loads(choice.message.content or "")
    jsonschema.validate(value, CHOICE_SCHEMA)


def test_sampled_json_schema_answers_with_string_lengths_are_valid_json(
    client: openai.OpenAI,
) -> None:
    """XGrammar's own rule for a string with maxLength lets raw control characters through
    (docs/xgrammar-control-characters.md); sampled at temperature 1 from random weights, many
    answers held one before the platform corrected the grammar."""
    schema = {
        "type": "object",
        "properties": {
            "note": {"type": "string", "maxLength": 12},
            "code": {"type": "string", "minLength": 1, "maxLength": 4},
        },
        "required": ["note", "code"],
        "additionalProperties": False,
    }
    stopped = 0
    for seed in (11, 211, 4011):
        response = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Write a note"}],
            max_tokens=80,
            temperature=1.0,
            n=8,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "note", "schema": schema, "strict": True},
            },
        )
        for choice in response.choices:
            if choice.finish_reason != "stop":
                continue
            stopped += 1
            jsonschema.validate(json.loads(choice.message.content or ""), schema)
    assert stopped >= 12


def test_json_object_response_format(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL_NAME,
        prompt="x",
        max_tokens=120,
        temperature=0.0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    choice = response.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.text), dict)
    else:  # honest report: a random model may keep emitting JSON until max_tokens
        assert choice.finish_reason == "length"
        assert choice.text.lstrip().startswith("{")


def test_vllm_xargs_choice_constraint(client: openai.OpenAI) -> None:
    choices = ["alpha", "beta", "gamma delta"]
    response = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Pick"}], max_tokens=20, n=2, seed=5),
        extra_body={"vllm_xargs": {"constraint": {"choice": choices}}},
    )
    for choice in response.choices:
        assert choice.message.content in choices
        assert choice.finish_reason == "stop"


def test_structured_outputs_request_field(client: openai.OpenAI) -> None:
    response = client.completions.create(
        **greedy(prompt="Code:", max_tokens=10),
        extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{2}"}},
    )
    text = response.choices[0].text
    assert len(text) == 6 and text[3] == "-" and text[:3].isupper() and text[4:].isdigit()


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"logit_bias": {"one": 5}}, "logit_bias"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "structural_tag"}}, "response_format.type"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
        ({"extra_body": {"no_such_parameter": 1}}, "no_such_parameter"),
        ({"temperature": 7}, "temperature"),
        ({"extra_body": {"vllm_xargs": {"constraint": {"choice": []}}}}, "vllm_xargs.constraint"),
    ],
)
def test_unsupported_parameters_are_400_naming_them(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], **fields
        )
    error = error_of(info.value)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param in error["message"]


def test_engine_refusal_is_400_with_its_message(client: openai.OpenAI) -> None:
    """A value only the engine can judge (a prompt beyond the model's context) → 400."""
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="word " * 5000, max_tokens=2)
    assert error_of(info.value)["message"]


# -- modes, engine down, drain ----------------------------------------------------------------


def test_standalone_mode_serves_only_health_and_metrics(
    model_repository: Path, engine: Engine
) -> None:
    with frontend(model_repository, engine.frontend_args, "--no-openai") as standalone:
        assert httpx.get(standalone.url + "/health/ready").status_code == 200
        assert httpx.get(standalone.url + "/metrics").status_code == 200
        assert httpx.get(standalone.url + "/v1/models").status_code == 404


def test_engine_down_is_503_and_not_ready(model_repository: Path) -> None:
    with frontend(model_repository, dead_engine_args(), wait_ready=False) as orphan:
        assert httpx.get(orphan.url + "/health/ready").status_code == 503
        client = openai.OpenAI(base_url=orphan.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
        assert info.value.status_code == 503


def test_sigterm_lets_a_streaming_request_finish(model_repository: Path, engine: Engine) -> None:
    with frontend(model_repository, engine.frontend_args) as draining:
        client = openai.OpenAI(base_url=draining.url + "/v1", api_key="x", max_retries=0)
        stream = client.completions.create(
            **greedy(prompt="Long story", max_tokens=40),
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        first = next(chunks)
        draining.process.send_signal(signal.SIGTERM)
        rest = list(chunks)
        reasons = [c.choices[0].finish_reason for c in [first, *rest]]
        assert reasons[-1] == "length"
        assert draining.process.wait(60) == 0


# -- observations for the canary analysis (serving.frontend.observations) ---------------------


def _observed(front: Frontend, after: int) -> list[dict[str, Any]]:
    answer = httpx.get(front.url + "/observations", params={"after": after})
    assert answer.status_code == 200
    return answer.json()["observations"]


def _last_seq(front: Frontend) -> int:
    return httpx.get(front.url + "/observations", params={"after": 0, "limit": 1}).json()["last"]


def test_each_request_is_observed_with_its_times_tokens_and_ending(
    client: openai.OpenAI, front: Frontend
) -> None:
    after = _last_seq(front)
    client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Hello"}], max_tokens=4),
        extra_body={"ignore_eos": True},
    )
    stream = client.completions.create(
        **greedy(prompt="Once upon", max_tokens=6, stream=True), extra_body={"ignore_eos": True}
    )
    assert len([chunk for chunk in stream]) >= 6
    whole, streamed = _observed(front, after)
    assert (whole["route"], whole["status"], whole["model"]) == ("chat", 200, MODEL_NAME)
    assert (whole["completion_tokens"], whole["finish_reason"]) == (4, "length")
    assert whole["ttft_s"] is None and whole["latency_s"] > 0  # nobody saw a first token early
    assert whole["greedy"] and not whole["structured"] and whole["prompt_tokens"] > 0
    assert (streamed["route"], streamed["status"], streamed["completion_tokens"]) == (
        "completions",
        200,
        6,
    )
    assert 0 < streamed["ttft_s"] <= streamed["latency_s"]
    assert streamed["tpot_s"] == pytest.approx((streamed["latency_s"] - streamed["ttft_s"]) / 5)
    assert streamed["seq"] == whole["seq"] + 1


def test_a_structured_answer_is_checked_against_its_schema(
    client: openai.OpenAI, front: Frontend
) -> None:
    after = _last_seq(front)
    schema_format = {"name": "thing", "schema": CHOICE_SCHEMA, "strict": True}
    client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "A thing"}], max_tokens=200),
        response_format={"type": "json_schema", "json_schema": schema_format},
    )
    # Cut short at 3 tokens, the same request's JSON cannot be whole: invalid, and said so.
    client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "A thing"}], max_tokens=3),
        response_format={"type": "json_schema", "json_schema": schema_format},
    )
    valid, cut = _observed(front, after)
    assert valid["structured"] and valid["structured_valid"] is True, valid
    assert cut["finish_reason"] == "length" and cut["structured_valid"] is False, cut
