"""The engine, as the front end sees it: Triton's vLLM-backend tensor contract over KServe v2 gRPC.

Every request goes through ``ModelStreamInfer``, streaming or not: Triton's vLLM models are
decoupled, and Triton refuses unary ``ModelInfer`` for decoupled models, so the bidirectional
stream is the one call that works against both real Triton and the CPU engine. ``n`` choices
travel as ``n`` requests on one stream and are told apart by request ID.

A request is finished when a response carries a ``finish_reason`` (``return_finish_reason`` is
always asked for), when Triton flags it ``triton_final_response``, or when the stream ends.
Closing the generator early (the HTTP client went away) cancels the stream, which aborts the
engine requests.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from serving.frontend.errors import OpenAIError, bad_request, engine_unavailable
from serving.frontend.translate import EnginePayload

# The channel options tritonclient's InferenceServerClient sets by default (message sizes up to
# INT32_MAX, its keepalive settings), so the engine sees the same connection it did before.
_INT32_MAX = 2**31 - 1
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", _INT32_MAX),
    ("grpc.max_receive_message_length", _INT32_MAX),
    ("grpc.keepalive_time_ms", _INT32_MAX),
    ("grpc.keepalive_timeout_ms", 20000),
    ("grpc.keepalive_permit_without_calls", False),
    ("grpc.http2.max_pings_without_data", 2),
)

# Engine error messages that mean "try again later" rather than "your request is wrong". A
# stream error carries only a message (no status), so the wording is the contract; the CPU
# engine's EngineUnavailableError and Triton's own messages both use these words.
_UNAVAILABLE_WORDS = (
    "unavailable",
    "draining",
    "not ready",
    "shutting down",
    "shut down",
    "has stopped",
    "failed while decoding",
)


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token: the sampled entry first, then the alternatives, as vLLM orders them."""

    entries: tuple[tuple[int, float, int, str], ...]  # (token_id, logprob, rank, decoded)


@dataclass(frozen=True)
class EngineOutput:
    request_id: str
    text: str
    finish_reason: str | None
    num_input_tokens: int | None
    num_output_tokens: int  # tokens this response added
    logprobs: tuple[TokenLogprobs, ...] | None
    final: bool


@dataclass(frozen=True)
class GenerateCall:
    request_id: str
    prompt: str
    payload: EnginePayload


class KServeClient:
    """One gRPC channel per front-end process (created inside the serving event loop).

    Requests are ``ModelInferRequest`` protobufs built here and sent on the generated
    ``GRPCInferenceServiceStub`` (the one tritonclient wraps): tritonclient's aio
    ``stream_infer`` adds an async request generator, a task that drains it, ``InferInput``
    numpy round trips and ``InferResult`` numpy parsing, which together were about a third of
    the front end's CPU time per request (``bench/frontend_overhead.py``, docs/benchmarks.md).
    The messages on the wire are the same."""

    def __init__(self, grpc_url: str, http_url: str, *, timeout: float = 600.0) -> None:
        self.grpc_url = grpc_url
        self.http_url = http_url if "://" in http_url else f"http://{http_url}"
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.grpc_url, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._http = httpx.AsyncClient(base_url=self.http_url, timeout=5.0)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        if self._http is not None:
            await self._http.aclose()

    async def ready(self) -> bool:
        """KServe's server readiness (``/v2/health/ready``), which Triton answers 200 or 400."""
        assert self._http is not None
        try:
            response = await self._http.get("/v2/health/ready")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def generate(
        self, model: str, calls: Sequence[GenerateCall], *, stream: bool
    ) -> AsyncGenerator[EngineOutput, None]:
        """Each engine response as it arrives, for all ``calls`` on one stream."""
        requests = [_generate_request(model, call, stream) for call in calls]
        pending = {call.request_id for call in calls}
        async with aclosing(self._stream(requests)) as results:
            async for result in results:
                output = _parse_generate(result)
                if output.final or output.finish_reason is not None:
                    pending.discard(output.request_id)
                yield output
                if not pending:
                    return
        if pending:
            raise engine_unavailable("the engine closed the stream before the request finished")

    async def embed(self, model: str, texts: Sequence[str]) -> list[tuple[list[float], int]]:
        """One ``embedding_request`` per text (as Triton's front end sends them): the vector
        and the prompt token count, in the order of ``texts``."""
        requests = []
        for i, text in enumerate(texts):
            request = pb.ModelInferRequest(model_name=model, id=f"e{i}")
            body = json.dumps({"input": text, "pooling_params": {}}).encode()
            _add_bytes(request, "embedding_request", body)
            _add_bool(request, "return_num_input_tokens", True)
            _add_bool(request, "return_num_output_tokens", True)
            requests.append(request)
        results: dict[str, tuple[list[float], int]] = {}
        async with aclosing(self._stream(requests)) as stream:
            async for result in stream:
                outputs = _outputs(result)
                raw = outputs.get("text_output")
                if raw is None:
                    raise engine_unavailable("the engine answered without text_output")
                vector = json.loads(_text(raw))
                count = _count(outputs.get("num_input_tokens")) or 0
                results[result.id] = (vector, count)
                if len(results) == len(requests):
                    break
        if len(results) != len(requests):
            raise engine_unavailable("the engine closed the stream before every input was embedded")
        return [results[f"e{i}"] for i in range(len(texts))]

    async def _stream(
        self, requests: list[pb.ModelInferRequest]
    ) -> AsyncGenerator[pb.ModelInferResponse, None]:
        """One ``ModelStreamInfer`` call: every request written, the writing side closed (as
        tritonclient did once its request iterator ran out), then the responses until the
        caller stops. Leaving early cancels the call, which aborts the engine requests."""
        assert self._stub is not None
        call = self._stub.ModelStreamInfer(timeout=self.timeout)
        try:
            for request in requests:
                await call.write(request)
            await call.done_writing()
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return
                if response.error_message:
                    raise _classify(response.error_message)
                yield response.infer_response
        except grpc.RpcError as exc:
            raise _from_rpc(exc) from None
        finally:
            call.cancel()


def _classify(message: str) -> OpenAIError:
    lowered = message.lower()
    if any(word in lowered for word in _UNAVAILABLE_WORDS):
        return engine_unavailable(f"engine: {message}")
    if "unknown model" in lowered or "not found" in lowered:
        return OpenAIError(404, f"engine: {message}", param="model", code="model_not_found")
    return OpenAIError(400, message, param=_engine_param(message), code="engine_rejected")


# The CPU engine and the platform's vLLM plugin name the field (``sampling_parameters.logit_bias``
# or ``sampling_parameters.extra_args.logit_bias: ...``); vLLM's own validation says e.g.
# ``token_id(s) [..] in logit_bias contain out-of-vocab token ids``.
_ENGINE_PARAM = re.compile(r"sampling_parameters\.(?:extra_args\.)?(\w+)|\bin (logit_bias)\b")


def _engine_param(message: str) -> str | None:
    """The request field an engine refusal names, when it names one (what only the engine
    can check, such as logit_bias token ids outside the vocabulary)."""
    match = _ENGINE_PARAM.search(message)
    return (match.group(1) or match.group(2)) if match else None


def _from_rpc(exc: grpc.RpcError) -> OpenAIError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return OpenAIError(400, details, param=_engine_param(details), code="engine_rejected")
    if code == grpc.StatusCode.NOT_FOUND:
        return OpenAIError(404, details, param="model", code="model_not_found")
    return engine_unavailable(f"engine unreachable over KServe gRPC: {details}")


def _add_bytes(request: pb.ModelInferRequest, name: str, value: bytes) -> None:
    """A one-element BYTES input: its raw content is the 4-byte little-endian length, then the
    bytes (KServe v2's serialization of a BYTES tensor)."""
    request.inputs.add(name=name, datatype="BYTES", shape=(1,))
    request.raw_input_contents.append(struct.pack("<I", len(value)) + value)


def _add_bool(request: pb.ModelInferRequest, name: str, value: bool) -> None:
    request.inputs.add(name=name, datatype="BOOL", shape=(1,))
    request.raw_input_contents.append(b"\x01" if value else b"\x00")


def _generate_request(model: str, call: GenerateCall, stream: bool) -> pb.ModelInferRequest:
    payload = call.payload
    request = pb.ModelInferRequest(model_name=model, id=call.request_id)
    try:
        prompt = call.prompt.encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \u escapes can spell
        raise bad_request("the prompt is not valid UTF-8 text", None) from None
    _add_bytes(request, "text_input", prompt)
    _add_bool(request, "stream", stream)
    _add_bytes(request, "sampling_parameters", payload.sampling_parameters.encode())
    _add_bool(request, "exclude_input_in_output", payload.exclude_input_in_output)
    _add_bool(request, "return_finish_reason", True)
    _add_bool(request, "return_num_input_tokens", True)
    _add_bool(request, "return_num_output_tokens", True)
    _add_bool(request, "return_logprobs", payload.return_logprobs)
    return request


# The first element of a fixed-size tensor, by KServe datatype (raw contents are little-endian).
_FIXED = {
    "BOOL": struct.Struct("<?"),
    "INT8": struct.Struct("<b"),
    "INT16": struct.Struct("<h"),
    "INT32": struct.Struct("<i"),
    "INT64": struct.Struct("<q"),
    "UINT8": struct.Struct("<B"),
    "UINT16": struct.Struct("<H"),
    "UINT32": struct.Struct("<I"),
    "UINT64": struct.Struct("<Q"),
    "FP32": struct.Struct("<f"),
    "FP64": struct.Struct("<d"),
}


def _outputs(response: pb.ModelInferResponse) -> dict[str, Any]:
    """Each output's first element (``None`` for an empty tensor), by name. Only the first
    element is ever read: every tensor the vLLM backend sends per request has one. Like
    tritonclient, raw contents come first and ``bytes_contents`` is the fallback."""
    raw = response.raw_output_contents
    out: dict[str, Any] = {}
    for index, output in enumerate(response.outputs):
        if index < len(raw):
            out[output.name] = _first(output.datatype, raw[index])
        elif output.contents.bytes_contents:
            out[output.name] = output.contents.bytes_contents[0]
        else:
            out[output.name] = None
    return out


def _first(datatype: str, data: bytes) -> Any:
    if datatype == "BYTES":
        if len(data) < 4:
            return None
        (length,) = struct.unpack_from("<I", data)
        return data[4 : 4 + length]
    fixed = _FIXED[datatype]
    return fixed.unpack_from(data)[0] if len(data) >= fixed.size else None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


def _parse_generate(response: pb.ModelInferResponse) -> EngineOutput:
    final_param = response.parameters.get("triton_final_response")
    final = final_param is not None and bool(final_param.bool_param)
    outputs = _outputs(response)
    text_output = outputs.get("text_output")
    reason_output = outputs.get("finish_reason")
    # Triton's backend writes str(None) while a request is still running.
    reason = _text(reason_output) if reason_output is not None else None
    if reason in ("", "None", "null"):
        reason = None
    logprobs_output = outputs.get("logprobs")
    return EngineOutput(
        request_id=response.id,
        text=_text(text_output) if text_output is not None else "",
        finish_reason=reason,
        num_input_tokens=_count(outputs.get("num_input_tokens")),
        num_output_tokens=_count(outputs.get("num_output_tokens")) or 0,
        logprobs=_parse_logprobs(_text(logprobs_output)) if logprobs_output is not None else None,
        final=final,
    )


def _parse_logprobs(raw: str) -> tuple[TokenLogprobs, ...] | None:
    """Triton's ``logprobs`` tensor: a JSON list, per new token, of ``{token_id: {logprob, rank,
    decoded_token}}`` (keys become strings in JSON), or ``null``."""
    data = json.loads(raw)
    if data is None:
        return None
    tokens = []
    for step in data:
        entries = tuple(
            (
                int(token_id),
                float(v["logprob"]),
                int(v.get("rank") or 0),
                v.get("decoded_token") or "",
            )
            for token_id, v in step.items()
        )
        tokens.append(TokenLogprobs(entries))
    return tuple(tokens)
