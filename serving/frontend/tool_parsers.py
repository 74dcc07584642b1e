"""How a model writes a tool call in free text: one parser per format, for ``tool_choice: auto``.

A model calls tools in the format its chat template taught it, so the format is a property of
the model (vLLM's and Triton's front ends take it as ``--tool-call-parser``; here it is the
front end's default or the model's ``tool_call_parser`` parameter in ``config.pbtxt``, which
the portal writes from the version's setting, :data:`serving.package.TOOL_CALL_PARSERS`):

- ``hermes`` (Qwen 2.5/3, Hermes, the demo model): ``<tool_call>{"name", "arguments"}</tool_call>``
  blocks anywhere in the text;
- ``llama3_json`` (Llama 3.1/3.2/3.3 with JSON tool calling): the whole answer is one or more
  ``{"name", "parameters"}`` objects separated by ``;``, optionally after ``<|python_tag|>``;
- ``mistral``: text, then ``[TOOL_CALLS]`` and either a JSON array of ``{"name", "arguments"}``
  (tokenizers before v11) or ``name{arguments}`` / ``name[ARGS]{arguments}`` repeated (v11+).

A parser is fed text piece by piece and gives back, in order, the segments it is sure of: plain
content, and *candidates*, the raw text of a would-be call with the object parsed from it (or
None). The reader (:class:`serving.frontend.tools.ToolCallReader`) decides which candidates are
calls; the others go back into the content as written, where they were.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Protocol

PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"

DEFAULT_PARSER = "hermes"


class Segment(NamedTuple):
    text: str  # as the model wrote it
    candidate: bool = False  # a would-be call (else plain content)
    parsed: Any = None  # a candidate's call object(s), None when its text is not JSON


def _content(text: str) -> list[Segment]:
    return [Segment(text)] if text else []


class ToolParser(Protocol):
    # Whether the format's marker is a special token, so the text must keep special tokens.
    needs_special_tokens: bool

    def feed(self, text: str) -> list[Segment]: ...

    def finish(self) -> list[Segment]: ...


class HermesParser:
    needs_special_tokens = False

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> list[Segment]:
        out: list[Segment] = []
        self._pending += text
        while True:
            start = self._pending.find(HERMES_OPEN)
            if start < 0:
                cut = len(self._pending) - partial_suffix(self._pending, HERMES_OPEN)
                out += _content(self._pending[:cut])
                self._pending = self._pending[cut:]
                return out
            out += _content(self._pending[:start])
            self._pending = self._pending[start:]
            end = self._pending.find(HERMES_CLOSE)
            if end < 0:
                return out
            block = self._pending[: end + len(HERMES_CLOSE)]
            inner = self._pending[len(HERMES_OPEN) : end]
            out.append(Segment(block, True, json_or_none(inner.strip())))
            self._pending = self._pending[end + len(HERMES_CLOSE) :]

    def finish(self) -> list[Segment]:
        rest, self._pending = self._pending, ""  # an unclosed block is content
        return _content(rest)


class _WholeAnswerParser:
    """Formats where calls take the rest of the answer once a marker is seen: text before the
    marker streams as content; after it, everything is held until the end and parsed whole."""

    needs_special_tokens = True
    marker = ""
    at_start_only = False

    def __init__(self) -> None:
        self._pending = ""
        self._calls_started = False
        self._content_started = False

    def feed(self, text: str) -> list[Segment]:
        self._pending += text
        if self._calls_started:
            return []
        if self.at_start_only and self._content_started:
            out, self._pending = self._pending, ""
            return _content(out)
        at = self._start_of_calls(self._pending)
        if at is not None:
            self._calls_started = True
            content, self._pending = self._pending[:at], self._pending[at:]
            return _content(content)
        if self.at_start_only:
            stripped = self._pending.lstrip()
            if not stripped or self.marker.startswith(stripped):
                return []  # could still become the marker
            self._content_started = True
            out, self._pending = self._pending, ""
            return _content(out)
        cut = len(self._pending) - partial_suffix(self._pending, self.marker)
        content, self._pending = self._pending[:cut], self._pending[cut:]
        return _content(content)

    def finish(self) -> list[Segment]:
        rest, self._pending = self._pending, ""
        if not self._calls_started:
            return _content(rest)
        return [Segment(rest, True, self._parse(rest))]

    def _start_of_calls(self, text: str) -> int | None:
        at = text.find(self.marker)
        return at if at >= 0 else None

    def _parse(self, text: str) -> Any:
        raise NotImplementedError


class Llama3JsonParser(_WholeAnswerParser):
    marker = PYTHON_TAG
    at_start_only = True

    def _start_of_calls(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith((PYTHON_TAG, "{")):
            return len(text) - len(stripped)
        return None

    def _parse(self, text: str) -> Any:
        """A list of call objects (one per ``;``-separated JSON object), or None."""
        text = text.strip().removeprefix(PYTHON_TAG).strip()
        decoder = json.JSONDecoder()
        calls, at = [], 0
        try:
            while at < len(text):
                obj, end = decoder.raw_decode(text, at)
                calls.append(obj)
                at = end
                while at < len(text) and text[at] in "; \n\t":
                    at += 1
        except json.JSONDecodeError:
            return None
        return calls


class MistralParser(_WholeAnswerParser):
    marker = MISTRAL_TAG

    def _parse(self, text: str) -> Any:
        body = text.removeprefix(MISTRAL_TAG).strip()
        if body.startswith("["):
            return json_or_none(body)
        decoder = json.JSONDecoder()
        calls = []
        for part in body.split(MISTRAL_TAG):  # v11+: name{...} or name[ARGS]{...}, repeated
            part = part.strip()
            brace = part.find("{")
            if brace <= 0:
                return None
            name = part[:brace].removesuffix(MISTRAL_ARGS).strip()
            try:
                arguments, end = decoder.raw_decode(part, brace)
            except json.JSONDecodeError:
                return None
            if part[end:].strip():
                return None
            calls.append({"name": name, "arguments": arguments})
        return calls


PARSERS: dict[str, type[HermesParser] | type[_WholeAnswerParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
# Triton's OpenAI front end calls the Llama 3 parser "llama3".
ALIASES = {"llama3": "llama3_json"}


def parser_name(name: str) -> str:
    """The canonical parser name, or ValueError listing the known ones."""
    name = ALIASES.get(name, name)
    if name not in PARSERS:
        known = ", ".join(sorted([*PARSERS, *ALIASES]))
        raise ValueError(f"unknown tool call parser {name!r} (known: {known})")
    return name


def new_parser(name: str) -> ToolParser:
    return PARSERS[parser_name(name)]()


def json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def partial_suffix(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
