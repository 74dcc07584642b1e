"""Reading tool calls out of generated text, and the schema that forces them: pure functions,
checked without an engine."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from serving.frontend.protocol import ChatCompletionRequest
from serving.frontend.tool_parsers import PARSERS
from serving.frontend.tools import ToolCallReader, forced_schema
from serving.package import TOOL_CALL_PARSERS

PARAMS = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["q"],
}
TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": PARAMS}},
    {"type": "function", "function": {"name": "noop"}},
]


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    return ChatCompletionRequest.model_validate({**body, **fields})


def read_in_pieces(reader: ToolCallReader, text: str, size: int) -> tuple[str, list[Any]]:
    """Content and calls of ``text`` fed ``size`` characters at a time."""
    content, calls = "", []
    for start in range(0, len(text), size):
        out = reader.feed(text[start : start + size])
        content += out.content
        calls += out.calls
    rest = reader.finish()
    return content + rest.content, calls + rest.calls


AUTO_TEXT = (
    'Sure. <tool_call>{"name": "search", "arguments": {"q": "a \\"<tool_call>\\" b"}}</tool_call>'
    ' and <tool_call>{"name": "noop", "arguments": {}}</tool_call> <tool_call>not json'
    "</tool_call> <tool_"
)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, 1000])
def test_auto_reads_the_same_calls_whatever_the_pieces(size: int) -> None:
    content, calls = read_in_pieces(ToolCallReader(request()), AUTO_TEXT, size)
    assert content == "Sure.  and  <tool_call>not json</tool_call> <tool_"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("search", {"q": 'a "<tool_call>" b'}),
        ("noop", {}),
    ]


def test_auto_unfinished_block_is_content() -> None:
    reader = ToolCallReader(request())
    assert reader.feed('x <tool_call>{"name": "noop"').content == "x "
    assert reader.finish().content == '<tool_call>{"name": "noop"'
    assert reader.all_calls() == []


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_required_array_elements_become_calls_as_they_complete(size: int) -> None:
    text = json.dumps(
        [
            {"name": "search", "parameters": {"q": 'x}]"{', "n": 2}},
            {"name": "noop", "parameters": {}},
        ],
        separators=(",", ":"),
    )
    reader = ToolCallReader(request(tool_choice="required"))
    content, calls = read_in_pieces(reader, text, size)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("search", {"q": 'x}]"{', "n": 2}),
        ("noop", {}),
    ]
    assert len({c.id for c in calls}) == 2


def test_named_mode_passes_arguments_through() -> None:
    choice = {"type": "function", "function": {"name": "search"}}
    reader = ToolCallReader(request(tool_choice=choice))
    assert reader.feed('{"q":').arguments == '{"q":'
    reader.feed('"z"}')
    (call,) = reader.all_calls()
    assert (call.name, call.arguments) == ("search", '{"q":"z"}')


def test_forced_schema_for_required_accepts_calls_and_refuses_others() -> None:
    schema = forced_schema(request(tool_choice="required"))
    assert schema is not None
    jsonschema.validate([{"name": "search", "parameters": {"q": "a"}}], schema)
    jsonschema.validate(
        [{"name": "noop", "parameters": {}}, {"name": "search", "parameters": {"q": "b"}}], schema
    )
    for bad in ([], [{"name": "search", "parameters": {}}], [{"name": "other", "parameters": {}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_forced_schema_single_call_and_lifted_defs() -> None:
    with_defs = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/point"}},
        "required": ["p"],
        "$defs": {"point": {"type": "array", "items": {"type": "number"}, "maxItems": 2}},
    }
    tools = [{"type": "function", "function": {"name": "plot", "parameters": with_defs}}]
    schema = forced_schema(request(tools=tools, tool_choice="required", parallel_tool_calls=False))
    assert schema is not None and schema["maxItems"] == 1 and "point" in schema["$defs"]
    jsonschema.validate([{"name": "plot", "parameters": {"p": [1, 2]}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "plot", "parameters": {"p": [1, 2, 3]}}], schema)


def test_no_forced_schema_for_auto_and_none() -> None:
    assert forced_schema(request()) is None
    assert forced_schema(request(tool_choice="none")) is None
    assert forced_schema(request(tools=None)) is None


LLAMA_TEXT = (
    '<|python_tag|>{"name": "search", "parameters": {"q": "x;y"}}; '
    '{"name": "noop", "parameters": {}}'
)


@pytest.mark.parametrize("size", [1, 3, 1000])
@pytest.mark.parametrize("text", [LLAMA_TEXT, LLAMA_TEXT.removeprefix("<|python_tag|>")])
def test_llama3_json_calls_take_the_whole_answer(size: int, text: str) -> None:
    content, calls = read_in_pieces(ToolCallReader(request(), "llama3_json"), text, size)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("search", {"q": "x;y"}),
        ("noop", {}),
    ]


@pytest.mark.parametrize("size", [1, 1000])
def test_llama3_json_text_answers_and_unknown_functions_stay_content(size: int) -> None:
    for text in ("Hello <|python_tag|> there", '{"name": "other", "parameters": {}}', "{oops"):
        content, calls = read_in_pieces(ToolCallReader(request(), "llama3_json"), text, size)
        assert (content, calls) == (text, [])


@pytest.mark.parametrize("size", [1, 2, 1000])
@pytest.mark.parametrize(
    "text",
    [
        'Let me look. [TOOL_CALLS][{"name": "search", "arguments": {"q": "a"}}, '
        '{"name": "noop", "arguments": {}}]',
        'Let me look. [TOOL_CALLS]search[ARGS]{"q": "a"}[TOOL_CALLS]noop{}',
    ],
)
def test_mistral_calls_in_both_tokenizer_generations(size: int, text: str) -> None:
    content, calls = read_in_pieces(ToolCallReader(request(), "mistral"), text, size)
    assert content == "Let me look. "
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("search", {"q": "a"}),
        ("noop", {}),
    ]


def test_mistral_broken_calls_are_content() -> None:
    text = "Hmm [TOOL_CALLS]search{not json"
    content, calls = read_in_pieces(ToolCallReader(request(), "mistral"), text, 4)
    assert (content, calls) == (text, [])


def test_unknown_parser_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hermes, llama3, llama3_json, mistral"):
        ToolCallReader(request(), "pythonic")


def test_the_package_writer_knows_the_same_formats() -> None:
    assert tuple(PARSERS) == TOOL_CALL_PARSERS
