"""Penalties, ``logit_bias`` and ``min_p`` end to end: the official ``openai`` client (sync and
async, streaming and not) → ``serving.frontend`` → KServe v2 gRPC → the CPU engine with the
random-weights demo model. Each test checks the effect on the generated tokens, which the demo
tokenizer (loaded here) turns into exact expected text."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from serving.frontend.catalog import load_tokenizer
from tests.serving.conftest import MODEL_NAME, error_of, greedy
from tests.serving.frontend_helpers import Frontend

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

PROMPT = "The quick brown fox"
TOKEN = 300  # an ordinary (non-special) token of the demo vocabulary


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    return load_tokenizer(demo_model_dir)


def _tokens(client: openai.OpenAI, max_tokens: int = 24, **extra: Any) -> list[str]:
    """The generated tokens, as text, of a greedy completion of PROMPT (EOS ignored)."""
    response = client.completions.create(
        **greedy(prompt=PROMPT, max_tokens=max_tokens),
        logprobs=0,
        extra_body={"ignore_eos": True, **extra},
    )
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert len(logprobs.tokens) == max_tokens
    return logprobs.tokens


def _repeats(tokens: list[str]) -> int:
    return len(tokens) - len(set(tokens))


# -- logit_bias -------------------------------------------------------------------------------


def test_logit_bias_plus_100_makes_every_token_that_one(
    client: openai.OpenAI, tokenizer: Any
) -> None:
    expected = tokenizer.decode([TOKEN] * 6)
    bias = {str(TOKEN): 100}
    completion = client.completions.create(
        **greedy(prompt=PROMPT, max_tokens=6), logit_bias=bias, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].text == expected
    stream = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Hi"}], max_tokens=6),
        logit_bias=bias,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == expected


def test_logit_bias_through_the_async_client(front: Frontend, tokenizer: Any) -> None:
    other = TOKEN + 1
    expected = tokenizer.decode([other] * 5)

    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120
        ) as aclient:
            chat = await aclient.chat.completions.create(
                **greedy(messages=[{"role": "user", "content": "Hi"}], max_tokens=5),
                logit_bias={str(other): 100},
                extra_body={"ignore_eos": True},
            )
            stream = await aclient.completions.create(
                **greedy(prompt=PROMPT, max_tokens=5),
                logit_bias={str(other): 100},
                stream=True,
                extra_body={"ignore_eos": True},
            )
            text = "".join([c.choices[0].text async for c in stream if c.choices])
            return chat.choices[0].message.content or "", text

    chat_text, streamed = asyncio.run(run())
    assert chat_text == expected and streamed == expected


def test_logit_bias_minus_100_on_the_greedy_token_changes_it(
    client: openai.OpenAI, tokenizer: Any
) -> None:
    first = _tokens(client, max_tokens=1)[0]
    # Every id that decodes to that text (the demo vocabulary has no duplicates, but be exact).
    banned = {str(i): -100 for i in range(len(tokenizer)) if tokenizer.decode([i]) == first}
    assert banned
    assert _tokens(client, max_tokens=1, logit_bias=banned)[0] != first


def test_logit_bias_and_a_constraint_together(client: openai.OpenAI, tokenizer: Any) -> None:
    """Both travel in extra_args: the bias moves the pick among the tokens the constraint
    allows, and a token it does not allow stays out however large its bias."""
    allowed, favoured, masked = TOKEN, TOKEN + 1, TOKEN + 2
    completion = client.completions.create(
        **greedy(prompt=PROMPT, max_tokens=5),
        logit_bias={str(favoured): 90, str(masked): 100},
        extra_body={
            "ignore_eos": True,
            "vllm_xargs": {"constraint": {"allowed_tokens": [allowed, favoured]}},
        },
    )
    assert completion.choices[0].text == tokenizer.decode([favoured] * 5)


# -- penalties --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 5.0}, {"frequency_penalty": 2.0}, {"presence_penalty": 2.0}],
    ids=lambda p: next(iter(p)),
)
def test_a_strong_penalty_repeats_fewer_tokens(client: openai.OpenAI, penalty: Any) -> None:
    plain = _tokens(client)
    assert _repeats(plain) > 3, plain  # the random model repeats itself when left alone
    penalized = _tokens(client, **penalty)
    assert _repeats(penalized) < _repeats(plain), (plain, penalized)


def test_penalties_stream_the_same_tokens(client: openai.OpenAI) -> None:
    body = greedy(prompt=PROMPT, max_tokens=16)
    extra = {"ignore_eos": True, "repetition_penalty": 1.5}
    whole = client.completions.create(**body, frequency_penalty=1.0, extra_body=extra)
    stream = client.completions.create(**body, frequency_penalty=1.0, stream=True, extra_body=extra)
    assert "".join(c.choices[0].text for c in stream if c.choices) == whole.choices[0].text
    plain = client.completions.create(**body, extra_body={"ignore_eos": True})
    assert whole.choices[0].text != plain.choices[0].text


# -- min_p ------------------------------------------------------------------------------------


def test_min_p_one_at_temperature_one_is_greedy(client: openai.OpenAI) -> None:
    greedy_tokens = _tokens(client, max_tokens=12)
    for seed in (1, 2, 3):
        response = client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            logprobs=0,
            extra_body={"ignore_eos": True, "min_p": 1.0},
        )
        logprobs = response.choices[0].logprobs
        assert logprobs is not None and logprobs.tokens == greedy_tokens
    # Without min_p the same seeds sample something else (so the check above can fail).
    free = [
        client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            logprobs=0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .logprobs
        for seed in (1, 2, 3)
    ]
    assert any(lp is not None and lp.tokens != greedy_tokens for lp in free)


# -- top_logprobs up to the model's limit -----------------------------------------------------


def test_top_logprobs_up_to_the_models_max_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        **greedy(messages=[{"role": "user", "content": "Hi"}], max_tokens=2),
        logprobs=True,
        top_logprobs=20,
    )
    content = response.choices[0].logprobs
    assert content is not None and content.content is not None
    assert all(len(token.top_logprobs) == 20 for token in content.content)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            **greedy(messages=[{"role": "user", "content": "Hi"}], max_tokens=2),
            logprobs=True,
            top_logprobs=21,
        )
    assert "at most 20" in error_of(info.value)["message"]


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 150}}, "logit_bias.5"),
        ({"logit_bias": {"5": -100.5}}, "logit_bias.5"),
        # Outside the demo model's 512 tokens: refused by the front end, as vLLM's server does.
        ({"logit_bias": {"512": 1}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bad_sampling_values_are_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str, endpoint: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], **fields
            )
        else:
            client.completions.create(model=MODEL_NAME, prompt="hi", **fields)
    error = error_of(info.value)
    assert error["param"] == param, error
    assert param.split(".")[0] in error["message"]
    if fields == {"logit_bias": {"512": 1}}:
        # The front end's own check (the engine's refusal would name sampling_parameters):
        # on tritonserver the plugin that applies the bias cannot refuse it.
        assert error["message"] == (
            "logit_bias: token id(s) [512] are outside the vocabulary (size 512)"
        )
