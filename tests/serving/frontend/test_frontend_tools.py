"""Tool calling end to end: the official ``openai`` client (sync and async, streamed and not)
→ ``serving.frontend`` → KServe gRPC → the CPU engine with the random-weights demo model.

A random-weights model never decides to call a tool on its own, so forced calls (``required``,
a named function) are checked for what the constraint guarantees (well-formed calls whose
arguments validate), and ``auto`` is driven into a call with the platform's own constraint
(``vllm_xargs``), which fixes the text the model writes and leaves recognising the call to
the front end.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.serving.conftest import MODEL_NAME, write_repository
from tests.serving.frontend_helpers import Frontend

pytestmark = pytest.mark.slow  # starts engines or whole platforms: see ./dev test --fast

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


MISTRAL_MODEL = "demo--mistral"


@pytest.fixture(scope="module")
def frontend_repository(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Path:
    """The demo model twice: with the front end's default call format (Hermes), and as a model
    whose ``config.pbtxt`` says it writes calls in Mistral's format."""
    root = tmp_path_factory.mktemp("tools-repository")
    write_repository(root, demo_model_dir, max_num_seqs=8)
    parameters = {"tool_call_parser": "mistral"}
    write_repository(root, demo_model_dir, name=MISTRAL_MODEL, parameters=parameters)
    return root


def ask(client: openai.OpenAI, **fields: Any) -> Any:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 500}
    return client.chat.completions.create(**{**body, **fields})


def assert_valid_call(call: Any) -> dict[str, Any]:
    assert call.type == "function"
    assert call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_required_makes_well_formed_calls_whose_arguments_validate(client: openai.OpenAI) -> None:
    for seed in range(4):
        response = ask(client, tool_choice="required", seed=seed, temperature=1.0)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        calls = choice.message.tool_calls
        assert calls and len({c.id for c in calls}) == len(calls)
        for call in calls:
            assert_valid_call(call)


def test_parallel_tool_calls_false_makes_exactly_one_call(client: openai.OpenAI) -> None:
    for seed in range(3):
        response = ask(
            client, tool_choice="required", parallel_tool_calls=False, seed=seed, temperature=1.0
        )
        calls = response.choices[0].message.tool_calls
        assert calls is not None and len(calls) == 1
        assert_valid_call(calls[0])


def test_named_function_is_called_and_finishes_with_stop(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    response = ask(client, tool_choice=choice, seed=1, temperature=1.0)
    result = response.choices[0]
    assert result.finish_reason == "stop"  # OpenAI's (and vLLM's) rule for a named choice
    (call,) = result.message.tool_calls
    assert call.function.name == "get_time"
    assert assert_valid_call(call)["zone"] in ("UTC", "CET")


def test_auto_recognises_a_hermes_call_in_the_text(client: openai.OpenAI) -> None:
    force = {"constraint": {"choice": ["Let me check. " + CALL_TEXT]}}
    response = ask(client, tool_choice="auto", extra_body={"vllm_xargs": force})
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}


def test_auto_without_a_call_is_plain_content(client: openai.OpenAI) -> None:
    force = {"constraint": {"choice": ["It is sunny."]}}
    response = ask(client, extra_body={"vllm_xargs": force})  # auto is the default with tools
    choice = response.choices[0]
    assert choice.message.content == "It is sunny."
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"


def test_a_call_to_an_unknown_function_stays_content(client: openai.OpenAI) -> None:
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    response = ask(client, extra_body={"vllm_xargs": {"constraint": {"choice": [text]}}})
    assert response.choices[0].message.content == text
    assert response.choices[0].message.tool_calls is None


def test_a_model_configured_for_mistral_calls_is_read_in_that_format(
    client: openai.OpenAI,
) -> None:
    text = 'On it. [TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "CET"}}]'
    force = {"vllm_xargs": {"constraint": {"choice": [text]}}}
    response = ask(client, model=MISTRAL_MODEL, extra_body=force)
    choice = response.choices[0]
    assert choice.message.content == "On it. "
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("get_time", '{"zone": "CET"}')
    ]
    assert choice.finish_reason == "tool_calls"
    # The same text from a Hermes model is only text.
    plain = ask(client, extra_body=force).choices[0]
    assert plain.message.content == text and plain.message.tool_calls is None


def _streamed(client: openai.OpenAI, **fields: Any) -> tuple[str, dict[int, dict[str, str]], Any]:
    """Content, calls by index (id, name, joined arguments) and the finish reason of a stream."""
    content = ""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in ask(client, stream=True, **fields):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                if part.id:
                    assert not call["id"], "a call's id is sent once, in its first delta"
                    call["id"] = part.id
                if part.function and part.function.name:
                    call["name"] = part.function.name
                if part.function and part.function.arguments:
                    call["arguments"] += part.function.arguments
            finish = choice.finish_reason or finish
    return content, calls, finish


def test_streamed_calls_equal_whole_ones(client: openai.OpenAI) -> None:
    fields: dict[str, Any] = {"tool_choice": "required", "seed": 7, "temperature": 1.0}
    whole = ask(client, **fields).choices[0].message.tool_calls
    content, calls, finish = _streamed(client, **fields)
    assert content == ""
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_streamed_named_call_sends_arguments_in_pieces(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    content, calls, finish = _streamed(client, tool_choice=choice, seed=3, temperature=1.0)
    assert finish == "stop" and content == ""
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


def test_streamed_auto_call_holds_back_the_tag(client: openai.OpenAI) -> None:
    force = {"constraint": {"choice": ["Checking. " + CALL_TEXT + " Done."]}}
    content, calls, finish = _streamed(client, extra_body={"vllm_xargs": force})
    assert content == "Checking.  Done."
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Oslo"}
    assert finish == "tool_calls"


def test_tool_results_go_back_through_the_chat_template(client: openai.OpenAI) -> None:
    """A whole round trip: the call the model made and the tool's result, sent back."""
    first = ask(client, tool_choice="required", seed=2, temperature=1.0).choices[0].message
    assert first.tool_calls
    history = [
        *MESSAGES,
        first.model_dump(exclude_none=True),
        *(
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}
            for call in first.tool_calls
        ),
    ]
    force = {"constraint": {"choice": ["It is 21 degrees."]}}
    answer = ask(client, messages=history, extra_body={"vllm_xargs": force}).choices[0]
    assert answer.message.content == "It is 21 degrees."


def test_async_client_required(front: Frontend) -> None:
    async def main() -> Any:
        async with openai.AsyncOpenAI(
            base_url=front.url + "/v1", api_key="unused", max_retries=0
        ) as client:
            return await client.chat.completions.create(
                model=MODEL_NAME,
                messages=MESSAGES,
                tools=TOOLS,
                tool_choice="required",
                max_tokens=500,
                seed=5,
            )

    response = asyncio.run(main())
    for call in response.choices[0].message.tool_calls:
        assert_valid_call(call)


# -- bad input: a 400 naming the field --------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]},
            "tools[0].function.parameters",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, None),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, None),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        (
            {
                "messages": [
                    *MESSAGES,
                    {"role": "tool", "tool_call_id": "call_unknown", "content": "1"},
                ]
            },
            "messages[1].tool_call_id",
        ),
        (
            {
                "messages": [
                    *MESSAGES,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "get_time", "arguments": "{not json"},
                            }
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_tool_requests_are_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, **fields)
    body = info.value.body
    assert isinstance(body, dict)
    error = body.get("error", body)
    if param is None:  # pydantic's own message, or a nested name
        assert error["param"].startswith(("tool_choice", "tools[0].function.name"))
    else:
        assert error["param"] == param
    assert error["message"]
