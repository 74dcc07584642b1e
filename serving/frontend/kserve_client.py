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
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from serving.frontend.errors import OpenAIError, engine_unavailable
from serving.frontend.translate import EnginePayload

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
    """One gRPC channel per front-end process (created inside the serving event loop)."""

    def __init__(self, grpc_url: str, http_url: str, *, timeout: float = 600.0) -> None:
        self.grpc_url = grpc_url
        self.http_url = http_url if "://" in http_url else f"http://{http_url}"
        self.timeout = timeout
        self._grpc: grpcclient.InferenceServerClient | None = None
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._grpc = grpcclient.InferenceServerClient(self.grpc_url)
        self._http = httpx.AsyncClient(base_url=self.http_url, timeout=5.0)

    async def close(self) -> None:
        if self._grpc is not None:
            await self._grpc.close()
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
        requests = [
            {
                "model_name": model,
                "inputs": _generate_inputs(call, stream),
                "request_id": call.request_id,
            }
            for call in calls
        ]
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
            body = json.dumps({"input": text, "pooling_params": {}}).encode()
            inputs = [_bytes("embedding_request", body)]
            inputs += [_bool("return_num_input_tokens", True)]
            inputs += [_bool("return_num_output_tokens", True)]
            requests.append({"model_name": model, "inputs": inputs, "request_id": f"e{i}"})
        results: dict[str, tuple[list[float], int]] = {}
        async with aclosing(self._stream(requests)) as stream:
            async for result in stream:
                request_id = result.get_response().id
                raw = result.as_numpy("text_output")
                if raw is None:
                    raise engine_unavailable("the engine answered without text_output")
                vector = json.loads(_text(raw))
                results[request_id] = (vector, _count(result.as_numpy("num_input_tokens")) or 0)
                if len(results) == len(requests):
                    break
        if len(results) != len(requests):
            raise engine_unavailable("the engine closed the stream before every input was embedded")
        return [results[f"e{i}"] for i in range(len(texts))]

    async def _stream(self, requests: list[dict[str, Any]]) -> AsyncGenerator[Any, None]:
        assert self._grpc is not None

        async def iterate() -> AsyncIterator[dict[str, Any]]:
            for request in requests:
                yield request

        responses = self._grpc.stream_infer(iterate(), stream_timeout=self.timeout)
        try:
            async for result, error in responses:
                if error is not None:
                    raise _classify(str(error.message() or error))
                yield result
        except grpc.RpcError as exc:
            raise _from_rpc(exc) from None
        except InferenceServerException as exc:
            raise _classify(str(exc.message() or exc)) from None
        finally:
            responses.cancel()


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


def _bytes(name: str, value: bytes) -> InferInput:
    tensor = InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value], dtype=np.object_))
    return tensor


def _bool(name: str, value: bool) -> InferInput:
    tensor = InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def _generate_inputs(call: GenerateCall, stream: bool) -> list[InferInput]:
    payload = call.payload
    return [
        _bytes("text_input", call.prompt.encode()),
        _bool("stream", stream),
        _bytes("sampling_parameters", payload.sampling_parameters.encode()),
        _bool("exclude_input_in_output", payload.exclude_input_in_output),
        _bool("return_finish_reason", True),
        _bool("return_num_input_tokens", True),
        _bool("return_num_output_tokens", True),
        _bool("return_logprobs", payload.return_logprobs),
    ]


def _text(array: Any) -> str:
    value = np.asarray(array).reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _count(array: Any) -> int | None:
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    return int(flat[0]) if flat.size else None


def _parse_generate(result: Any) -> EngineOutput:
    response = result.get_response()
    final = "triton_final_response" in response.parameters and bool(
        response.parameters["triton_final_response"].bool_param
    )
    text_output = result.as_numpy("text_output")
    reason_output = result.as_numpy("finish_reason")
    # Triton's backend writes str(None) while a request is still running.
    reason = _text(reason_output) if reason_output is not None else None
    if reason in ("", "None", "null"):
        reason = None
    logprobs_output = result.as_numpy("logprobs")
    return EngineOutput(
        request_id=response.id,
        text=_text(text_output) if text_output is not None else "",
        finish_reason=reason,
        num_input_tokens=_count(result.as_numpy("num_input_tokens")),
        num_output_tokens=_count(result.as_numpy("num_output_tokens")) or 0,
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
