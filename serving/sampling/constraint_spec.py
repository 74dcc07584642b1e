"""Constraint specifications: what a request asks for, parsed and validated before any compiling.

A request carries its constraint as JSON in ``SamplingParams.extra_args["constraint"]`` (vLLM),
as ``vllm_xargs`` through the OpenAI front end, or as a keyword to the Hugging Face adapter.
Parsing is strict and the same for every engine, so a bad constraint is refused at admission
with one clear message instead of failing inside the decode loop.

The JSON forms (exactly one key per object)::

    {"choice": ["red", "green", "blue"]}      output is exactly one of the strings
    {"regex": "[A-Z]{3}-[0-9]{4}"}            output fully matches the pattern
    {"allowed_tokens": [11, 12, 13]}           only these token IDs (EOS always allowed)
    {"banned_tokens": [7, 8]}                  every token ID but these
    {"max_tokens": 16}                         EOS is the only choice after 16 tokens
    {"all": [{...}, {...}]}                    every part at once

A string is also accepted where an object is expected and is read as JSON, because Triton's
``sampling_parameters`` and ``vllm_xargs`` carry nested values as strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from serving.request_limits import BadBody, check_json_depth

MAX_CHOICES = 2_000_000
MAX_CHOICE_BYTES = 4096
MAX_REGEX_CHARS = 4096
MAX_TOKEN_SET = 1_000_000
MAX_PARTS = 16
EXTRA_ARGS_KEY = "constraint"
# The other ``extra_args`` key the platform's vLLM plugin reads: vLLM's ``logit_bias`` (token id
# -> bias), which cannot travel in ``SamplingParams.logit_bias`` through Triton's vLLM backend
# (see ``docs/compatibility.md``). Parsed by ``serving.sampling.params.parse_logit_bias``.
LOGIT_BIAS_KEY = "logit_bias"


class ConstraintError(ValueError):
    """The constraint is invalid: bad JSON shape, an empty choice list, a bad regex, an
    out-of-range token ID. The message is meant for the caller who sent it."""


@dataclass(frozen=True)
class Choice:
    strings: tuple[str, ...]


@dataclass(frozen=True)
class Regex:
    pattern: str


@dataclass(frozen=True)
class TokenSet:
    token_ids: frozenset[int]
    banned: bool


@dataclass(frozen=True)
class MaxTokens:
    limit: int


@dataclass(frozen=True)
class All:
    parts: tuple[ConstraintSpec, ...]


ConstraintSpec = Union[Choice, Regex, TokenSet, MaxTokens, All]  # noqa: UP007 (used at runtime)


def parse_constraint(value: Any) -> ConstraintSpec:
    """Parse and validate a constraint from its JSON form (a mapping, or a JSON string)."""
    if isinstance(value, str | bytes):
        try:
            check_json_depth(value, "constraint")
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"constraint is not valid JSON: {exc.msg}") from None
        except BadBody as exc:
            raise ConstraintError(str(exc)) from None
    return _parse(value, depth=0)


def _parse(value: Any, depth: int) -> ConstraintSpec:
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ConstraintError(
            "a constraint is an object with exactly one key: "
            "choice, regex, allowed_tokens, banned_tokens, max_tokens or all"
        )
    ((kind, arg),) = value.items()
    if kind == "choice":
        return Choice(_choices(arg))
    if kind == "regex":
        if not isinstance(arg, str) or not arg:
            raise ConstraintError("regex must be a non-empty string")
        if len(arg) > MAX_REGEX_CHARS:
            raise ConstraintError(f"regex is longer than {MAX_REGEX_CHARS} characters")
        return Regex(arg)
    if kind in ("allowed_tokens", "banned_tokens"):
        return TokenSet(_token_ids(kind, arg), banned=kind == "banned_tokens")
    if kind == "max_tokens":
        if isinstance(arg, bool) or not isinstance(arg, int) or not 0 <= arg <= 1_000_000:
            raise ConstraintError("max_tokens must be an integer between 0 and 1000000")
        return MaxTokens(arg)
    if kind == "all":
        if depth > 0:
            raise ConstraintError("'all' cannot be nested inside another 'all'")
        if not isinstance(arg, Sequence) or isinstance(arg, str) or not arg:
            raise ConstraintError("all must be a non-empty list of constraints")
        if len(arg) > MAX_PARTS:
            raise ConstraintError(f"all takes at most {MAX_PARTS} constraints")
        return All(tuple(_parse(part, depth + 1) for part in arg))
    raise ConstraintError(
        f"unknown constraint {kind!r}: expected choice, regex, allowed_tokens, "
        "banned_tokens, max_tokens or all"
    )


def _choices(arg: Any) -> tuple[str, ...]:
    if not isinstance(arg, Sequence) or isinstance(arg, str):
        raise ConstraintError("choice must be a list of strings")
    if not arg:
        raise ConstraintError("choice must list at least one string")
    if len(arg) > MAX_CHOICES:
        raise ConstraintError(f"choice lists at most {MAX_CHOICES} strings")
    for item in arg:
        if not isinstance(item, str):
            raise ConstraintError("choice must be a list of strings")
        if len(item.encode("utf-8", "surrogatepass")) > MAX_CHOICE_BYTES:
            raise ConstraintError(f"a choice is longer than {MAX_CHOICE_BYTES} bytes")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise ConstraintError("a choice contains a lone surrogate") from None
    return tuple(arg)


def _token_ids(kind: str, arg: Any) -> frozenset[int]:
    if not isinstance(arg, Sequence) or isinstance(arg, str):
        raise ConstraintError(f"{kind} must be a list of token IDs")
    if len(arg) > MAX_TOKEN_SET:
        raise ConstraintError(f"{kind} lists at most {MAX_TOKEN_SET} token IDs")
    if kind == "allowed_tokens" and not arg:
        raise ConstraintError("allowed_tokens must list at least one token ID")
    for item in arg:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ConstraintError(f"{kind} must be a list of non-negative integers")
    return frozenset(arg)


def spec_key(spec: ConstraintSpec) -> str:
    """A canonical string for a spec: equal specs give equal keys (the compile cache key)."""
    return json.dumps(to_json(spec), sort_keys=True, separators=(",", ":"))


def to_json(spec: ConstraintSpec) -> dict[str, Any]:
    if isinstance(spec, Choice):
        return {"choice": list(spec.strings)}
    if isinstance(spec, Regex):
        return {"regex": spec.pattern}
    if isinstance(spec, TokenSet):
        return {"banned_tokens" if spec.banned else "allowed_tokens": sorted(spec.token_ids)}
    if isinstance(spec, MaxTokens):
        return {"max_tokens": spec.limit}
    return {"all": [to_json(part) for part in spec.parts]}
