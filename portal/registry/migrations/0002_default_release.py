"""Seed the first pinned platform release: the newest Triton vLLM container and the vLLM it ships."""

from django.db import migrations

ALLOWED_ENGINE_ARGS = [
    "block_size", "disable_log_stats", "dtype", "enable_chunked_prefill", "enable_log_requests",
    "enable_prefix_caching", "enforce_eager", "generation_config", "gpu_memory_utilization",
    "kv_cache_dtype", "max_logprobs", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
    "pipeline_parallel_size", "quantization", "revision", "seed", "swap_space",
    "tensor_parallel_size", "tokenizer_revision", "trust_remote_code",
]  # fmt: skip


def seed(apps, schema_editor):
    PlatformRelease = apps.get_model("registry", "PlatformRelease")
    if PlatformRelease.objects.filter(name="triton-26.07").exists():
        return
    PlatformRelease.objects.create(
        name="triton-26.07",
        triton_image="nvcr.io/nvidia/tritonserver:26.07-vllm-python-py3",
        vllm_version="0.24.0",
        allowed_engine_args=ALLOWED_ENGINE_ARGS,
        is_default=not PlatformRelease.objects.filter(is_default=True).exists(),
        notes="Triton 26.07 bundles vLLM 0.24.0 (V1 logits-processor interface, structured_outputs).",
    )


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
