"""What a generation request is and what the engine streams back, independent of any protocol.

The KServe v2 layer builds a :class:`GenerateRequest` from Triton vLLM-backend tensors and turns
each :class:`Delta` back into ``text_output`` (and friends); nothing here knows about tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.sampling.constraint_spec import ConstraintSpec


class InvalidRequestError(ValueError):
    """The request cannot be served as asked; the message names the parameter and the reason."""


class EngineUnavailableError(RuntimeError):
    """The engine is not ready, is draining or has failed; the caller may retry elsewhere."""


@dataclass(frozen=True)
class StructuredOutput:
    """vLLM's ``StructuredOutputsParams``: exactly one of the constraint fields is set."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    # vLLM's option: JSON without whitespace between tokens. Off by default (as in vLLM), but a
    # model free to emit whitespace may never stop emitting it.
    disable_any_whitespace: bool = False


@dataclass(frozen=True)
class SamplingOptions:
    """The subset of vLLM's ``SamplingParams`` the CPU engine honours (see
    :mod:`serving.sampling.params` for the mapping and what is refused)."""

    max_tokens: int = 16
    n: int = 1  # completions per prompt (vLLM's parallel sampling; seeds are seed + index)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0  # drop tokens below min_p times the most likely one's probability
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token id, bias) pairs added to the logits, one per token (vLLM's dict, made hashable).
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k logprobs per generated token (0: only the sampled one)
    skip_special_tokens: bool = True
    structured: StructuredOutput | None = None
    constraint: ConstraintSpec | None = None  # the platform's own (extra_args["constraint"])
    # vLLM's ``SamplingParams.extra_args`` as the request sent them, every key (the platform's
    # ``constraint`` and ``logit_bias`` too, parsed above): what the model's logits processors
    # read (:mod:`serving.engine.logits_processors`). Not part of the hash.
    extra_args: Mapping[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt: str
    options: SamplingOptions = field(default_factory=SamplingOptions)
    prompt_token_ids: tuple[int, ...] | None = None  # when given, ``prompt`` is not tokenized


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int
    decoded: str


@dataclass(frozen=True)
class Delta:
    """What one decode step added to a request. ``finish_reason`` is set on the last one:
    ``"stop"`` (EOS, stop string or token), ``"length"`` (max_tokens or the context window) or
    ``"abort"`` (cancelled or the engine stopped)."""

    text: str
    token_ids: tuple[int, ...]
    num_input_tokens: int
    num_output_tokens: int
    cumulative_logprob: float
    # One entry per new token when logprobs were asked for: the sampled token first, then the
    # top alternatives, as vLLM reports them.
    logprobs: tuple[tuple[TokenLogprob, ...], ...] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # Which of the request's ``n`` completions this delta belongs to (vLLM's
    # ``CompletionOutput.index``); always 0 when ``n`` is 1.
    index: int = 0
