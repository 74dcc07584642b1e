"""Load what a model directory of the repository describes: ``model.json`` (vLLM engine
arguments, as Triton's vLLM backend reads them) and the Hugging Face weights it points at.

The CPU engine honours the arguments that mean something on a CPU; the GPU-placement ones
(``gpu_memory_utilization``, ``enforce_eager``, ...) are accepted and logged as not applicable,
and ones that would change results without being honoured are refused.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("serving.engine")

MODEL_JSON = "model.json"

# Accepted and meaningless on a CPU (placement, memory, kernels, logging).
_NOT_APPLICABLE = frozenset(
    {
        "gpu_memory_utilization",
        "enforce_eager",
        "kv_cache_dtype",
        "block_size",
        "swap_space",
        "enable_chunked_prefill",
        "max_num_batched_tokens",
        "enable_log_requests",
        "enable_prefix_caching",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "generation_config",
    }
)
_HONOURED = frozenset(
    {"model", "tokenizer", "dtype", "max_model_len", "max_num_seqs", "seed", "max_logprobs"}
    | {"runner", "convert", "trust_remote_code", "revision", "tokenizer_revision"}
    | {"disable_log_stats"}  # turns the metrics Triton's vLLM backend bridges off
    | {"logits_processors"}  # vLLM V1 LogitsProcessor classes, "module:Class"
)
_DTYPES = {"auto": None, "float": "float32", "float32": "float32", "bfloat16": "bfloat16"}
_DTYPES |= {"half": "float16", "float16": "float16"}


class ModelLoadError(RuntimeError):
    """The model directory cannot be served; the message says what to fix."""


@dataclass(frozen=True)
class EngineConfig:
    weights: Path
    tokenizer: Path
    kind: str  # "generate" | "embed"
    dtype: str | None
    max_model_len: int | None
    max_num_seqs: int
    seed: int | None
    max_logprobs: int
    # vLLM's switch for its stats loggers; Triton's vLLM backend bridges metrics only when false.
    disable_log_stats: bool = False
    # vLLM's ``logits_processors`` engine argument: ``module:Class`` names, in order
    # (:mod:`serving.engine.logits_processors` runs them).
    logits_processors: tuple[str, ...] = ()


def read_engine_config(model_dir: Path) -> EngineConfig:
    """Parse ``model_dir/model.json``; paths are resolved against ``model_dir``."""
    path = Path(model_dir) / MODEL_JSON
    try:
        args: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} is missing") from None
    except ValueError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(args, dict) or not isinstance(args.get("model"), str):
        raise ModelLoadError(f"{path} must be an object with a 'model' path")
    unknown = set(args) - _HONOURED - _NOT_APPLICABLE
    if unknown:
        raise ModelLoadError(
            f"{path}: engine arguments not supported on the CPU engine: {sorted(unknown)}"
        )
    ignored = sorted(set(args) & _NOT_APPLICABLE)
    if ignored:
        logger.info("engine arguments not applicable on the CPU engine, ignored: %s", ignored)
    for key, expected in (("tensor_parallel_size", 1), ("pipeline_parallel_size", 1)):
        if args.get(key, expected) != expected:
            raise ModelLoadError(f"{path}: {key}={args[key]} needs GPUs; the CPU engine runs one")
    if args.get("trust_remote_code"):
        raise ModelLoadError(f"{path}: trust_remote_code is refused by the CPU engine")
    dtype = args.get("dtype", "auto")
    if dtype not in _DTYPES:
        raise ModelLoadError(f"{path}: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    runner, convert = args.get("runner", "generate"), args.get("convert")
    if runner not in ("generate", "pooling", "auto") or convert not in (None, "embed", "auto"):
        raise ModelLoadError(f"{path}: runner={runner!r} convert={convert!r} is not supported")
    disable_log_stats = args.get("disable_log_stats", False)
    if not isinstance(disable_log_stats, bool):
        raise ModelLoadError(f"{path}: disable_log_stats must be true or false")
    processors = args.get("logits_processors") or []
    if not isinstance(processors, list) or not all(
        isinstance(p, str) and ":" in p for p in processors
    ):
        raise ModelLoadError(f"{path}: logits_processors must be a list of 'module:Class' names")
    base = Path(model_dir)
    weights = base / args["model"]
    return EngineConfig(
        weights=weights,
        tokenizer=base / (args.get("tokenizer") or args["model"]),
        kind="embed" if runner == "pooling" or convert == "embed" else "generate",
        dtype=_DTYPES[dtype],
        max_model_len=_positive(path, args, "max_model_len"),
        max_num_seqs=_positive(path, args, "max_num_seqs") or 16,
        seed=args.get("seed"),
        max_logprobs=_positive(path, args, "max_logprobs") or 20,
        disable_log_stats=disable_log_stats,
        logits_processors=tuple(dict.fromkeys(processors)),
    )


def _positive(path: Path, args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"{path}: {key} must be a positive integer")
    return value


@dataclass
class LoadedModel:
    config: EngineConfig
    model: Any  # a transformers PreTrainedModel in eval mode
    tokenizer: Any
    vocab_size: int  # width of the logits
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    pooling: str = "mean"


def load_model(config: EngineConfig) -> LoadedModel:
    import torch
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from serving.engine.logits_processors import PluginLoadError, load_general_plugins

    transformers.utils.logging.disable_progress_bar()
    if not config.weights.is_dir():
        raise ModelLoadError(f"model weights directory {config.weights} does not exist")
    try:
        # Before the weights, as vLLM does: a plugin may register the model's architecture
        # (with transformers' Auto classes for this engine, by the platform's convention).
        load_general_plugins()
    except PluginLoadError as exc:
        raise ModelLoadError(str(exc)) from exc
    dtype = getattr(torch, config.dtype) if config.dtype else "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
        loader = AutoModelForCausalLM if config.kind == "generate" else AutoModel
        model = loader.from_pretrained(config.weights, dtype=dtype).eval()
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {config.weights}: {exc}") from exc
    if model.dtype in (torch.float16,):  # CPU kernels for fp16 are slow or missing
        model = model.float()
    hf_config = model.config
    limit = getattr(hf_config, "max_position_embeddings", None) or tokenizer.model_max_length
    max_model_len = min(config.max_model_len or limit, limit)
    eos = set()
    generation = getattr(model, "generation_config", None)
    for source in (getattr(generation, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            eos.add(source)
        elif isinstance(source, list | tuple):
            eos.update(source)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(
        config=config,
        model=model,
        tokenizer=tokenizer,
        vocab_size=int(getattr(hf_config, "vocab_size", len(tokenizer))),
        max_model_len=int(max_model_len),
        eos_token_ids=tuple(sorted(eos)),
        pooling=_pooling_mode(config.weights),
    )


def _pooling_mode(weights: Path) -> str:
    """sentence-transformers models say how they pool in ``1_Pooling/config.json``."""
    path = weights / "1_Pooling" / "config.json"
    if not path.is_file():
        return "mean"
    settings = json.loads(path.read_text())
    if settings.get("pooling_mode_cls_token"):
        return "cls"
    return "mean"
