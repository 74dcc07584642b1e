"""OpenAI request → Triton vLLM-backend ``sampling_parameters``: one pure, checked function.

Triton's vLLM backend casts the ``sampling_parameters`` JSON into vLLM's ``SamplingParams`` and,
when anything fails to parse, logs and serves the request *unconstrained*; Triton's own OpenAI
front end never sent ``response_format`` at all. So this module builds the whole payload in one
place (:func:`build_payload`), refuses every parameter the platform cannot honour by name, and
re-parses the result with the engine's strict parser before anything is sent.

Structured outputs follow vLLM 0.24 (the version pinned in the serving image): the key is
``structured_outputs`` and its value is itself a JSON *string* of ``StructuredOutputsParams``,
exactly as the backend does ``StructuredOutputsParams(**json.loads(value))``.

``vllm_xargs`` becomes ``SamplingParams.extra_args`` key by key, as in vLLM's own OpenAI server
(``to_sampling_params``: ``extra_args = self.vllm_xargs``): the platform's ``constraint`` is
checked here, every other key reaches the model's logits processors (an author's, named in the
version's ``model.json``), whose ``validate_params`` checks it when the engine admits the
request. Values are what vLLM's field allows: strings, numbers, or lists of them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from serving.constraints.json_schema import as_grammar_params
from serving.frontend.errors import OpenAIError, bad_request, unsupported
from serving.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    NamedToolChoice,
)
from serving.frontend.tools import check_tools, forced_schema
from serving.sampling.constraint_spec import EXTRA_ARGS_KEY, LOGIT_BIAS_KEY
from serving.sampling.params import parse_sampling_parameters
from serving.sampling.types import InvalidRequestError

GenerationRequest = ChatCompletionRequest | CompletionRequest
SEED_MODULUS = 2**63
# Sent under their vLLM SamplingParams names, as given (protocol.py checks their ranges).
PENALTY_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
_TOKEN_ID = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class EnginePayload:
    """What one engine request carries besides the prompt (see :mod:`serving.frontend.kserve_client`)."""

    sampling_parameters: str
    return_logprobs: bool
    exclude_input_in_output: bool


def build_payload(
    request: GenerationRequest,
    *,
    default_max_tokens: int,
    index: int = 0,
    keep_special_tokens: bool = False,
) -> EnginePayload:
    """The engine request for choice ``index`` of ``request`` (``n`` fans out into ``n`` engine
    requests; with a ``seed`` choice ``i`` gets ``seed + i``, so ``n=1`` keeps the seed as sent).

    Raises :class:`OpenAIError` (400) naming the parameter the platform cannot honour."""
    check_supported(request)
    params = sampling_parameters(request, default_max_tokens=default_max_tokens, index=index)
    if keep_special_tokens:
        params["skip_special_tokens"] = False
    text = json.dumps(params)
    _check_with_engine_parser(request, text)
    echo = isinstance(request, CompletionRequest) and request.echo
    # Streaming forbids exclude_input_in_output=False in Triton's backend; the front end then
    # sends the prompt itself as the first chunk (see serving.frontend.generation).
    return EnginePayload(
        sampling_parameters=text,
        return_logprobs=logprobs_count(request) is not None,
        exclude_input_in_output=not (echo and not request.stream),
    )


def sampling_parameters(
    request: GenerationRequest, *, default_max_tokens: int, index: int = 0
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` fields by name, only those the request set (and ``max_tokens``,
    which Triton's front end also always sends, as vLLM's default of 16 would be implicit)."""
    params: dict[str, Any] = {"max_tokens": max_tokens(request, default_max_tokens)}
    for key in ("temperature", "top_p", "top_k", "min_tokens", *PENALTY_FIELDS):
        value = getattr(request, key)
        if value is not None:
            params[key] = value
    if request.seed is not None:
        params["seed"] = (request.seed + index) % SEED_MODULUS
    if request.stop:
        params["stop"] = [request.stop] if isinstance(request.stop, str) else list(request.stop)
    if request.stop_token_ids:
        params["stop_token_ids"] = list(request.stop_token_ids)
    if request.ignore_eos is not None:
        params["ignore_eos"] = request.ignore_eos
    count = logprobs_count(request)
    if count is not None:
        params["logprobs"] = count
    structured = structured_outputs(request)
    if structured is not None:
        params["structured_outputs"] = json.dumps(structured)
    extra: dict[str, Any] = dict(request.vllm_xargs or {})
    if request.logit_bias:
        # Not SamplingParams.logit_bias: Triton's backend passes that on with JSON's string keys
        # and vLLM fails the request. The platform's logits processor applies this one on a GPU
        # (serving.constraints.vllm_v1), the CPU engine reads it too; keys as canonical ids.
        extra[LOGIT_BIAS_KEY] = {str(int(k)): v for k, v in request.logit_bias.items()}
    if extra:
        params["extra_args"] = extra
    return params


def max_tokens(request: GenerationRequest, default: int) -> int:
    """``max_completion_tokens`` wins over its deprecated name ``max_tokens`` when a chat
    request sends both, as in vLLM's and Triton's front ends."""
    if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None:
        return request.max_completion_tokens
    return request.max_tokens if request.max_tokens is not None else default


def logprobs_count(request: GenerationRequest) -> int | None:
    """vLLM's ``logprobs``: how many alternatives per token (0: only the sampled token)."""
    if isinstance(request, ChatCompletionRequest):
        if not request.logprobs:
            return None
        return request.top_logprobs or 0
    return request.logprobs


def structured_outputs(request: GenerationRequest) -> dict[str, Any] | None:
    """vLLM's ``StructuredOutputsParams`` as a dict, from ``response_format`` (as vLLM's own
    OpenAI server maps it) or from vLLM's ``structured_outputs`` request field (sent as given).

    ``response_format`` JSON is generated without whitespace between tokens
    (``disable_any_whitespace``): the output is the same JSON, and a model left free to emit
    whitespace can keep emitting it until ``max_tokens`` (observed with the random-weights demo
    model: tabs after the first key until the limit), which turns a valid request into truncated,
    unparseable output. Callers who want vLLM's default send ``structured_outputs`` instead.

    JSON schemas and ``json_object`` are sent as the corrected EBNF ``grammar`` the CPU engine
    also compiles (:mod:`serving.constraints.json_schema`), never as vLLM's ``json``."""
    fmt = request.response_format
    tools = forced_schema(request) if isinstance(request, ChatCompletionRequest) else None
    if tools is not None:
        assert isinstance(request, ChatCompletionRequest)
        if request.structured_outputs is not None or (fmt is not None and fmt.type != "text"):
            field = "structured_outputs" if request.structured_outputs else "response_format"
            raise bad_request(
                f"{field} cannot be combined with tool_choice {_choice_name(request)}: the "
                "output is then the tool call",
                field,
            )
        # The forced call is JSON too, so it gets the same corrected grammar (a function whose
        # parameters use a keyword the grammar cannot enforce is refused naming ``tools``).
        try:
            return as_grammar_params({"json": tools, "disable_any_whitespace": True})
        except InvalidRequestError as exc:
            raise bad_request(f"tools: {exc}", "tools") from None
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise bad_request(
                "response_format.json_schema is only valid with type json_schema",
                "response_format.json_schema",
            )
        try:
            return as_grammar_params(request.structured_outputs)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), "structured_outputs") from None
    if request.structured_outputs is not None:
        raise bad_request(
            "send either response_format or structured_outputs, not both", "structured_outputs"
        )
    if fmt.type == "json_object":
        if fmt.json_schema is not None:
            raise bad_request(
                "response_format.json_schema is only valid with type json_schema",
                "response_format.json_schema",
            )
        return as_grammar_params({"json_object": True, "disable_any_whitespace": True})
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise bad_request(
                "response_format type json_schema needs json_schema.schema",
                "response_format.json_schema.schema",
            )
        _check_json_schema(fmt.json_schema.schema_)
        params = {"json": fmt.json_schema.schema_, "disable_any_whitespace": True}
        try:
            return as_grammar_params(params)
        except InvalidRequestError as exc:
            raise bad_request(str(exc), "response_format.json_schema.schema") from None
    raise OpenAIError(
        400,
        f"response_format.type {fmt.type!r} is not supported (text, json_object, json_schema)",
        param="response_format.type",
        code="unsupported_parameter",
    )


def _choice_name(request: ChatCompletionRequest) -> str:
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return f"function {choice.function.name!r}"
    return repr(choice)


def check_token_ids(request: GenerationRequest, vocab_size: int | None) -> None:
    """Refuse ``logit_bias`` ids outside the model's vocabulary, as vLLM's server does. Checked
    here because on ``tritonserver`` the platform's vLLM plugin, which applies the bias, is not
    told the vocabulary when vLLM admits the request (docs/compatibility.md)."""
    if not request.logit_bias or vocab_size is None:
        return
    outside = sorted(
        int(k) for k in request.logit_bias if _TOKEN_ID.fullmatch(k) and int(k) >= vocab_size
    )
    if outside:
        raise bad_request(
            f"logit_bias: token id(s) {outside} are outside the vocabulary (size {vocab_size})",
            "logit_bias",
        )


def check_supported(request: GenerationRequest) -> None:
    """Refuse, by name, every known parameter set to something the platform would not honour."""
    for key in request.logit_bias or {}:
        if not _TOKEN_ID.fullmatch(key):
            raise bad_request(
                f"logit_bias: key {key!r} is not a token id (a non-negative integer)",
                "logit_bias",
            )
    if request.store:
        raise unsupported("store", "is not supported: completions are never stored")
    if request.metadata:
        raise unsupported("metadata", "is only meaningful with store, which is not supported")
    if request.service_tier not in (None, "auto", "default"):
        raise unsupported("service_tier")
    if request.stream_options is not None and not request.stream:
        raise bad_request(
            "`stream_options` can only be used when `stream` is True", "stream_options"
        )
    for key, value in (request.vllm_xargs or {}).items():
        if key == EXTRA_ARGS_KEY:
            continue  # an object or a JSON string; the engine's parser checks it
        if key == LOGIT_BIAS_KEY and request.logit_bias:
            raise bad_request(
                f"send either logit_bias or vllm_xargs.{LOGIT_BIAS_KEY}, not both",
                f"vllm_xargs.{LOGIT_BIAS_KEY}",
            )
        if key != LOGIT_BIAS_KEY and not _xarg_value(value):
            raise bad_request(
                f"vllm_xargs.{key} must be a string, a number or a list of them (vLLM's "
                "vllm_xargs)",
                f"vllm_xargs.{key}",
            )
    if isinstance(request, ChatCompletionRequest):
        _check_chat(request)
    else:
        _check_completion(request)


def _xarg_value(value: Any) -> bool:
    """What vLLM's ``vllm_xargs`` allows as a value: ``str | int | float`` or a list of them."""
    scalar = (str, int, float)
    if isinstance(value, list):
        return all(isinstance(v, scalar) for v in value)
    return isinstance(value, scalar)


def _check_chat(request: ChatCompletionRequest) -> None:
    check_tools(request)
    if request.functions:
        raise unsupported("functions", "(OpenAI's deprecated form) is not supported; send tools")
    if request.function_call not in (None, "none"):
        raise unsupported("function_call", "(deprecated) is not supported; send tool_choice")
    if request.modalities not in (None, ["text"]):
        raise unsupported("modalities", "is not supported: only text output")
    for name in ("audio", "prediction", "reasoning_effort", "web_search_options"):
        if getattr(request, name) is not None:
            raise unsupported(name)
    if request.top_logprobs is not None and not request.logprobs:
        raise bad_request("`top_logprobs` can only be used when `logprobs` is True", "top_logprobs")
    for i, message in enumerate(request.messages):
        if message.refusal is not None:
            raise unsupported(f"messages[{i}].refusal")
        if message.content is None and message.role != "assistant":
            raise bad_request(f"messages[{i}].content is required", f"messages[{i}].content")


def _check_completion(request: CompletionRequest) -> None:
    if request.best_of not in (None, 1):
        raise unsupported("best_of", "is not supported by this platform (vLLM V1 removed it)")
    if request.best_of is not None and request.best_of < request.n:
        # OpenAI: best_of candidates, of which the n best are returned.
        raise bad_request("best_of must be at least n", "best_of")
    if request.suffix:
        raise unsupported("suffix", "(insertion) is not supported by this platform")
    if not isinstance(request.prompt, str) and any(not isinstance(p, str) for p in request.prompt):
        raise unsupported(
            "prompt", "as token IDs is not supported: Triton's text_input carries text only"
        )
    if isinstance(request.prompt, list) and not request.prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if request.echo and request.logprobs is not None:
        raise unsupported("echo", "with logprobs is not supported (prompt logprobs are not served)")


def check_embedding(request: EmbeddingRequest) -> list[str]:
    """The texts to embed, or a 400 naming what cannot be honoured."""
    if request.dimensions is not None:
        raise unsupported("dimensions", "is not supported: the model's own size is served")
    texts = [request.input] if isinstance(request.input, str) else request.input
    if not texts:
        raise bad_request("input must not be empty", "input")
    if any(not isinstance(t, str) for t in texts):
        raise unsupported("input", "as token IDs is not supported: send text")
    return [str(t) for t in texts]


def _check_json_schema(schema: dict[str, Any]) -> None:
    """A malformed schema is refused here, with the schema error, rather than by the engine."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise bad_request(
            f"response_format.json_schema.schema is not a valid JSON schema: {exc.message}",
            "response_format.json_schema.schema",
        ) from None


_ENGINE_KEY = re.compile(r"sampling_parameters\.(\w+)")
_EXTRA_KEY = re.compile(r"extra_args\.(\w+)")


def _check_with_engine_parser(request: GenerationRequest, payload: str) -> None:
    """Re-parse the payload as the engine will, so a bad value is refused here, by name."""
    try:
        parse_sampling_parameters(payload)
    except InvalidRequestError as exc:
        message = str(exc)
        param: str | None
        if "structured_outputs" in message:
            if isinstance(request, ChatCompletionRequest) and forced_schema(request) is not None:
                param = "tools"
            elif request.structured_outputs:
                param = "structured_outputs"
            else:
                param = "response_format"
        elif (key := _EXTRA_KEY.search(message)) is not None:
            name = key.group(1)
            param = (
                LOGIT_BIAS_KEY
                if name == LOGIT_BIAS_KEY and request.logit_bias
                else f"vllm_xargs.{name}"
            )
        elif "constraint" in message or "extra_args" in message:
            param = f"vllm_xargs.{EXTRA_ARGS_KEY}"
        else:
            match = _ENGINE_KEY.search(message)
            param = match.group(1) if match else None
        raise bad_request(f"{param}: {message}" if param else message, param) from None
