"""OpenAI request bodies as strict pydantic models.

Every model forbids unknown fields, and the OpenAI parameters this platform cannot honour are
declared here only so that :mod:`serving.frontend.translate` can refuse them *by name* when they
are set to anything but their no-op value. Nothing a caller sends is dropped without a word.

``user`` is accepted and has no effect: OpenAI defines it as an end-user identifier for abuse
monitoring, never as something that changes the output, and common SDKs send it by default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # a JSON object, as text (OpenAI's wire form)


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages: the calls it made
    tool_call_id: str | None = None  # tool messages: which call this is the result of
    refusal: str | None = None


class FunctionDefinition(_Strict):
    # OpenAI's rule for function names.
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; absent means no arguments
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = Field(max_length=64)
    description: str | None = None
    # OpenAI's wire name is "schema" (it shadows a BaseModel attribute, hence the alias).
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(_Strict):
    type: str
    json_schema: JsonSchemaFormat | None = None


class _SamplingRequest(_Strict):
    """What chat and completion requests share."""

    model: str
    n: int = Field(default=1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    # vLLM's extensions this platform honours.
    top_k: int | None = Field(default=None, ge=-1)
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    structured_outputs: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    # Penalties and biases, by OpenAI's ranges (repetition_penalty and min_p are vLLM's, with
    # vLLM's ranges); logit_bias keys are checked to be token ids in translate.check_supported.
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    min_p: float | None = Field(default=None, ge=0, le=1)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    # Known OpenAI parameters refused unless at their no-op value.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    # Up to the model's max_logprobs (vLLM's default 20), which the engine checks.
    top_logprobs: int | None = Field(default=None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Refused unless at their no-op value (functions/function_call: OpenAI's deprecated form).
    functions: list[Any] | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    # OpenAI allows at most 5 for completions (chat's top_logprobs goes to the model's
    # max_logprobs, 20 by default).
    logprobs: int | None = Field(default=None, ge=0, le=5)
    # Refused unless at their no-op value.
    best_of: int | None = None
    suffix: str | None = None


class EmbeddingRequest(_Strict):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
