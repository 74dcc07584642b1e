"""Tool calling on ``/v1/chat/completions``, as OpenAI and vLLM's OpenAI server serve it.

Three ways a request can ask for calls, and how each is made to hold:

- ``tool_choice`` ``"required"`` or a named function: the output is *constrained* by a JSON schema
  built from the functions' own parameter schemas (:func:`forced_schema`, the same shape vLLM
  uses), so even a random-weights model returns well-formed calls whose arguments validate.
  A named function's output is its arguments object; ``required`` produces a JSON array of
  ``{"name", "parameters"}`` objects (at most one when ``parallel_tool_calls`` is false).
- ``"auto"`` (the default when tools are given): the model is free, and calls are recognised in
  its text in the Hermes format most open chat templates teach (Qwen 2.5/3, Hermes, the demo
  model): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Text outside those tags
  is the message content; a block that is not a JSON object naming a known function stays
  content, as vLLM's Hermes parser leaves it.
- ``"none"``: tools are shown to the template but the output is plain content.

:class:`ToolCallReader` reads calls out of the text incrementally, so streamed and whole
responses come from the same code.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from serving.frontend.errors import bad_request
from serving.frontend.protocol import ChatCompletionRequest, NamedToolChoice
from serving.frontend.tool_parsers import Segment, json_or_none, new_parser

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tool_mode(request: ChatCompletionRequest) -> Mode:
    """OpenAI's default: ``auto`` when tools are given, ``none`` otherwise."""
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return "named"
    if choice is None:
        return "auto" if request.tools else "none"
    return choice


def check_tools(request: ChatCompletionRequest) -> None:
    """Every tool-calling field a request could get wrong, refused with a 400 naming it."""
    tools = request.tools or []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in names:
            raise bad_request(
                f"tools[{i}].function.name {name!r} is given twice", f"tools[{i}].function.name"
            )
        names.add(name)
        if tool.function.parameters is not None:
            _check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    choice = request.tool_choice
    if choice not in (None, "none") and not tools:
        raise bad_request("tool_choice needs tools", "tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad_request(
            f"tool_choice names function {choice.function.name!r}, which is not in tools",
            "tool_choice.function.name",
        )
    if request.parallel_tool_calls is not None and not tools:
        raise bad_request("parallel_tool_calls needs tools", "parallel_tool_calls")
    _check_messages(request)


def _check_schema(schema: dict[str, Any], param: str) -> None:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise bad_request(f"{param} is not a valid JSON schema: {exc.message}", param) from None
    if schema.get("type", "object") != "object":
        raise bad_request(f"{param} must describe an object (type: object)", param)


def _check_messages(request: ChatCompletionRequest) -> None:
    """Tool results must answer a call an earlier assistant message made; assistant calls must
    carry JSON-object arguments (they are handed to the chat template as objects)."""
    call_ids: set[str] = set()
    for i, message in enumerate(request.messages):
        if message.role == "assistant":
            for j, call in enumerate(message.tool_calls or []):
                where = f"messages[{i}].tool_calls[{j}].function.arguments"
                try:
                    arguments = json.loads(call.function.arguments)
                except json.JSONDecodeError as exc:
                    raise bad_request(f"{where} is not JSON: {exc.msg}", where) from None
                if not isinstance(arguments, dict):
                    raise bad_request(f"{where} must be a JSON object", where)
                call_ids.add(call.id)
        elif message.tool_calls:
            raise bad_request(
                "only assistant messages carry tool_calls", f"messages[{i}].tool_calls"
            )
        if message.role == "tool":
            if not message.tool_call_id:
                raise bad_request(
                    "a tool message needs tool_call_id", f"messages[{i}].tool_call_id"
                )
            if message.tool_call_id not in call_ids:
                raise bad_request(
                    f"messages[{i}].tool_call_id {message.tool_call_id!r} answers no tool call "
                    "of an earlier assistant message",
                    f"messages[{i}].tool_call_id",
                )
        elif message.tool_call_id is not None:
            raise bad_request(
                "only tool messages carry tool_call_id", f"messages[{i}].tool_call_id"
            )


def forced_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema the output must follow when calls are forced (``required`` or named),
    else None. ``$defs`` of every function are lifted to the top, where ``$ref`` finds them."""
    mode = tool_mode(request)
    tools = request.tools or []
    if mode == "named":
        assert isinstance(request.tool_choice, NamedToolChoice)
        wanted = request.tool_choice.function.name
        tool = next(t for t in tools if t.function.name == wanted)
        return dict(tool.function.parameters or EMPTY_PARAMETERS)
    if mode != "required":
        return None
    defs: dict[str, Any] = {}
    variants = []
    for tool in tools:
        parameters = dict(tool.function.parameters or EMPTY_PARAMETERS)
        defs.update(parameters.pop("$defs", {}))
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def template_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The ``tools`` argument of the chat template: OpenAI's tool objects, as HF expects them."""
    if not request.tools:
        return None
    return [tool.model_dump(exclude_none=True) for tool in request.tools]


def template_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` for the chat template: arguments as an object (templates render
    them with ``tojson``; a string would be quoted twice), as vLLM passes them."""
    out = []
    for call in calls:
        function = dict(call["function"])
        function["arguments"] = json.loads(function["arguments"])
        out.append({**call, "function": function})
    return out


# -- reading calls out of generated text -----------------------------------------------------


@dataclass
class ReadOut:
    """What a piece of generated text added: message content and finished calls."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    arguments: str = ""  # named mode: more of the one call's arguments

    def __bool__(self) -> bool:
        return bool(self.content or self.calls or self.arguments)


class ToolCallReader:
    """Turns a choice's generated text, fed piece by piece, into content and tool calls.

    ``parser`` is the model's call format under ``auto`` (:mod:`serving.frontend.tool_parsers`)."""

    def __init__(self, request: ChatCompletionRequest, parser: str = "hermes") -> None:
        self.mode = tool_mode(request)
        self.known = {t.function.name for t in request.tools or []}
        self.named: ToolCall | None = None
        if self.mode == "named":
            assert isinstance(request.tool_choice, NamedToolChoice)
            self.named = ToolCall(new_call_id(), request.tool_choice.function.name, "")
        self.announced = False  # named mode, streaming: the call's id and name were sent
        self.calls: list[ToolCall] = []
        self._parser = new_parser(parser)
        self._array = _ArrayElements()

    def feed(self, text: str) -> ReadOut:
        if self.mode == "none":
            return ReadOut(content=text)
        if self.mode == "named":
            assert self.named is not None
            self.named = ToolCall(self.named.id, self.named.name, self.named.arguments + text)
            return ReadOut(arguments=text)
        if self.mode == "required":
            calls = [c for c in map(self._call, self._array.feed(text)) if c is not None]
            self.calls += calls
            return ReadOut(calls=calls)
        return self._read(self._parser.feed(text))

    def finish(self) -> ReadOut:
        """The end of the text: what the parser held back is resolved (an unfinished call is
        content after all)."""
        if self.mode == "auto":
            return self._read(self._parser.finish())
        return ReadOut()

    def all_calls(self) -> list[ToolCall]:
        if self.named is not None:
            return [self.named]
        return list(self.calls)

    def _read(self, segments: list[Segment]) -> ReadOut:
        out = ReadOut()
        for segment in segments:
            objects = segment.parsed if isinstance(segment.parsed, list) else [segment.parsed]
            calls = [self._call(obj) for obj in objects] if segment.candidate else []
            found = [c for c in calls if c is not None]
            if not found or len(found) != len(calls):
                out.content += segment.text  # not calls to known functions: text as written
                continue
            self.calls += found
            out.calls += found
        return out

    def _call(self, element: Any) -> ToolCall | None:
        if not isinstance(element, dict) or element.get("name") not in self.known:
            return None
        arguments = element.get("parameters", element.get("arguments", {}))
        if not isinstance(arguments, dict):
            return None
        return ToolCall(new_call_id(), element["name"], json.dumps(arguments, ensure_ascii=False))


class _ArrayElements:
    """The elements of a top-level JSON array, each as soon as its text is complete.

    A scanner that only tracks nesting depth and strings: the array itself was produced under a
    JSON-schema constraint, so it is well-formed; this only finds where each element ends."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._element: list[str] = []

    def feed(self, text: str) -> list[Any]:
        done = []
        for char in text:
            if self._depth >= 2 or (self._depth == 1 and char not in ",]" and not char.isspace()):
                self._element.append(char)
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                continue
            if char == '"':
                self._in_string = True
            elif char in "[{":
                self._depth += 1
            elif char in "]}":
                self._depth -= 1
                if self._depth == 1 and self._element:
                    done.append(json_or_none("".join(self._element)))
                    self._element = []
        return done
