"""The front end's observation ring and its checks, without an engine (the requests themselves
are observed end to end in test_frontend_openai.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from serving import rate_sampler
from serving.frontend.generation import Generation, _Choice
from serving.frontend.observations import ObservationLog, record_generation
from serving.frontend.protocol import ChatCompletionRequest
from serving.frontend.tools import ToolCallReader
from serving.gateway.proxy import upstream_of

FIELDS: dict[str, Any] = dict(
    at=0.0,
    model="m",
    route="chat",
    status=200,
    latency_s=0.1,
    ttft_s=None,
    tpot_s=None,
    prompt_tokens=1,
    completion_tokens=1,
    finish_reason="stop",
    empty=False,
    structured=False,
    structured_valid=None,
    greedy=False,
    error=None,
)


def test_the_ring_keeps_the_newest_and_a_late_reader_learns_how_many_it_lost():
    log = ObservationLog(capacity=3, per_second=100)
    for _ in range(5):
        log.add(**FIELDS)
    read = log.read(after=0)
    assert [o["seq"] for o in read["observations"]] == [3, 4, 5]
    assert (read["lost"], read["next"], read["last"]) == (2, 5, 5)
    assert log.read(after=5)["observations"] == [] and log.read(after=5)["next"] == 5
    paged = log.read(after=3, limit=1)
    assert [o["seq"] for o in paged["observations"]] == [4] and paged["lost"] == 0


def test_a_restarted_process_shows_as_last_below_the_readers_place():
    log = ObservationLog(capacity=10, per_second=100)
    log.add(**FIELDS)
    assert log.read(after=40)["last"] == 1  # the reader had read to 40 of an earlier process


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


def test_above_its_rate_a_random_share_is_kept(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(
        rate_sampler, "time", clock
    )  # the sampler's clock (serving/rate_sampler.py)
    random.seed(7)
    log = ObservationLog(capacity=10_000, per_second=10)
    first = sum(log.wanted() for _ in range(100))
    assert first == 100  # the first second: nothing to go by yet, all kept
    clock.now += 1
    second = sum(log.wanted() for _ in range(1000))
    assert 60 < second < 140  # 10 of the 100 seen last second: a tenth of these
    assert log.skipped == 1000 - second
    clock.now += 5  # a quiet gap: the next second keeps everything again
    assert all(log.wanted() for _ in range(10))


def _generation(texts: list[str], **request: Any) -> Generation:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **request}
    generation = Generation(ChatCompletionRequest.model_validate(body), "m", ["p"], 16)
    for index, text in enumerate(texts):
        choice = _Choice(index=index, prompt_index=0, text=[text], finish_reason="stop")
        if generation.request.tools:  # type: ignore[union-attr]
            choice.reader = ToolCallReader(generation.request, "hermes")  # type: ignore[arg-type]
            choice.reader.feed(text)
            choice.reader.finish()
        generation.choices[str(index)] = choice
    generation.completion_tokens = 5
    return generation


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}


@pytest.mark.parametrize(
    ("texts", "request_fields", "valid"),
    [
        (['{"n": 1}'], {"response_format": JSON_SCHEMA}, True),
        (['{"n": "one"}'], {"response_format": JSON_SCHEMA}, False),
        (['{"n": 1'], {"response_format": JSON_SCHEMA}, False),  # cut short
        (['{"n": 1}', "no"], {"response_format": JSON_SCHEMA, "n": 2}, False),  # any choice
        (['{"any": 1}'], {"response_format": {"type": "json_object"}}, True),
        (["[1]"], {"response_format": {"type": "json_object"}}, False),  # not an object
    ],
)
def test_structured_answers_are_checked_against_what_was_asked(texts, request_fields, valid):
    log = ObservationLog(capacity=10, per_second=100)
    observed = record_generation(log, _generation(texts, **request_fields), streamed=False)
    assert observed.structured and observed.structured_valid is valid


TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "parameters": SCHEMA},
    }
]


def test_tool_call_arguments_are_checked_against_the_tools_parameters():
    log = ObservationLog(capacity=10, per_second=100)
    call = '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>'
    bad = '<tool_call>{"name": "add", "arguments": {"n": "two"}}</tool_call>'
    good = record_generation(log, _generation([call], tools=TOOLS), streamed=False)
    wrong = record_generation(log, _generation([bad], tools=TOOLS), streamed=False)
    assert good.structured_valid is True and not good.empty
    assert wrong.structured_valid is False


def test_an_answer_without_text_or_calls_is_empty():
    log = ObservationLog(capacity=10, per_second=100)
    assert record_generation(log, _generation(["  "]), streamed=False).empty is True
    assert record_generation(log, _generation(["hi"]), streamed=False).empty is False


def test_the_gateway_never_forwards_a_caller_to_the_observations():
    assert upstream_of("observations") == ("openai", "v1/observations")
