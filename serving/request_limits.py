"""Bounds on what one request may make a serving process do.

A serving process (the OpenAI front end, the KServe HTTP server, the gateway) holds a request's
body in memory and hands its text to a tokenizer; an unbounded body or prompt lets one caller
take an instance's memory and CPU. These are the bounds every HTTP surface applies, each
answering in its own protocol's error shape:

- the body: at most ``SERVING_MAX_BODY_BYTES`` (``GATEWAY_MAX_BODY_BYTES`` at the gateway;
  default 16 MiB), refused from
  ``Content-Length`` before anything is read, or as soon as a chunked body passes the limit
  (413);
- JSON nesting: at most :data:`MAX_JSON_DEPTH` levels (400), checked on the raw bytes so that
  neither the parser nor any recursive walk over the parsed value meets a deep document;
- text: valid UTF-8 (400);
- a prompt: no longer than its model's context could hold (:func:`max_prompt_chars`), checked
  before it is tokenized (400).
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

MAX_BODY_ENV = "SERVING_MAX_BODY_BYTES"
GATEWAY_MAX_BODY_ENV = "GATEWAY_MAX_BODY_BYTES"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: Deeper than any request this platform takes (a JSON schema for structured output is the
#: deepest, a handful of levels), far below where Python's parser or a recursive walk fails.
MAX_JSON_DEPTH = 64

# A JSON string, escapes included (the unrolled form matches a long string without one step
# per character in the regex engine).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than this server's limit of {limit} bytes")
        self.limit = limit


class BadBody(ValueError):
    """A body (or JSON text inside one) refused before it is parsed: not UTF-8, or nested too
    deep."""


def max_body_bytes(variable: str = MAX_BODY_ENV) -> int:
    """The body limit configured in the environment (``SERVING_MAX_BODY_BYTES`` for an
    instance's servers); a bad value stops the start."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{variable} must be a number of bytes, got {raw!r}") from None
    if value < 1:
        raise SystemExit(f"{variable} must be at least 1, got {value}")
    return value


def json_depth(raw: bytes) -> int:
    """How deeply the JSON document ``raw`` nests arrays and objects, without parsing it.

    Strings are cut out first (a bracket inside one does not count); the rest is a running sum
    of openings and closings, computed in numpy so a 16 MiB body costs milliseconds. Invalid
    JSON gets some number back; the parser that runs next refuses it."""
    import numpy as np  # here, not at the top: the gateway imports this module without it

    stripped = _STRING.sub(b"", raw)
    codes = np.frombuffer(stripped, dtype=np.uint8)
    brackets = codes[np.isin(codes, _OPEN + _CLOSE)]
    if brackets.size == 0:
        return 0
    steps = np.where(np.isin(brackets, _OPEN), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def check_json_body(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> str:
    """``raw`` as text, once it is known to be UTF-8 and not nested deeper than ``max_depth``;
    :class:`BadBody` says which it is not."""
    text = check_utf8(raw, "the request body")
    check_json_depth(raw, "the request JSON", max_depth=max_depth)
    return text


def check_json_depth(raw: str | bytes, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """:class:`BadBody` naming ``what`` when the JSON text ``raw`` nests deeper than
    ``max_depth``: for JSON carried as a string inside a request (``sampling_parameters``),
    which the body's own check does not look into."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if json_depth(data) > max_depth:
        raise BadBody(f"{what} nests deeper than {max_depth} levels")


def check_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(f"{what} is not valid UTF-8 (byte {exc.start})") from None


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: (status, message) → a JSON error body in the protocol's own shape.
ErrorBody = Callable[[int, str], bytes]


class BoundedBody:
    """ASGI middleware: a request body over ``limit`` bytes never reaches the app.

    A declared ``Content-Length`` over the limit is answered 413 before the body is read; a body
    without one (chunked) is read up to the limit and answered 413 as soon as it passes it. The
    body the app then reads is the one already received (the app would read it whole anyway);
    later ``receive`` calls go to the server, so a disconnect is still seen.

    With ``check_json``, a non-empty body is also held to :func:`check_json_body` (400), for an
    app whose framework parses the JSON itself before any handler could look at it."""

    def __init__(
        self, app: ASGIApp, *, limit: int, error_body: ErrorBody, check_json: bool = False
    ) -> None:
        self.app = app
        self.limit = limit
        self.error_body = error_body
        self.check_json = check_json

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._answer(send, 413, str(BodyTooLarge(self.limit)))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([], message, receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._answer(send, 413, str(BodyTooLarge(self.limit)))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if self.check_json and body:
            try:
                check_json_body(body)
            except BadBody as exc:
                await self._answer(send, 400, str(exc))
                return
        await self.app(scope, _replay([body], None, receive), send)

    async def _answer(self, send: Send, status: int, message: str) -> None:
        content = self.error_body(status, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
        ]
        if status == 413:
            # The rest of the body is never read: the connection cannot carry another request.
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(bodies: list[bytes], pending: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives the buffered body first, then defers to the server's."""
    queue: list[Message] = [{"type": "http.request", "body": b, "more_body": False} for b in bodies]
    if pending is not None:
        queue.append(pending)

    async def replay() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replay


def max_prompt_chars(tokenizer: Any, max_model_len: int) -> int:
    """The most characters a prompt that fits ``max_model_len`` tokens can have.

    A token stands for at most as many characters of the text as its vocabulary entry has
    (byte-level BPE writes one character per byte, which is never fewer than the characters
    those bytes decode to; SentencePiece writes a space as one ``▁``; added tokens such as
    ``<|im_start|>`` are spelled out), so a text longer than ``max_model_len`` times the longest
    entry needs more tokens than the context holds. The one way round it is a normalizer that
    drops characters (control characters, or accents in uncased models): a prompt made mostly
    of those is refused although it might have fitted, a price worth not tokenizing megabytes
    for."""
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return max_model_len * max(longest, 1)
