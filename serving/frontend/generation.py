"""Engine responses → OpenAI completions and chat completions, whole or as SSE chunks.

``n`` choices per prompt run as separate engine requests (one stream, see
:mod:`serving.frontend.kserve_client`); ``usage`` adds up Triton's ``num_output_tokens`` (a
per-response count) and takes ``num_input_tokens`` once per prompt. ``finish_reason`` is the
engine's ("stop" or "length"); an engine that aborts a request answers 503, never a truncated
200 that looks complete.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from serving.frontend.errors import OpenAIError, engine_unavailable
from serving.frontend.kserve_client import EngineOutput, GenerateCall, KServeClient, TokenLogprobs
from serving.frontend.protocol import ChatCompletionRequest, CompletionRequest
from serving.frontend.tool_parsers import DEFAULT_PARSER, PARSERS
from serving.frontend.tools import ToolCallReader, tool_mode
from serving.frontend.translate import GenerationRequest, build_payload, logprobs_count


@dataclass
class _Choice:
    index: int
    prompt_index: int
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    # Chat requests with tools: reads content and calls out of the text (streamed or whole).
    reader: ToolCallReader | None = None
    # Streaming: the ``text_offset`` of the choice's next token (the characters of the tokens
    # already sent), so that a stream's offsets are the whole response's.
    next_text_offset: int = 0


@dataclass
class Generation:
    """One OpenAI request in flight: its engine calls and what has come back so far."""

    request: GenerationRequest
    model: str
    prompts: list[str]
    default_max_tokens: int
    tool_call_parser: str = DEFAULT_PARSER
    id: str = ""
    created: int = 0
    choices: dict[str, _Choice] = field(default_factory=dict)
    prompt_tokens: dict[int, int] = field(default_factory=dict)
    completion_tokens: int = 0
    #: When the request began and when the engine's first output came (time.monotonic()).
    started: float = field(default_factory=time.monotonic)
    first_output_at: float | None = None
    #: Called once a stream has ended, with the status it ended as (200; 500 for an error
    #: sent as the stream's last event; 499 when the caller left): the request's observation.
    on_stream_end: Callable[[Generation, int, str | None], object] | None = None

    def __post_init__(self) -> None:
        chat = isinstance(self.request, ChatCompletionRequest)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def calls(self) -> list[GenerateCall]:
        n = self.request.n
        calls = []
        # A format whose call marker is a special token needs the text to keep special tokens.
        keep_special = (
            isinstance(self.request, ChatCompletionRequest)
            and tool_mode(self.request) == "auto"
            and PARSERS[self.tool_call_parser].needs_special_tokens
        )
        for p, prompt in enumerate(self.prompts):
            for i in range(n):
                payload = build_payload(
                    self.request,
                    default_max_tokens=self.default_max_tokens,
                    index=i,
                    keep_special_tokens=keep_special,
                )
                request_id = f"{self.id}-{p * n + i}"
                choice = _Choice(index=p * n + i, prompt_index=p)
                if isinstance(self.request, ChatCompletionRequest) and self.request.tools:
                    choice.reader = ToolCallReader(self.request, self.tool_call_parser)
                self.choices[request_id] = choice
                calls.append(GenerateCall(request_id, prompt, payload))
        return calls

    def record(self, output: EngineOutput) -> _Choice:
        choice = self.choices.get(output.request_id)
        if choice is None:
            raise engine_unavailable(f"the engine answered an unknown request {output.request_id}")
        if output.finish_reason == "abort":
            raise engine_unavailable("the engine aborted the request (draining or stopped)")
        if self.first_output_at is None:
            self.first_output_at = time.monotonic()
        if output.num_input_tokens is not None:
            self.prompt_tokens[choice.prompt_index] = output.num_input_tokens
        self.completion_tokens += output.num_output_tokens
        choice.text.append(output.text)
        if output.logprobs:
            choice.logprobs.extend(output.logprobs)
        if output.finish_reason is not None:
            choice.finish_reason = output.finish_reason
        return choice

    def usage(self) -> dict[str, int]:
        prompt = sum(self.prompt_tokens.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }

    # -- whole responses ----------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        choices = sorted(self.choices.values(), key=lambda c: c.index)
        if isinstance(self.request, ChatCompletionRequest):
            body_choices = []
            for c in choices:
                message, finish_reason = _chat_message(c)
                body_choices.append(
                    {
                        "index": c.index,
                        "message": message,
                        "logprobs": self._chat_logprobs(c.logprobs),
                        "finish_reason": finish_reason,
                    }
                )
            kind = "chat.completion"
        else:
            body_choices = [
                {
                    "index": c.index,
                    "text": "".join(c.text),
                    "logprobs": self._completion_logprobs(c.logprobs, 0),
                    "finish_reason": c.finish_reason,
                }
                for c in choices
            ]
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": body_choices,
            "usage": self.usage(),
        }

    # -- SSE chunks ---------------------------------------------------------------------------

    def opening_chunks(self) -> list[dict[str, Any]]:
        """Chat: the assistant role, once per choice. Completions with ``echo``: the prompt
        (Triton's backend refuses to prepend it when streaming)."""
        chunks = []
        for choice in sorted(self.choices.values(), key=lambda c: c.index):
            if isinstance(self.request, ChatCompletionRequest):
                delta = {"role": "assistant", "content": ""}
                chunks.append(self._chunk([self._chat_delta(choice.index, delta, None, None)]))
            elif self.request.echo:
                text = self.prompts[choice.prompt_index]
                chunks.append(self._chunk([self._text_delta(choice.index, text, None, None)]))
        return chunks

    def chunk(self, output: EngineOutput, choice: _Choice) -> dict[str, Any] | None:
        """The SSE chunk for one engine response, or None when it adds nothing yet (text held
        back because it may open a ``<tool_call>`` block)."""
        if isinstance(self.request, ChatCompletionRequest):
            logprobs = self._chat_logprobs(list(output.logprobs or ()))
            finish_reason = output.finish_reason
            if choice.reader is None:
                delta: dict[str, Any] = {"content": output.text}
            else:
                delta, finish_reason = _tool_delta(choice, output)
                if not delta and finish_reason is None and not logprobs:
                    return None
            part = self._chat_delta(choice.index, delta, logprobs, finish_reason)
        else:
            tokens = list(output.logprobs or ())
            logprobs = self._completion_logprobs(tokens, choice.next_text_offset)
            choice.next_text_offset += sum(len(t.entries[0][3]) for t in tokens)
            part = self._text_delta(choice.index, output.text, logprobs, output.finish_reason)
        return self._chunk([part])

    def usage_chunk(self) -> dict[str, Any]:
        chunk = self._chunk([])
        chunk["usage"] = self.usage()
        return chunk

    def _include_usage(self) -> bool:
        options = self.request.stream_options
        return bool(options and options.include_usage)

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chat = isinstance(self.request, ChatCompletionRequest)
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self._include_usage():
            chunk["usage"] = None
        return chunk

    @staticmethod
    def _chat_delta(
        index: int, delta: dict[str, Any], logprobs: Any, finish_reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    @staticmethod
    def _text_delta(
        index: int, text: str, logprobs: Any, finish_reason: str | None
    ) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    # -- logprobs -----------------------------------------------------------------------------

    def _top(self, token: TokenLogprobs) -> tuple[tuple[int, float, int, str], ...]:
        """The alternatives as vLLM's OpenAI server lists them, in the engine's order (the
        sampled token first, then the most likely others). Completions: ``logprobs`` + 1
        entries (vLLM's ``_create_completion_logprobs``; ``logprobs=0`` gives the sampled
        token alone); chat: ``top_logprobs`` entries (its ``_get_top_logprobs``)."""
        k = logprobs_count(self.request) or 0
        if isinstance(self.request, CompletionRequest):
            k += 1
        return token.entries[:k]

    def _chat_logprobs(self, tokens: Sequence[TokenLogprobs]) -> dict[str, Any] | None:
        if logprobs_count(self.request) is None:
            return None
        content = []
        for token in tokens:
            _, logprob, _, decoded = token.entries[0]
            content.append(
                {
                    "token": decoded,
                    "logprob": logprob,
                    "bytes": list(decoded.encode()),
                    "top_logprobs": [
                        {"token": d, "logprob": lp, "bytes": list(d.encode())}
                        for _, lp, _, d in self._top(token)
                    ],
                }
            )
        return {"content": content}

    def _completion_logprobs(
        self, tokens: Sequence[TokenLogprobs], offset: int
    ) -> dict[str, Any] | None:
        if logprobs_count(self.request) is None:
            return None
        out: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token in tokens:
            _, logprob, _, decoded = token.entries[0]
            out["tokens"].append(decoded)
            out["token_logprobs"].append(logprob)
            out["top_logprobs"].append({d: lp for _, lp, _, d in self._top(token)})
            out["text_offset"].append(offset)
            offset += len(decoded)
        return out


async def complete(client: KServeClient, generation: Generation) -> dict[str, Any]:
    """The whole response of a non-streaming request."""
    calls = generation.calls()
    async with aclosing(client.generate(generation.model, calls, stream=False)) as outputs:
        async for output in outputs:
            generation.record(output)
    return generation.response()


async def open_stream(client: KServeClient, generation: Generation) -> AsyncIterator[bytes]:
    """Start the engine stream and wait for its first response, so that a refused request
    still gets its HTTP error status; then the SSE body, ending with ``data: [DONE]``."""
    calls = generation.calls()
    outputs = client.generate(generation.model, calls, stream=True)
    try:
        first = await outputs.__anext__()
    except StopAsyncIteration:
        await outputs.aclose()
        raise engine_unavailable("the engine closed the stream without answering") from None
    except BaseException:
        await outputs.aclose()
        raise
    return _sse(generation, first, outputs)


async def _sse(
    generation: Generation, first: EngineOutput, outputs: AsyncGenerator[EngineOutput, None]
) -> AsyncIterator[bytes]:
    status: int = 499  # unless the stream gets to its end
    error: str | None = "client_closed"
    try:
        async with aclosing(outputs):
            try:
                for opening in generation.opening_chunks():
                    yield _event(opening)
                chunk = generation.chunk(first, generation.record(first))
                if chunk is not None:
                    yield _event(chunk)
                async for output in outputs:
                    chunk = generation.chunk(output, generation.record(output))
                    if chunk is not None:
                        yield _event(chunk)
                if generation._include_usage():
                    yield _event(generation.usage_chunk())
                ending: tuple[int, str | None] = (200, None)
            except OpenAIError as exc:
                ending = (500, exc.type)
                yield _event(exc.body())
        yield b"data: [DONE]\n\n"
        status, error = ending
    finally:
        if generation.on_stream_end is not None:
            generation.on_stream_end(generation, status, error)


def _chat_message(choice: _Choice) -> tuple[dict[str, Any], str | None]:
    """A whole choice's assistant message and finish reason. With tools, calls are read out of
    the text; as in OpenAI's API (and vLLM's server) ``finish_reason`` is then ``tool_calls``,
    except for a named tool choice, which ends with ``stop``."""
    text = "".join(choice.text)
    if choice.reader is None:
        return {"role": "assistant", "content": text}, choice.finish_reason
    reader = choice.reader
    content = reader.feed(text).content + reader.finish().content
    calls = reader.all_calls()
    if not calls:
        return {"role": "assistant", "content": content}, choice.finish_reason
    message = {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [call.wire() for call in calls],
    }
    return message, _finish_with_calls(reader, choice.finish_reason)


def _tool_delta(choice: _Choice, output: EngineOutput) -> tuple[dict[str, Any], str | None]:
    """One streamed chat delta of a request with tools, in OpenAI's shape: calls appear under
    ``tool_calls`` with their position ``index``; the first delta of a call carries its id,
    type and name, later ones only more ``function.arguments``."""
    reader = choice.reader
    assert reader is not None
    before = len(reader.all_calls()) if reader.mode != "named" else 0
    read = reader.feed(output.text)
    if output.finish_reason is not None:
        rest = reader.finish()
        read.content += rest.content
    delta: dict[str, Any] = {}
    if read.content:
        delta["content"] = read.content
    if read.calls:
        delta["tool_calls"] = [
            {"index": before + i, **call.wire()} for i, call in enumerate(read.calls)
        ]
    elif reader.mode == "named" and (read.arguments or not reader.announced):
        part: dict[str, Any] = {"index": 0, "function": {"arguments": read.arguments}}
        if not reader.announced:
            named = reader.all_calls()[0]
            part = {"index": 0, **named.wire()}
            part["function"]["arguments"] = read.arguments
            reader.announced = True
        delta["tool_calls"] = [part]
    finish_reason = output.finish_reason
    if finish_reason is not None and reader.all_calls():
        finish_reason = _finish_with_calls(reader, finish_reason)
    return delta, finish_reason


def _finish_with_calls(reader: ToolCallReader, finish_reason: str | None) -> str | None:
    if finish_reason == "stop" and reader.mode != "named":
        return "tool_calls"
    return finish_reason


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def completion_prompts(request: CompletionRequest) -> list[str]:
    return [request.prompt] if isinstance(request.prompt, str) else [str(p) for p in request.prompt]
