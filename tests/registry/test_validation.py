"""The validation service shared by the API, forms and admin."""

from __future__ import annotations

import json

import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError

from portal.registry.models import ApiSurface, Backend, PlatformRelease
from portal.registry.validation import (
    find_version_overrides,
    validate_artifact_uri,
    validate_engine_args,
    validate_io_spec,
    validate_version_spec,
)

pytestmark = pytest.mark.django_db


def errors_of(call, *args, **kwargs) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as excinfo:
        call(*args, **kwargs)
    return excinfo.value.message_dict


# --- version overrides ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"vllm_version": "0.9.2"}, "vllm_version"),
        ({"VLLM-Version": "0.9.2"}, "VLLM-Version"),
        ({"vllm": "0.9.2"}, "vllm"),
        ({"deep": {"deeper": {"pip_requirements": ["torch"]}}}, "deep.deeper.pip_requirements"),
        ({"requirements": ["x"]}, "requirements"),
        ({"extra": [{"triton_image": "nvcr.io/x"}]}, "extra[0].triton_image"),
        ({"image": "my/image:1"}, "image"),
        ({"docker_image": "my/image:1"}, "docker_image"),
        ({"args": ["--foo", "vllm==0.9.0"]}, "args[1]"),
        ({"note": "please pip install vllm"}, "note"),
        ({"base": "nvcr.io/nvidia/tritonserver:25.09-vllm-python-py3"}, "base"),
    ],
)
def test_version_override_attempts_are_found_at_any_depth(payload, path):
    assert path in find_version_overrides(payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"dtype": "auto", "max_model_len": 4096},
        {"limit_mm_per_prompt": {"image": 2}},
        {"revision": "main", "tokenizer_revision": "v1"},
        {"description": "fine-tuned from a vLLM-friendly base"},
    ],
)
def test_ordinary_settings_are_not_taken_for_overrides(payload):
    assert find_version_overrides(payload) == []


def test_override_message_names_the_pinned_pair_and_why(release):
    errors = errors_of(validate_engine_args, {"x": {"vllm_version": "0.9"}}, release)
    message = errors["engine_args"][0]
    assert "x.vllm_version" in message
    assert "vLLM 0.24.0" in message and "tritonserver:26.07" in message
    assert "does not load" in message


# --- engine arguments -----------------------------------------------------------------------


def test_allowed_engine_args_pass(release):
    validate_engine_args(
        {"dtype": "bfloat16", "max_model_len": 8192, "gpu_memory_utilization": 0.9}, release
    )


def test_unknown_engine_args_are_named(release):
    errors = errors_of(validate_engine_args, {"dtype": "auto", "turbo": True, "zz": 1}, release)
    assert "turbo, zz" in errors["engine_args"][0]
    assert "allows:" in errors["engine_args"][0]


def test_engine_args_outside_the_release_allow_list_are_refused(release):
    release.allowed_engine_args = ["dtype"]
    errors = errors_of(validate_engine_args, {"max_model_len": 4096}, release)
    assert "max_model_len" in errors["engine_args"][0]


def test_platform_owned_engine_args_are_refused(release):
    errors = errors_of(validate_engine_args, {"model": "/tmp/m", "tokenizer": "/tmp/t"}, release)
    assert errors["engine_args"] == [
        "model, tokenizer: set by the platform from the artifact source, the model cache and "
        "the constraint processor; leave them out."
    ]


def test_logits_processors_are_the_platforms(release):
    """The packager writes its own constraint processor there; an author's would be lost."""
    errors = errors_of(validate_engine_args, {"logits_processors": ["a.b:C"]}, release)
    assert errors["engine_args"][0].startswith("logits_processors: set by the platform")


def test_the_seeded_release_no_longer_allows_swap_space(release):
    """vLLM 0.24.0's AsyncEngineArgs has no swap_space: every model setting it failed to load."""
    assert "swap_space" not in release.allowed_engine_args
    errors = errors_of(validate_engine_args, {"swap_space": 4}, release)
    assert errors["engine_args"] == [
        "swap_space: removed from vLLM (the V1 engine has no CPU swap space): AsyncEngineArgs "
        "has no such field and the engine fails to start; leave it out."
    ]


def test_a_name_an_old_release_still_allows_is_refused_when_vllm_lacks_it(release):
    """A release saved before allow-lists were checked may name a field vLLM does not have."""
    release.allowed_engine_args = [*release.allowed_engine_args, "num_scheduler_steps"]
    errors = errors_of(validate_engine_args, {"num_scheduler_steps": 8}, release)
    assert errors["engine_args"][0].startswith(
        "num_scheduler_steps: vLLM 0.24.0's AsyncEngineArgs has no such field"
    )


def test_a_release_pinning_an_unchecked_vllm_refuses_engine_args(release):
    release.vllm_version = "0.26.0"
    errors = errors_of(validate_engine_args, {"dtype": "auto"}, release)
    assert (
        "pins vLLM 0.26.0, whose engine arguments this portal cannot check"
        in (errors["engine_args"][0])
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"max_model_len": "4096"}, "max_model_len: must be int, got str"),
        ({"enforce_eager": 1}, "enforce_eager: must be bool, got int"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size: must be int, got bool"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization: must be in (0, 1]"),
        ({"dtype": "fp8"}, "dtype: must be one of"),
        ({"max_num_seqs": 0}, "max_num_seqs: must be at least 1"),
        ({"max_model_len": None}, "max_model_len: must be int, got null"),
        ({"max_num_seqs": 2.5}, "max_num_seqs: must be int or null, got float"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization: must be in (0, 1], got 0"),
        ({"gpu_memory_utilization": True}, "gpu_memory_utilization: must be float or int, got"),
        ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype: must be one of auto, bfloat16, float16"),
        ({"quantization": "gguf"}, "quantization: must be one of auto_awq, auto_gptq, awq,"),
        ({"block_size": 0}, "block_size: must be at least 1, got 0"),
        ({"max_logprobs": -1}, "max_logprobs: must be at least 0, got -1"),
        ({"generation_config": "/etc"}, "generation_config: must be one of auto, vllm"),
    ],
)
def test_engine_arg_types_and_ranges(release, args, fragment):
    errors = errors_of(validate_engine_args, args, release)
    assert any(fragment in message for message in errors["engine_args"])


@pytest.mark.parametrize(
    "args",
    [
        {"max_num_seqs": None, "quantization": None, "enable_prefix_caching": None},
        {"gpu_memory_utilization": 1, "kv_cache_dtype": "fp8_e5m2", "quantization": "awq"},
        {"max_logprobs": 0, "seed": -3, "generation_config": "vllm", "revision": "main"},
    ],
)
def test_values_vllm_accepts_pass(release, args):
    validate_engine_args(args, release)


def test_every_bad_engine_arg_is_reported_at_once(release):
    args = {"dtype": "fp8", "block_size": 0, "turbo": 1}
    messages = errors_of(validate_engine_args, args, release)["engine_args"]
    assert [m.split(":")[0] for m in messages] == ["Unknown or not allowed engine argument(s)",
                                                   "dtype", "block_size"]  # fmt: skip


def test_engine_args_must_be_an_object(release):
    assert "engine_args" in errors_of(validate_engine_args, ["dtype"], release)


# --- artifact URIs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "s3://models-bucket/llama/3",
        "s3://models.bucket-1",
        "hf://meta-llama/Llama-3.1-8B",
        "hf://org/name@0123abcd",
        "hf://org/name@refs/pr/1",
    ],
)
def test_good_remote_uris(uri):
    assert validate_artifact_uri(uri) == uri


def test_file_uri_under_an_allowed_root(artifact_root):
    uri = f"file://{artifact_root}/llama"
    assert validate_artifact_uri(uri) == uri


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("http://example.com/m", "Scheme 'http' is not allowed"),
        ("ftp://x/y", "Scheme 'ftp'"),
        ("/just/a/path", "Scheme '(none)'"),
        ("s3://UPPER/x", "not a valid S3 bucket"),
        ("s3://ab/x", "not a valid S3 bucket"),
        ("s3://bucket/a//b", "empty segments"),
        ("s3://user:pw@bucket/x", "credentials"),
        ("s3://bucket/x?versionId=1", "query"),
        ("hf://just-a-name", "hf://org/name"),
        ("hf://org/name@bad rev", "whitespace"),
        ("s3://bucket/../etc", "'..'"),
        ("s3://bucket/a/%2e%2e/b", "'..'"),
        ("s3://bucket/a/%252e%252e/b", "'..'"),
        ("file://remote-host/data", "must be local"),
        ("file:///etc/passwd", "outside the allowed artifact roots"),
        ("s3://bucket/a\\b", "'\\'"),
    ],
)
def test_bad_uris_are_refused_with_a_reason(uri, fragment):
    errors = errors_of(validate_artifact_uri, uri)
    assert fragment in errors["artifact_uri"][0]


def test_file_uri_traversal_out_of_the_root_is_refused(artifact_root):
    errors = errors_of(validate_artifact_uri, f"file://{artifact_root}/../outside")
    assert "'..'" in errors["artifact_uri"][0]


def test_file_uri_symlink_out_of_the_root_is_refused(artifact_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (artifact_root / "sneaky").symlink_to(outside)
    errors = errors_of(validate_artifact_uri, f"file://{artifact_root}/sneaky")
    assert "outside the allowed artifact roots" in errors["artifact_uri"][0]


def test_overlong_uri():
    errors = errors_of(validate_artifact_uri, "s3://bucket/" + "a" * 1100)
    assert "at most 1024" in errors["artifact_uri"][0]


# --- Python backend I/O spec ----------------------------------------------------------------

GOOD_IO_SPEC = {
    "max_batch_size": 8,
    "inputs": [{"name": "INPUT_IDS", "data_type": "TYPE_INT64", "dims": [-1]}],
    "outputs": [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [-1, 2]}],
}


def test_good_io_spec():
    validate_io_spec(GOOD_IO_SPEC)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({}, "needs inputs and outputs"),
        ({"inputs": [], "outputs": GOOD_IO_SPEC["outputs"]}, "inputs: must be a non-empty list"),
        ({**GOOD_IO_SPEC, "extra": 1}, "Unknown key(s): extra"),
        ({**GOOD_IO_SPEC, "max_batch_size": -1}, "max_batch_size"),
        (
            {**GOOD_IO_SPEC, "inputs": [{"name": "x", "data_type": "FLOAT", "dims": [1]}]},
            "inputs[0].data_type: 'FLOAT' is not a Triton data type",
        ),
        (
            {**GOOD_IO_SPEC, "inputs": [{"name": "1x", "data_type": "TYPE_FP32", "dims": [1]}]},
            "inputs[0].name",
        ),
        (
            {**GOOD_IO_SPEC, "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [0]}]},
            "inputs[0].dims",
        ),
        (
            {**GOOD_IO_SPEC, "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": []}]},
            "inputs[0].dims",
        ),
        (
            {
                **GOOD_IO_SPEC,
                "inputs": [
                    {"name": "x", "data_type": "TYPE_FP32", "dims": [1]},
                    {"name": "x", "data_type": "TYPE_FP32", "dims": [1]},
                ],
            },
            "declared twice",
        ),
        (
            {
                **GOOD_IO_SPEC,
                "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1], "shape": 1}],
            },
            "outputs[0]: unknown key(s) shape",
        ),
    ],
)
def test_bad_io_specs(spec, fragment):
    errors = errors_of(validate_io_spec, spec)
    assert any(fragment in message for message in errors["io_spec"]), errors


# --- whole version --------------------------------------------------------------------------


def spec(release, artifact_root, **overrides):
    base = {
        "release": release,
        "artifact_uri": f"file://{artifact_root}/m",
        "backend": Backend.VLLM,
        "engine_args": {},
        "io_spec": {},
        "api_surface": ApiSurface.OPENAI_GRPC,
        "constraint_plugins": [],
    }
    return {**base, **overrides}


def test_python_backend_rules(release, artifact_root):
    errors = errors_of(
        validate_version_spec,
        **spec(release, artifact_root, backend=Backend.PYTHON, engine_args={"dtype": "auto"}),
    )
    assert set(errors) == {"io_spec", "engine_args", "api_surface"}
    assert "served over KServe v2 gRPC only" in errors["api_surface"][0]
    validate_version_spec(
        **spec(
            release,
            artifact_root,
            backend=Backend.PYTHON,
            io_spec=GOOD_IO_SPEC,
            api_surface=ApiSurface.GRPC,
        )
    )


def test_vllm_backend_refuses_an_io_spec(release, artifact_root):
    errors = errors_of(validate_version_spec, **spec(release, artifact_root, io_spec=GOOD_IO_SPEC))
    assert "generates the tensor spec itself" in errors["io_spec"][0]


def test_every_field_error_is_reported_at_once(release, artifact_root):
    errors = errors_of(
        validate_version_spec,
        **spec(
            release,
            artifact_root,
            artifact_uri="http://x",
            engine_args={"nope": 1},
            constraint_plugins=["mystery", "mystery"],
        ),
    )
    assert set(errors) == {"artifact_uri", "engine_args", "constraint_plugins"}
    assert "Unknown plugin 'mystery'" in errors["constraint_plugins"][0]
    assert "listed once" in errors["constraint_plugins"][-1]


# --- Python backend model.py and known engine traps -----------------------------------------


def test_model_py_is_checked_statically():
    from portal.registry.validation import validate_python_model

    validate_python_model(
        "import os\nos.system('never run in the portal')\n"
        "class TritonPythonModel:\n    async def execute(self, requests):\n        return []\n"
    )
    assert (
        "does not parse: line 2"
        in errors_of(validate_python_model, "x = 1\ny = (\n")["python_model"][0]
    )
    assert "empty" in errors_of(validate_python_model, "  \n")["python_model"][0]


def test_model_py_only_for_the_python_backend(release, artifact_root):
    errors = errors_of(
        validate_version_spec, **spec(release, artifact_root), python_model="class X: pass\n"
    )
    assert errors["python_model"] == ["model.py applies to the Python backend only."]


def test_disable_log_requests_trap_is_explained(release):
    errors = errors_of(validate_engine_args, {"disable_log_requests": True}, release)
    assert errors["engine_args"] == [
        "disable_log_requests: removed from vLLM (deprecated in 0.10.2, gone in 0.12) and makes "
        "the engine fail to start; use enable_log_requests instead."
    ]


# --- a release's allow-list -------------------------------------------------------------------


def new_release(**fields) -> PlatformRelease:
    defaults = {
        "name": "triton-26.08",
        "triton_image": "nvcr.io/nvidia/tritonserver:26.08-vllm-python-py3",
        "vllm_version": "0.24.0",
        "allowed_engine_args": ["dtype", "max_model_len"],
    }
    return PlatformRelease(**{**defaults, **fields})


def test_a_release_allowing_checked_vllm_fields_is_clean():
    new_release().full_clean()


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        (
            ["dtype", "swap_space"],
            "swap_space: vLLM 0.24.0's AsyncEngineArgs has no such field, so Triton's vLLM "
            "backend would fail to load every model that sets it.",
        ),
        (
            ["turbo"],
            "turbo: vLLM 0.24.0's AsyncEngineArgs has no such field, so Triton's vLLM backend "
            "would fail to load every model that sets it.",
        ),
        (["model"], "model: set by the platform in model.json; it cannot be allowed."),
        (
            ["cpu_offload_gb"],
            "cpu_offload_gb: a vLLM 0.24.0 engine argument whose values the platform does not "
            "check yet; add it to portal/registry/engine_args.py first.",
        ),
        (["dtype", "dtype"], "dtype: listed more than once."),
        ("dtype", "Must be a list of engine-argument names."),
    ],
)
def test_a_release_allowing_what_the_pinned_vllm_lacks_is_refused(allowed, message):
    errors = errors_of(new_release(allowed_engine_args=allowed).full_clean)
    assert errors["allowed_engine_args"] == [message]


def test_a_release_pinning_a_vllm_without_a_checked_table_is_refused():
    errors = errors_of(new_release(vllm_version="0.26.0").full_clean)
    assert errors["allowed_engine_args"][0].startswith(
        "vLLM 0.26.0 has no checked engine-argument table in this portal"
    )


def test_the_admin_release_form_shows_the_refusal_next_to_the_allow_list(rf):
    """The admin form runs the model's clean(): the operator sees why, on the field."""
    admin_class = admin.site._registry[PlatformRelease]
    form_class = admin_class.get_form(rf.get("/"), None)
    data = {
        "name": "triton-26.08",
        "triton_image": "nvcr.io/nvidia/tritonserver:26.08-vllm-python-py3",
        "vllm_version": "0.24.0",
        "allowed_engine_args": json.dumps(["dtype", "swap_space"]),
    }
    form = form_class(data=data)
    assert not form.is_valid()
    assert form.errors["allowed_engine_args"] == [
        "swap_space: vLLM 0.24.0's AsyncEngineArgs has no such field, so Triton's vLLM backend "
        "would fail to load every model that sets it."
    ]
    assert form_class(data={**data, "allowed_engine_args": '["dtype"]'}).is_valid()
