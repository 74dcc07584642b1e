"""Triton's vLLM-backend ``sampling_parameters`` JSON → :class:`SamplingOptions`, strictly.

Triton's backend (``TritonSamplingParams.from_dict``) converts each value by the type annotation
of its vLLM ``SamplingParams`` field: a field annotated ``int``, ``float``, ``bool``, ``str`` or
``Optional[int]`` gets ``type(value)``. That is why Triton's own clients send numbers as strings
(``{"temperature": "0.1"}``), and this engine converts them the same way, by the same field table
(:data:`TRITON_CONVERTED_FIELDS`, checked against the installed vLLM by a test: the CPU engine
does not need vLLM at run time). Where the backend's rule is a trap, the value is converted
correctly or refused instead: ``bool("false")`` is ``True`` and ``int(2.7)`` is ``2`` there,
while here ``"false"`` is false and ``2.7`` for an integer field is refused.

Anything that cannot be converted, or that the engine cannot honour, is refused naming the key
(the backend fails such a request too, with a less helpful message), so a caller never gets
unconstrained or unpenalized output it did not ask for.

The payload is vLLM's ``SamplingParams`` by field name. ``structured_outputs`` is itself a JSON
*string* holding vLLM's ``StructuredOutputsParams`` (exactly as Triton's backend expects), and
``extra_args`` may carry the platform's own ``{"constraint": ..., "logit_bias": ...}``, which the
platform's vLLM logits processor (:mod:`serving.constraints.vllm_v1`) reads on a GPU. The OpenAI
front end sends ``logit_bias`` there: Triton's backend hands the top-level field to vLLM with
string keys, which vLLM refuses. The top-level field is still read here, for Triton clients.
"""

from __future__ import annotations

import json
import math
from typing import Any

from serving.request_limits import BadBody, check_json_depth
from serving.sampling.constraint_spec import (
    EXTRA_ARGS_KEY,
    LOGIT_BIAS_KEY,
    ConstraintError,
    parse_constraint,
)
from serving.sampling.types import InvalidRequestError, SamplingOptions, StructuredOutput

# vLLM 0.24.0 ``SamplingParams`` fields whose annotation is in the backend's ``type_mapping``
# (``int``, ``float``, ``bool``, ``str``, ``Optional[int]``), with the type it converts them to.
# ``tests/serving/engine/test_sampling_params.py`` rebuilds this from the installed vLLM.
TRITON_CONVERTED_FIELDS: dict[str, type] = {
    "n": int,
    "presence_penalty": float,
    "frequency_penalty": float,
    "repetition_penalty": float,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "seed": int,
    "ignore_eos": bool,
    "max_tokens": int,
    "min_tokens": int,
    "logprobs": int,
    "prompt_logprobs": int,
    "flat_logprobs": bool,
    "detokenize": bool,
    "skip_special_tokens": bool,
    "spaces_between_special_tokens": bool,
    "include_stop_str_in_output": bool,
    "skip_clone": bool,
    "output_text_buffer_length": int,
    "_eos_token_id": int,
    "routed_experts_prompt_start": int,
    "thinking_token_budget": int,
}
# Of those, the ones annotated ``Optional[int]``: JSON null stays None (the vLLM default).
OPTIONAL_INT_FIELDS = frozenset(
    {"seed", "max_tokens", "logprobs", "prompt_logprobs", "_eos_token_id", "thinking_token_budget"}
)
_TRUE_STRINGS = {"true", "1"}
_FALSE_STRINGS = {"false", "0"}

# Keys accepted with any value the engine can act on.
_INT = {"max_tokens", "min_tokens", "top_k", "seed", "logprobs", "n"}
_FLOAT = {
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
}
_BOOL = {"ignore_eos", "include_stop_str_in_output", "skip_special_tokens"}
# vLLM keys accepted only at their no-op value (anything else would be silently ignored here).
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "prompt_logprobs": (None,),
    "detokenize": (True,),
    "spaces_between_special_tokens": (True,),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "truncate_prompt_tokens": (None,),
    "lora_name": (None, ""),
    "output_kind": (None,),
}
STRUCTURED_KEYS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
_STRUCTURED_OPTIONS = {"disable_any_whitespace", "disable_additional_properties"}
_UNSUPPORTED_OPTIONS = {"disable_additional_properties", "whitespace_pattern"}
MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP_STRINGS = 16
MAX_N = 16
# Refused by this parser and by the platform's vLLM plugin alike, so no bias is dropped silently.
BOTH_LOGIT_BIASES = (
    "sampling_parameters.logit_bias and sampling_parameters.extra_args.logit_bias are both set; "
    "send logit_bias once"
)


def parse_sampling_parameters(raw: str | bytes | dict[str, Any] | None) -> SamplingOptions:
    """Parse the ``sampling_parameters`` tensor (a JSON object) into options.

    Raises :class:`InvalidRequestError` naming the offending key."""
    if raw is None or raw == "" or raw == b"":
        return SamplingOptions()
    if isinstance(raw, str | bytes):
        try:
            check_json_depth(raw, "sampling_parameters")
            params = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"sampling_parameters is not valid JSON: {exc.msg}") from None
        except BadBody as exc:
            raise InvalidRequestError(str(exc)) from None
    else:
        params = raw
    if not isinstance(params, dict):
        raise InvalidRequestError("sampling_parameters must be a JSON object")
    values: dict[str, Any] = {}
    extra_bias: tuple[tuple[int, float], ...] | None = None
    for key, value in params.items():
        if key in TRITON_CONVERTED_FIELDS:
            value = convert_field(key, value)
        if key in _INT:
            values[key] = _int(key, value)
        elif key in _FLOAT:
            values[key] = _float(key, value)
        elif key in _BOOL:
            values[key] = _bool(key, value)
        elif key == "stop":
            values["stop"] = _stop(value)
        elif key == "logit_bias":
            values["logit_bias"] = parse_logit_bias(value)
        elif key == "stop_token_ids":
            values["stop_token_ids"] = _token_ids(key, value)
        elif key == "structured_outputs":
            values["structured"] = parse_structured_outputs(value)
        elif key == "guided_decoding":
            raise InvalidRequestError(
                "sampling_parameters.guided_decoding is the pre-0.11 vLLM name; send "
                "structured_outputs (a JSON string of StructuredOutputsParams)"
            )
        elif key == "extra_args":
            extra = _extra_args(value)
            if "logit_bias" in extra:
                if params.get("logit_bias") is not None:
                    raise InvalidRequestError(BOTH_LOGIT_BIASES)
                extra_bias = extra.pop("logit_bias")
            values.update(extra)
        elif key in _NO_OP_VALUES:
            if value not in _NO_OP_VALUES[key]:
                raise InvalidRequestError(
                    f"sampling_parameters.{key}={value!r} is not supported by this engine"
                )
        else:
            raise InvalidRequestError(f"sampling_parameters.{key} is not a known parameter")
    if extra_bias is not None:  # set after the loop: a top-level null must not clear it
        values["logit_bias"] = extra_bias
    return _checked(SamplingOptions(**values))


def parse_structured_outputs(value: Any) -> StructuredOutput:
    """vLLM's ``StructuredOutputsParams`` from its JSON string (Triton's encoding) or object."""
    if isinstance(value, str):
        try:
            check_json_depth(value, "structured_outputs")
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(
                f"structured_outputs is not valid JSON: {exc.msg} (Triton's vLLM backend expects "
                "a JSON-encoded string of StructuredOutputsParams)"
            ) from None
        except BadBody as exc:
            raise InvalidRequestError(str(exc)) from None
    if not isinstance(value, dict):
        raise InvalidRequestError("structured_outputs must be a JSON object")
    unknown = set(value) - set(STRUCTURED_KEYS) - _STRUCTURED_OPTIONS - {"whitespace_pattern"}
    unknown -= {k for k in value if k.startswith("_")}  # vLLM's private _backend fields
    if unknown:
        raise InvalidRequestError(f"structured_outputs.{sorted(unknown)[0]} is not known")
    for option in _UNSUPPORTED_OPTIONS:
        if value.get(option) not in (None, False):
            raise InvalidRequestError(f"structured_outputs.{option} is not supported")
    compact = value.get("disable_any_whitespace") or False
    if not isinstance(compact, bool):
        raise InvalidRequestError("structured_outputs.disable_any_whitespace must be true or false")
    kinds = [k for k in STRUCTURED_KEYS if value.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidRequestError(
            f"structured_outputs must set exactly one of {', '.join(STRUCTURED_KEYS)}"
            f" (got {', '.join(kinds) or 'none'})"
        )
    kind, spec = kinds[0], value[kinds[0]]
    if kind == "json":
        if isinstance(spec, str):
            try:
                check_json_depth(spec, "structured_outputs.json")
                spec = json.loads(spec)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"structured_outputs.json: {exc.msg}") from None
            except BadBody as exc:
                raise InvalidRequestError(str(exc)) from None
        if not isinstance(spec, dict):
            raise InvalidRequestError("structured_outputs.json must be a JSON schema object")
        return StructuredOutput(json_schema=spec, disable_any_whitespace=compact)
    if kind == "json_object":
        if spec is not True:
            raise InvalidRequestError("structured_outputs.json_object must be true")
        return StructuredOutput(json_object=True, disable_any_whitespace=compact)
    if kind == "regex":
        if not isinstance(spec, str) or not spec:
            raise InvalidRequestError("structured_outputs.regex must be a non-empty string")
        return StructuredOutput(regex=spec)
    if kind == "choice":
        if (
            not isinstance(spec, list)
            or not spec
            or not all(isinstance(s, str) and s for s in spec)
        ):
            raise InvalidRequestError(
                "structured_outputs.choice must be a non-empty list of non-empty strings"
            )
        return StructuredOutput(choice=tuple(spec))
    if kind == "grammar":
        if not isinstance(spec, str) or not spec.strip():
            raise InvalidRequestError("structured_outputs.grammar must be a non-empty string")
        return StructuredOutput(grammar=spec)
    raise InvalidRequestError(f"structured_outputs.{kind} is not supported by this engine")


def parse_logit_bias(
    value: Any, name: str = "sampling_parameters.logit_bias"
) -> tuple[tuple[int, float], ...]:
    """vLLM's ``logit_bias`` (token id → bias added to its logit) as sorted pairs; ``name`` is
    where it was sent (top level, or ``extra_args``), for the messages.

    JSON object keys are strings, so ``{"42": -5}`` is the only way a Triton client can send
    it; keys must spell a token id (a non-negative integer; whether it is in the vocabulary is
    checked when the request is admitted). Values are finite numbers, not range-checked: vLLM's
    ``SamplingParams`` applies any bias as given (its OpenAI server clamps to [-100, 100]; this
    platform's front end refuses values outside that range). The platform's vLLM plugin uses
    this parser too (``validate_params``), so both engines refuse the same values."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{name} must be an object of token id to bias")
    bias: dict[int, float] = {}
    for key, number in value.items():
        token = _token_key(key)
        if token is None:
            raise InvalidRequestError(f"{name}: key {key!r} is not a token id")
        if (
            isinstance(number, bool)
            or not isinstance(number, int | float)
            or not math.isfinite(number)
        ):
            raise InvalidRequestError(f"{name}[{key!r}] must be a finite number")
        bias[token] = float(number)
    return tuple(sorted(bias.items()))


def _token_key(key: Any) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if isinstance(key, str) and key.strip().isdigit() and key.strip().isascii():
        return int(key.strip())
    return None


def convert_field(key: str, value: Any) -> Any:
    """A value for a field the backend converts, as its field type; a string that does not
    spell one is refused naming the key. Values of other JSON types go on to the field's own
    check (``_int``/``_float``/``_bool``), which refuses what the backend would truncate."""
    kind = TRITON_CONVERTED_FIELDS[key]
    if value is None and key in OPTIONAL_INT_FIELDS:
        return None
    if kind is bool:
        if isinstance(value, int | float) and not isinstance(value, bool) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _TRUE_STRINGS:
                return True
            if word in _FALSE_STRINGS:
                return False
            raise InvalidRequestError(
                f"sampling_parameters.{key}={value!r} is not a boolean (true/false)"
            )
        return value
    if not isinstance(value, str):
        return value
    try:
        if kind is int:
            return int(value.strip())
        number = float(value.strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InvalidRequestError(f"sampling_parameters.{key}={value!r} is not {what}") from None
    if not math.isfinite(number):
        raise InvalidRequestError(f"sampling_parameters.{key}={value!r} is not a finite number")
    return number


def _extra_args(value: Any) -> dict[str, Any]:
    """``SamplingParams.extra_args`` as :class:`SamplingOptions` fields: the platform's
    ``constraint`` and ``logit_bias`` parsed, and the whole mapping as ``extra_args``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError("sampling_parameters.extra_args must be an object")
    # Every key reaches SamplingParams.extra_args, as on vLLM: the model's logits processors
    # (an author's, named in model.json) read their own; each processor's validate_params
    # checks them when the request is admitted.
    options: dict[str, Any] = {"extra_args": dict(value)}
    if value.get(LOGIT_BIAS_KEY) is not None:
        options["logit_bias"] = parse_logit_bias(
            value[LOGIT_BIAS_KEY], f"sampling_parameters.extra_args.{LOGIT_BIAS_KEY}"
        )
    if EXTRA_ARGS_KEY in value:
        try:
            options["constraint"] = parse_constraint(value[EXTRA_ARGS_KEY])
        except ConstraintError as exc:
            raise InvalidRequestError(f"extra_args.constraint: {exc}") from None
    return options


def _int(key: str, value: Any) -> int | None:
    if value is None and key in OPTIONAL_INT_FIELDS:
        if key == "max_tokens":
            raise InvalidRequestError(
                "sampling_parameters.max_tokens must be an integer (null would mean up to the "
                "context window; send the number)"
            )
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise InvalidRequestError(f"sampling_parameters.{key} must be an integer")
    return int(value)


def _float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"sampling_parameters.{key} must be a finite number")
    return float(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequestError(f"sampling_parameters.{key} must be true or false")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequestError("sampling_parameters.stop must be a string or list of strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"sampling_parameters.stop: at most {MAX_STOP_STRINGS} strings")
    return tuple(stops)


def _token_ids(key: str, value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise InvalidRequestError(f"sampling_parameters.{key} must be a list of token IDs")
    return tuple(value)


def _checked(options: SamplingOptions) -> SamplingOptions:
    if not 1 <= options.max_tokens <= MAX_TOKENS_LIMIT:
        raise InvalidRequestError(f"sampling_parameters.max_tokens must be 1..{MAX_TOKENS_LIMIT}")
    if not 0 <= options.min_tokens <= options.max_tokens:
        raise InvalidRequestError("sampling_parameters.min_tokens must be 0..max_tokens")
    if options.temperature < 0:
        raise InvalidRequestError("sampling_parameters.temperature must be >= 0")
    if not 0 < options.top_p <= 1:
        raise InvalidRequestError("sampling_parameters.top_p must be in (0, 1]")
    if options.top_k < -1:
        raise InvalidRequestError("sampling_parameters.top_k must be -1, 0 or positive")
    if not 1 <= options.n <= MAX_N:
        raise InvalidRequestError(f"sampling_parameters.n must be 1..{MAX_N}")
    # The upper bound is the model's max_logprobs, checked when the request is admitted.
    if options.logprobs is not None and options.logprobs < 0:
        raise InvalidRequestError("sampling_parameters.logprobs must be >= 0")
    # vLLM's SamplingParams ranges.
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= getattr(options, name) <= 2:
            raise InvalidRequestError(f"sampling_parameters.{name} must be in [-2, 2]")
    if options.repetition_penalty <= 0:
        raise InvalidRequestError("sampling_parameters.repetition_penalty must be > 0")
    if not 0 <= options.min_p <= 1:
        raise InvalidRequestError("sampling_parameters.min_p must be in [0, 1]")
    return options
