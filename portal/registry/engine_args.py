"""The vLLM engine arguments the platform knows, as checked-in facts about the pinned vLLM.

Triton's vLLM backend loads a model with ``AsyncEngineArgs(**model_json)``: a key that is not a
field of the pinned vLLM's ``AsyncEngineArgs`` is a ``TypeError`` and the model never loads,
and a value vLLM refuses (an unknown ``kv_cache_dtype``, ``gpu_memory_utilization`` of 1.5)
fails later, at engine start, on a GPU. Both are checked here, when a version is registered.

vLLM is not installed where the portal runs (its image, ``./dev run`` with the cpu extra), so
this is a table, not an import. tests/registry/test_engine_args_vllm.py compares it, name by name and
type by type, with the installed pinned vLLM, so the table cannot drift from what it describes.
This module imports nothing from Django models, so the models themselves can use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: The vLLM the table describes: what Triton 26.07's container ships.
PINNED_VLLM_VERSION = "0.24.0"

#: Every field of vLLM 0.24.0's ``AsyncEngineArgs`` (so every key ``model.json`` may hold).
VLLM_ENGINE_FIELDS = frozenset({
    "_api_process_count", "_api_process_rank", "additional_config", "aggregate_engine_logging",
    "all2all_backend", "allow_deprecated_quantization", "allowed_local_media_path",
    "allowed_media_domains", "async_scheduling", "attention_backend", "attention_config",
    "block_size", "calculate_kv_scales", "code_revision", "collect_detailed_traces",
    "compilation_config", "config_format", "convert", "cp_kv_cache_interleave_size",
    "cpu_distributed_timeout_seconds", "cpu_offload_gb", "cpu_offload_params",
    "cudagraph_capture_sizes", "cudagraph_metrics", "data_parallel_address",
    "data_parallel_backend", "data_parallel_external_lb", "data_parallel_hybrid_lb",
    "data_parallel_multi_port_external_lb", "data_parallel_rank", "data_parallel_rpc_port",
    "data_parallel_size", "data_parallel_size_local", "data_parallel_start_rank",
    "dbo_decode_token_threshold", "dbo_prefill_token_threshold", "dcp_comm_backend",
    "dcp_kv_cache_interleave_size", "decode_context_parallel_size", "default_mm_loras",
    "device_ids", "diffusion_config", "disable_cascade_attn", "disable_chunked_mm_input",
    "disable_custom_all_reduce", "disable_hybrid_kv_cache_manager", "disable_log_stats",
    "disable_nccl_for_dp_synchronization", "disable_sliding_window",
    "distributed_executor_backend", "distributed_timeout_seconds", "download_dir", "dtype",
    "ec_transfer_config", "enable_chunked_prefill", "enable_cumem_allocator", "enable_dbo",
    "enable_elastic_ep", "enable_ep_weight_filter", "enable_eplb", "enable_expert_parallel",
    "enable_flashinfer_autotune", "enable_layerwise_nvtx_tracing", "enable_log_requests",
    "enable_logging_iteration_details", "enable_lora", "enable_mamba_cache_stochastic_rounding",
    "enable_mfu_metrics", "enable_mixed_moe_lora_format", "enable_mm_embeds",
    "enable_mm_processor_stats", "enable_prefix_caching", "enable_prompt_embeds",
    "enable_return_routed_experts", "enable_sleep_mode", "enable_tower_connector_lora",
    "enforce_eager", "eplb_config", "expert_placement_strategy", "fail_on_environ_validation",
    "fully_sharded_loras", "gdn_prefill_backend", "generation_config", "gpu_memory_utilization",
    "hf_config_path", "hf_overrides", "hf_token", "ignore_patterns", "interleave_mm_strings",
    "io_processor_plugin", "ir_op_priority", "jit_monitor_verbose", "kernel_config",
    "kv_cache_dtype", "kv_cache_dtype_skip_layers", "kv_cache_memory_bytes", "kv_cache_metrics",
    "kv_cache_metrics_sample", "kv_events_config", "kv_offloading_backend",
    "kv_offloading_size", "kv_sharing_fast_prefill", "kv_transfer_config",
    "language_model_only", "limit_mm_per_prompt", "linear_backend", "load_format",
    "logits_processors", "logprobs_mode", "long_prefill_token_threshold", "lora_dtype",
    "lora_target_modules", "mamba_backend", "mamba_block_size", "mamba_cache_dtype",
    "mamba_cache_mode", "mamba_cache_philox_rounds", "mamba_config", "mamba_ssm_cache_dtype",
    "master_addr", "master_port", "max_cpu_loras", "max_cudagraph_capture_size", "max_logprobs",
    "max_long_partial_prefills", "max_lora_rank", "max_loras", "max_model_len",
    "max_num_batched_tokens", "max_num_partial_prefills", "max_num_seqs",
    "max_parallel_loading_workers", "media_io_kwargs", "mm_encoder_attn_backend",
    "mm_encoder_attn_dtype", "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_margin",
    "mm_encoder_fp8_scale_save_path", "mm_encoder_only", "mm_encoder_tp_mode",
    "mm_processor_cache_gb", "mm_processor_cache_type", "mm_processor_kwargs",
    "mm_shm_cache_max_object_size_mb", "mm_tensor_ipc", "model", "model_impl",
    "model_loader_extra_config", "model_weights", "moe_backend", "nnodes", "node_rank",
    "num_gpu_blocks_override", "numa_bind", "numa_bind_cpus", "numa_bind_nodes",
    "offload_backend", "offload_group_size", "offload_num_in_group", "offload_params",
    "offload_prefetch_step", "optimization_level", "otlp_traces_endpoint",
    "override_attention_dtype", "override_generation_config", "performance_mode",
    "pipeline_parallel_size", "pooler_config", "prefill_context_parallel_size",
    "prefill_schedule_interval", "prefix_caching_hash_algo", "profiler_config",
    "pt_load_map_location", "quantization", "quantization_config", "ray_workers_use_nsight",
    "reasoning_config", "reasoning_parser", "reasoning_parser_plugin", "renderer_num_workers",
    "revision", "runner", "safetensors_load_strategy", "safetensors_prefetch_block_size",
    "safetensors_prefetch_num_threads", "scheduler_cls", "scheduler_reserve_full_isl",
    "scheduling_policy", "seed", "served_model_name", "show_hidden_metrics_for_version",
    "shutdown_timeout", "skip_mm_profiling", "skip_tokenizer_init", "spec_method", "spec_model",
    "spec_tokens", "specialize_active_lora", "speculative_config", "stream_interval",
    "structured_outputs_config", "tensor_parallel_size", "tokenizer", "tokenizer_mode",
    "tokenizer_revision", "tokens_only", "trust_remote_code", "ubatch_size", "use_fp64_gumbel",
    "use_tqdm_on_load", "video_pruning_rate", "watermark", "weight_transfer_config",
    "worker_cls", "worker_extension_cls"
})  # fmt: skip

#: Keys the platform writes into model.json itself (weights, metrics, the constraint processor)
#: or that only make sense set by it; authors may not set them and releases may not allow them.
PLATFORM_OWNED_ENGINE_ARGS = frozenset(
    {"model", "tokenizer", "download_dir", "served_model_name", "load_format", "logits_processors"}
)

#: Arguments vLLM used to have and that authors still reach for, with what to do instead.
REMOVED_ENGINE_ARGS = {
    "disable_log_requests": (
        "removed from vLLM (deprecated in 0.10.2, gone in 0.12) and makes the engine fail to "
        "start; use enable_log_requests instead."
    ),
    "swap_space": (
        "removed from vLLM (the V1 engine has no CPU swap space): AsyncEngineArgs has no such "
        "field and the engine fails to start; leave it out."
    ),
}


@dataclass(frozen=True)
class EngineArg:
    """One engine argument: the JSON types vLLM's field accepts and the values it refuses.

    Bounds are vLLM's own (its config classes' pydantic constraints) or stricter where vLLM's
    extra values are unsafe for a shared platform (``max_logprobs`` -1 means "no cap").
    """

    types: tuple[type, ...]
    nullable: bool = False
    choices: frozenset[str] | None = None
    minimum: int | None = None
    #: An interval (greater_than, maximum], such as (0, 1]: the two come as a pair.
    greater_than: float | None = None
    maximum: float | None = None

    def __post_init__(self) -> None:
        if (self.greater_than is None) != (self.maximum is None):
            raise ValueError("greater_than and maximum bound an interval together")


_INT_AT_LEAST_1 = EngineArg((int,), minimum=1)
_OPTIONAL_INT_AT_LEAST_1 = EngineArg((int,), nullable=True, minimum=1)
_BOOL = EngineArg((bool,))
_OPTIONAL_BOOL = EngineArg((bool,), nullable=True)
_OPTIONAL_STR = EngineArg((str,), nullable=True)

#: vLLM's ``ModelDType`` literal (vllm/config/model.py).
DTYPES = frozenset({"auto", "half", "float16", "bfloat16", "float", "float32"})
#: vLLM's ``CacheDType`` literal (vllm/config/cache.py).
KV_CACHE_DTYPES = frozenset({
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
    "int8_per_token_head", "fp8_per_token_head", "nvfp4",
})  # fmt: skip
#: vLLM's ``QUANTIZATION_METHODS`` (vllm/model_executor/layers/quantization/__init__.py).
QUANTIZATION_METHODS = frozenset({
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4",
    "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin",
    "humming", "compressed-tensors", "bitsandbytes", "experts_int8", "quark", "moe_wna16",
    "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor",
    "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "mxfp8",
})  # fmt: skip
#: vLLM also takes a folder path on the serving machine; authors cannot know one, so only the
#: two named modes are accepted.
GENERATION_CONFIG_MODES = frozenset({"auto", "vllm"})

#: The engine arguments authors may set (when their release allows them), as vLLM types them.
ENGINE_ARGS: dict[str, EngineArg] = {
    "dtype": EngineArg((str,), choices=DTYPES),
    "max_model_len": _INT_AT_LEAST_1,
    "gpu_memory_utilization": EngineArg((float, int), greater_than=0, maximum=1),
    "tensor_parallel_size": _INT_AT_LEAST_1,
    "pipeline_parallel_size": _INT_AT_LEAST_1,
    "max_num_seqs": _OPTIONAL_INT_AT_LEAST_1,
    "max_num_batched_tokens": _OPTIONAL_INT_AT_LEAST_1,
    "enforce_eager": _BOOL,
    "enable_prefix_caching": _OPTIONAL_BOOL,
    "enable_chunked_prefill": _OPTIONAL_BOOL,
    "quantization": EngineArg((str,), nullable=True, choices=QUANTIZATION_METHODS),
    "kv_cache_dtype": EngineArg((str,), choices=KV_CACHE_DTYPES),
    "trust_remote_code": _BOOL,
    "seed": EngineArg((int,)),
    "block_size": _OPTIONAL_INT_AT_LEAST_1,
    "max_logprobs": EngineArg((int,), minimum=0),
    "disable_log_stats": _BOOL,
    "enable_log_requests": _BOOL,
    "revision": _OPTIONAL_STR,
    "tokenizer_revision": _OPTIONAL_STR,
    "generation_config": EngineArg((str,), choices=GENERATION_CONFIG_MODES),
}

#: The JSON types each known argument's value must have (kept for callers that only need that).
ENGINE_ARG_TYPES: dict[str, tuple[type, ...]] = {
    name: arg.types for name, arg in ENGINE_ARGS.items()
}


def _type_names(arg: EngineArg) -> str:
    names = [kind.__name__ for kind in arg.types] + (["null"] if arg.nullable else [])
    return " or ".join(names)


def engine_arg_errors(name: str, value: Any) -> list[str]:
    """Why vLLM would refuse ``value`` for the known argument ``name`` (empty when it is fine)."""
    arg = ENGINE_ARGS[name]
    if value is None:
        return [] if arg.nullable else [f"{name}: must be {_type_names(arg)}, got null."]
    is_bool = isinstance(value, bool)
    if not isinstance(value, arg.types) or (is_bool and bool not in arg.types):
        return [f"{name}: must be {_type_names(arg)}, got {type(value).__name__}."]
    if arg.choices is not None and value not in arg.choices:
        return [f"{name}: must be one of {', '.join(sorted(arg.choices))}, got {value!r}."]
    return _range_errors(name, arg, value)


def _range_errors(name: str, arg: EngineArg, value: Any) -> list[str]:
    if arg.minimum is not None and value < arg.minimum:
        return [f"{name}: must be at least {arg.minimum}, got {value}."]
    low, high = arg.greater_than, arg.maximum
    if low is not None and high is not None and not low < value <= high:
        return [f"{name}: must be in ({low:g}, {high:g}], got {value}."]
    return []


def allow_list_errors(vllm_version: str, allowed: Any) -> list[str]:
    """Why a release pinning ``vllm_version`` may not allow the engine arguments ``allowed``.

    A release may only allow arguments the pinned vLLM has *and* this table checks: anything
    else would either break every model that sets it or reach vLLM unchecked.
    """
    if not isinstance(allowed, list) or not all(isinstance(name, str) for name in allowed):
        return ["Must be a list of engine-argument names."]
    if vllm_version != PINNED_VLLM_VERSION:
        return [
            f"vLLM {vllm_version or '(none)'} has no checked engine-argument table in this "
            f"portal (it has vLLM {PINNED_VLLM_VERSION}'s), so its allow-list cannot be checked; "
            "add that vLLM's table to portal/registry/engine_args.py first."
        ]
    errors = []
    duplicates = sorted({name for name in allowed if allowed.count(name) > 1})
    if duplicates:
        errors.append(f"{', '.join(duplicates)}: listed more than once.")
    errors.extend(unusable_engine_arg_errors(sorted(set(allowed))))
    return errors


def unusable_engine_arg_errors(names: Iterable[str]) -> list[str]:
    """Why each of ``names`` cannot be an author-set engine argument (none for usable ones)."""
    errors = []
    for name in names:
        if name not in VLLM_ENGINE_FIELDS:
            errors.append(
                f"{name}: vLLM {PINNED_VLLM_VERSION}'s AsyncEngineArgs has no such field, so "
                "Triton's vLLM backend would fail to load every model that sets it."
            )
        elif name in PLATFORM_OWNED_ENGINE_ARGS:
            errors.append(f"{name}: set by the platform in model.json; it cannot be allowed.")
        elif name not in ENGINE_ARGS:
            errors.append(
                f"{name}: a vLLM {PINNED_VLLM_VERSION} engine argument whose values the platform "
                "does not check yet; add it to portal/registry/engine_args.py first."
            )
    return errors
