"""The tensor contract of Triton's vLLM backend (``triton-inference-server/vllm_backend``,
``src/model.py`` and ``src/utils/request.py``, main of 2026-01-09), reproduced for the CPU engine.

Model configuration: the backend's ``auto_complete_config`` adds its inputs and outputs to
whatever ``config.pbtxt`` declares, forces a decoupled transaction policy and
``max_batch_size: 0`` (:mod:`serving.model_config`). Metadata therefore reports the same
tensors, ``platform`` = the backend.

Generation (no ``embedding_request`` input):

- ``text_input`` BYTES [1]: the prompt. ``image`` is refused: the CPU engine is text only.
- ``stream`` BOOL [1]: one response per engine step, each carrying only what is new; without it
  one response carries the whole output.
- ``exclude_input_in_output`` BOOL [1]: when absent, non-streaming output starts with the
  prompt; streaming with ``exclude_input_in_output=False`` is an error.
- ``sampling_parameters`` BYTES [1]: vLLM ``SamplingParams`` as JSON (``structured_outputs``
  is itself a JSON string); values may be strings, converted by the field's type as the backend
  does. Without it the request *parameters* are used (the path of
  ``/v2/models/<m>/generate``). Unlike the backend, which fails a payload it cannot parse with
  an unhelpful message, the payload is parsed strictly and errors name the key.
- ``n`` > 1: non-streaming, the one response carries every completion in index order
  (``text_output`` and the per-completion outputs have shape ``[n]``); streaming, each response
  carries the new text of one completion, and the last one is final.
- ``return_finish_reason`` / ``return_cumulative_logprob`` / ``return_logprobs`` /
  ``return_num_input_tokens`` / ``return_num_output_tokens`` BOOL [1] add the outputs
  ``finish_reason`` (``str(reason)``, so ``"None"`` until finished), ``cumulative_logprob``
  (FP32), ``logprobs`` (JSON: per new token ``{token_id: {logprob, rank, decoded_token}}``, or
  ``null`` when the sampling parameters asked for none), ``num_input_tokens`` (UINT32) and
  ``num_output_tokens`` (UINT32, tokens this response adds).

Embeddings (``embedding_request`` present, what Triton's OpenAI front end sends for
``/v1/embeddings``, ``engine/utils/triton.py::_create_vllm_embedding_request``): a JSON string
``{"input": <text>, "pooling_params": {"dimensions": [d]}?}`` plus ``return_num_input_tokens``
and ``return_num_output_tokens``. The one response carries ``text_output`` = the JSON list of
floats of the (L2-normalized) embedding, ``num_input_tokens`` and ``num_output_tokens`` = 0.
Token-ID inputs and ``dimensions`` are refused: the CPU engine embeds text at full width.

A generation request to an embedding model (and the reverse) fails as in the backend:
``Model <m> does not support '<task>' request``. Errors the backend would raise while handling
a request are prefixed ``Error generating stream:`` as it does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving.kserve.errors import invalid
from serving.model_config import RETURN_FLAGS, TensorSpec, input_specs, output_specs
from serving.request_limits import BadBody, check_json_depth
from serving.sampling.params import parse_sampling_parameters
from serving.sampling.types import Delta, InvalidRequestError, SamplingOptions

BACKEND_ERROR_PREFIX = "Error generating stream: "


def metadata(config: mc.ModelConfig, version: str) -> dict[str, Any]:
    """``ModelMetadata`` as ``TRITONSERVER_ServerModelMetadata`` builds it."""

    def describe(specs: dict[str, TensorSpec]) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "datatype": s.datatype, "shape": list(s.dims)} for s in specs.values()
        ]

    return {
        "name": config.name,
        "versions": [version],
        "platform": config.platform or config.backend,
        "inputs": describe(input_specs(config)),
        "outputs": describe(output_specs(config)),
    }


# --- requests ---------------------------------------------------------------------------------


@dataclass
class Tensor:
    """A decoded input or output: protocol datatype, shape and a numpy array of that shape
    (BYTES as an object array of ``bytes``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class GenerateCall:
    prompt: str
    stream: bool
    prepend_input: bool
    options: SamplingOptions
    flags: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class EmbedCall:
    text: str
    flags: dict[str, bool] = field(default_factory=dict)


def _scalar(tensors: dict[str, Tensor], name: str) -> Any:
    tensor = tensors.get(name)
    if tensor is None:
        return None
    flat = tensor.data.reshape(-1)
    if flat.size == 0:
        raise invalid(f"input '{name}' is empty")
    return flat[0]


def _text(value: Any, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"{name} is not valid UTF-8") from None
    return str(value)


def task_of(tensors: dict[str, Tensor]) -> str:
    """The backend tells the tasks apart by the presence of ``embedding_request``."""
    return "embed" if "embedding_request" in tensors else "generate"


def parse_generate(tensors: dict[str, Tensor], parameters: dict[str, Any]) -> GenerateCall:
    """``GenerateRequest._get_input_tensors``; raises :class:`InvalidRequestError`."""
    if "image" in tensors:
        raise InvalidRequestError("input 'image' is not supported: the CPU engine is text only")
    raw_prompt = _scalar(tensors, "text_input")
    if raw_prompt is None:
        raise InvalidRequestError("input 'text_input' is required")
    prompt = _text(raw_prompt, "text_input")
    stream_value = _scalar(tensors, "stream")
    stream = bool(stream_value) if stream_value is not None else False
    exclude = _scalar(tensors, "exclude_input_in_output")
    prepend_input = (not bool(exclude)) if exclude is not None else not stream
    if prepend_input and stream:
        raise InvalidRequestError(
            "When streaming, `exclude_input_in_output` = False is not allowed."
        )
    sampling = _scalar(tensors, "sampling_parameters")
    if sampling is not None:
        options = parse_sampling_parameters(_text(sampling, "sampling_parameters"))
    else:
        options = parse_sampling_parameters(dict(parameters))
    flags = {flag: bool(_scalar(tensors, flag) or False) for flag in RETURN_FLAGS}
    return GenerateCall(prompt, stream, prepend_input, options, flags)


def parse_embed(tensors: dict[str, Tensor]) -> EmbedCall:
    """``EmbedRequest._get_input_tensors``; raises :class:`InvalidRequestError`."""
    raw = _text(_scalar(tensors, "embedding_request"), "embedding_request")
    try:
        check_json_depth(raw, "embedding_request")
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"embedding_request is not valid JSON: {exc.msg}") from None
    except BadBody as exc:
        raise InvalidRequestError(str(exc)) from None
    if not isinstance(body, dict) or "input" not in body:
        raise InvalidRequestError("embedding_request must be a JSON object with an 'input'")
    unknown = sorted(set(body) - {"input", "pooling_params"})
    if unknown:
        raise InvalidRequestError(f"embedding_request: unknown keys {unknown}")
    text = body["input"]
    if not isinstance(text, str):
        raise InvalidRequestError(
            "embedding_request.input must be one string: the CPU engine does not embed "
            "token IDs or several inputs in one request"
        )
    pooling = body.get("pooling_params") or {}
    if not isinstance(pooling, dict):
        raise InvalidRequestError("embedding_request.pooling_params must be an object")
    if "dimensions" in pooling:
        raise InvalidRequestError(
            "embedding_request.pooling_params.dimensions is not supported: the CPU engine "
            "returns the model's full embedding width"
        )
    if pooling:
        raise InvalidRequestError(
            f"embedding_request.pooling_params: unknown keys {sorted(pooling)}"
        )
    flags = {
        flag: bool(_scalar(tensors, flag) or False)
        for flag in ("return_num_input_tokens", "return_num_output_tokens")
    }
    return EmbedCall(text, flags)


# --- responses --------------------------------------------------------------------------------


def _bytes_tensor(name: str, values: list[str]) -> Tensor:
    data = np.array([v.encode("utf-8") for v in values], dtype=np.object_)
    return Tensor(name, "BYTES", (len(values),), data)


def _uint32(name: str, value: int) -> Tensor:
    return Tensor(name, "UINT32", (1,), np.array([value], dtype=np.uint32))


def _logprobs_json(delta_logprobs: Any) -> list[dict[int, dict[str, Any]]]:
    steps = []
    for entries in delta_logprobs:
        step: dict[int, dict[str, Any]] = {}
        for entry in entries:
            step.setdefault(
                entry.token_id,
                {"logprob": entry.logprob, "rank": entry.rank, "decoded_token": entry.decoded},
            )
        steps.append(step)
    return steps


class GenerateResponder:
    """Turns engine deltas into output tensors (``GenerateRequest.create_response``).

    Streaming: one response per delta, each with only the new text, tokens and logprobs of the
    completion that delta belongs to (with ``n`` > 1, vLLM hands the backend one
    ``RequestOutput`` per completion step, so each response carries one completion).
    Otherwise everything is gathered and :meth:`final` builds the one response, with one entry
    per completion in index order (``text_output`` of shape ``[n]``)."""

    def __init__(self, call: GenerateCall) -> None:
        self.call = call
        n = call.options.n
        self.text: list[list[str]] = [[] for _ in range(n)]
        self.logprobs: list[list[dict[int, dict[str, Any]]]] = [[] for _ in range(n)]
        self.last: list[Delta | None] = [None] * n
        self.unfinished = n
        self.wants_logprobs = call.options.logprobs is not None

    @property
    def finished(self) -> bool:
        """Every completion has its finish reason: the response just built is the last."""
        return self.unfinished == 0

    def add(self, delta: Delta) -> list[Tensor] | None:
        """Record a delta; when streaming, return its response's outputs."""
        previous = self.last[delta.index]
        if delta.finish_reason is not None and (previous is None or previous.finish_reason is None):
            self.unfinished -= 1
        self.last[delta.index] = delta
        if self.call.stream:
            lp = _logprobs_json(delta.logprobs or ()) if self.wants_logprobs else None
            return self._outputs([delta], [delta.text], [len(delta.token_ids)], [lp])
        self.text[delta.index].append(delta.text)
        if self.wants_logprobs and delta.logprobs:
            self.logprobs[delta.index].extend(_logprobs_json(delta.logprobs))
        return None

    def final(self) -> list[Tensor]:
        """The one response of a non-streaming request."""
        deltas = [d for d in self.last if d is not None]
        assert len(deltas) == len(self.last), "the engine finished without a delta"
        prefix = self.call.prompt if self.call.prepend_input else ""
        texts = [prefix + "".join(parts) for parts in self.text]
        counts = [d.num_output_tokens for d in deltas]
        lps: list[Any] = [lp if self.wants_logprobs else None for lp in self.logprobs]
        return self._outputs(deltas, texts, counts, lps)

    def _outputs(
        self, deltas: list[Delta], texts: list[str], new_tokens: list[int], logprobs: list[Any]
    ) -> list[Tensor]:
        flags = self.call.flags
        out = [_bytes_tensor("text_output", texts)]
        if flags.get("return_finish_reason"):
            out.append(_bytes_tensor("finish_reason", [str(d.finish_reason) for d in deltas]))
        if flags.get("return_cumulative_logprob"):
            value = np.array([d.cumulative_logprob for d in deltas], dtype=np.float32)
            out.append(Tensor("cumulative_logprob", "FP32", (len(deltas),), value))
        if flags.get("return_logprobs"):
            out.append(_bytes_tensor("logprobs", [json.dumps(lp) for lp in logprobs]))
        if flags.get("return_num_input_tokens"):
            out.append(_uint32("num_input_tokens", deltas[0].num_input_tokens))
        if flags.get("return_num_output_tokens"):
            counts = np.array(new_tokens, dtype=np.uint32)
            out.append(Tensor("num_output_tokens", "UINT32", (len(new_tokens),), counts))
        return out


def embed_outputs(call: EmbedCall, vector: np.ndarray, prompt_tokens: int) -> list[Tensor]:
    """``EmbedRequest.create_response``."""
    out = [_bytes_tensor("text_output", [json.dumps([float(x) for x in vector])])]
    if call.flags.get("return_num_input_tokens"):
        out.append(_uint32("num_input_tokens", prompt_tokens))
    if call.flags.get("return_num_output_tokens"):
        out.append(_uint32("num_output_tokens", 0))
    return out
