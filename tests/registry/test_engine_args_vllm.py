"""The checked-in engine-argument table (portal/registry/engine_args.py) against the real,
installed pinned vLLM: field names, types, choices and bounds, and every model.json the packager
can write constructs vLLM 0.24.0's ``AsyncEngineArgs`` as Triton's vLLM backend does.

vLLM is installed ``--no-deps`` in the development environment; the portal's own image does not
have it, which is why the portal reads the table and only these tests import vLLM.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Annotated, Any

import pytest

from portal.accounts.models import Team
from portal.registry.engine_args import (
    ENGINE_ARGS,
    KV_CACHE_DTYPES,
    PINNED_VLLM_VERSION,
    QUANTIZATION_METHODS,
    VLLM_ENGINE_FIELDS,
    EngineArg,
    engine_arg_errors,
)
from portal.registry.models import Backend, Model, ModelVersion, PlatformRelease
from portal.registry.packaging import repository_files

vllm = pytest.importorskip("vllm", reason="vLLM is installed --no-deps in the dev environment")
from pydantic import ConfigDict, TypeAdapter, ValidationError  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.model_executor.layers import quantization as vllm_quantization  # noqa: E402

#: Where vLLM keeps the pydantic field (with its bounds) each engine argument is copied into.
#: disable_log_stats and enable_log_requests live on AsyncEngineArgs only (plain bools).
CONFIG_FIELDS: dict[str, tuple[type, str]] = {
    "dtype": (ModelConfig, "dtype"),
    "max_model_len": (ModelConfig, "max_model_len"),
    "gpu_memory_utilization": (CacheConfig, "gpu_memory_utilization"),
    "tensor_parallel_size": (ParallelConfig, "tensor_parallel_size"),
    "pipeline_parallel_size": (ParallelConfig, "pipeline_parallel_size"),
    "max_num_seqs": (SchedulerConfig, "max_num_seqs"),
    "max_num_batched_tokens": (SchedulerConfig, "max_num_batched_tokens"),
    "enforce_eager": (ModelConfig, "enforce_eager"),
    "enable_prefix_caching": (CacheConfig, "enable_prefix_caching"),
    "enable_chunked_prefill": (SchedulerConfig, "enable_chunked_prefill"),
    "quantization": (ModelConfig, "quantization"),
    "kv_cache_dtype": (CacheConfig, "cache_dtype"),
    "trust_remote_code": (ModelConfig, "trust_remote_code"),
    "seed": (ModelConfig, "seed"),
    "block_size": (CacheConfig, "block_size"),
    "max_logprobs": (ModelConfig, "max_logprobs"),
    "revision": (ModelConfig, "revision"),
    "tokenizer_revision": (ModelConfig, "tokenizer_revision"),
    "generation_config": (ModelConfig, "generation_config"),
}
AEA_ONLY = {"disable_log_stats", "enable_log_requests"}
#: Values vLLM takes that the platform refuses on purpose, and why.
STRICTER_THAN_VLLM = {
    "max_model_len": "-1 asks vLLM to fit the length to free memory: unpredictable per GPU",
    "max_logprobs": "-1 lifts the cap, and vLLM's own docs say it may run out of memory",
}


def aea_hints() -> dict[str, Any]:
    """AsyncEngineArgs' type hints; names imported only under TYPE_CHECKING resolve to Any,
    which is what vLLM itself erases them to at run time."""
    erased = ("QuantizationConfigArgs", "QuantizationMethods", "LoadFormats", "UsageContext")
    return typing.get_type_hints(AsyncEngineArgs, localns=dict.fromkeys(erased, Any))


def json_form(hint: Any) -> tuple[set[type], bool, frozenset[str] | None]:
    """``(JSON value types, accepts null, literal choices)`` of a vLLM type hint."""
    members = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    kinds: set[type] = set()
    choices: set[str] = set()
    for member in members:
        if member is type(None) or member is Any:
            continue  # Any: a TYPE_CHECKING-only alias (QuantizationMethods), checked below
        if typing.get_origin(member) is typing.Literal:
            choices |= set(typing.get_args(member))
            kinds.add(str)
        else:
            kinds.add(member)
    if float in kinds:
        kinds.add(int)  # JSON has one number type; vLLM's float fields take 1 as well as 1.0
    return kinds, type(None) in members, frozenset(choices) or None


def representative_values(arg: EngineArg) -> list[Any]:
    """Valid values covering each kind of value the table accepts, boundaries included."""
    if arg.choices is not None:
        values: list[Any] = sorted(arg.choices)
    elif bool in arg.types:
        values = [True, False]
    elif float in arg.types:
        values = [arg.maximum, 0.5, 1]
    elif int in arg.types:
        low = arg.minimum if arg.minimum is not None else -3
        values = [low, low + 7]
    else:
        values = ["main"]
    return values + ([None] if arg.nullable else [])


def invalid_neighbours(arg: EngineArg) -> list[Any]:
    """Values just outside what the table accepts."""
    if arg.minimum is not None:
        return [arg.minimum - 1]
    if arg.greater_than is not None and arg.maximum is not None:
        return [arg.greater_than, arg.maximum + 0.01]
    return []


def vllm_field_adapter(name: str) -> TypeAdapter:
    config, field = CONFIG_FIELDS[name]
    info = config.__pydantic_fields__[field]
    hint = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    # vLLM's configs allow arbitrary types (ModelConfig.dtype also takes a torch.dtype).
    return TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True))


# --- the table against vLLM ------------------------------------------------------------------


def test_the_installed_vllm_is_the_pinned_one():
    assert vllm.__version__.split("+")[0] == PINNED_VLLM_VERSION


def test_every_async_engine_args_field_is_listed_and_nothing_else():
    fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    assert sorted(VLLM_ENGINE_FIELDS - fields) == []
    assert sorted(fields - VLLM_ENGINE_FIELDS) == []


@pytest.mark.parametrize("name", sorted(ENGINE_ARGS))
def test_table_types_are_vllms(name):
    arg = ENGINE_ARGS[name]
    kinds, nullable, choices = json_form(aea_hints()[name])
    assert set(arg.types) == kinds
    assert arg.nullable == nullable
    if choices is not None:  # a Literal: our choices are exactly vLLM's
        assert arg.choices == choices


def test_quantization_names_are_vllms_registry():
    assert frozenset(vllm_quantization.QUANTIZATION_METHODS) == QUANTIZATION_METHODS


def test_kv_cache_dtypes_are_the_cache_configs():
    assert frozenset(typing.get_args(CacheConfig.__annotations__["cache_dtype"])) == KV_CACHE_DTYPES


def test_every_checked_argument_is_mapped_to_its_vllm_config_field():
    assert set(CONFIG_FIELDS) | AEA_ONLY == set(ENGINE_ARGS)


@pytest.mark.parametrize("name", sorted(CONFIG_FIELDS))
def test_values_the_table_accepts_vllms_config_accepts(name):
    adapter = vllm_field_adapter(name)
    for value in representative_values(ENGINE_ARGS[name]):
        assert engine_arg_errors(name, value) == []
        if value is not None:  # None means "vLLM's default" and never reaches the config
            adapter.validate_python(value)


@pytest.mark.parametrize("name", sorted(CONFIG_FIELDS))
def test_values_the_table_refuses_vllm_refuses_too(name):
    adapter = vllm_field_adapter(name)
    for value in invalid_neighbours(ENGINE_ARGS[name]):
        assert engine_arg_errors(name, value), value
        if name in STRICTER_THAN_VLLM:
            continue
        with pytest.raises(ValidationError):
            adapter.validate_python(value)


# --- every model.json the packager writes constructs AsyncEngineArgs ----------------------


def packaged_model_json(release: PlatformRelease, engine_args: dict[str, Any]) -> dict[str, Any]:
    """model.json exactly as the packager writes it for a vLLM version with ``engine_args``."""
    model = Model(team=Team(slug="team"), slug="model")
    version = ModelVersion(
        model=model, number=1, backend=Backend.VLLM, engine_args=engine_args, release=release
    )
    files = repository_files(version)
    return json.loads(files["team--model/1/model.json"])


def model_json_cases(release: PlatformRelease) -> list[dict[str, Any]]:
    """No arguments; every allowed argument at once; then every other value of each alone."""
    allowed = sorted(release.allowed_engine_args)
    values = {name: representative_values(ENGINE_ARGS[name]) for name in allowed}
    cases: list[dict[str, Any]] = [{}, {name: values[name][0] for name in allowed}]
    cases += [{name: value} for name in allowed for value in values[name][1:]]
    return cases


def test_the_seeded_release_allows_only_checked_vllm_fields(release):
    assert release.vllm_version == PINNED_VLLM_VERSION
    assert set(release.allowed_engine_args) <= set(ENGINE_ARGS)
    release.full_clean()


def test_every_packaged_model_json_constructs_async_engine_args(release):
    cases = model_json_cases(release)
    assert len(cases) > len(release.allowed_engine_args)
    for engine_args in cases:
        model_json = packaged_model_json(release, engine_args)
        assert {"model", "tokenizer", "logits_processors"} <= set(model_json)
        built = AsyncEngineArgs(**model_json)  # what Triton's vLLM backend does
        for key, value in model_json.items():
            assert getattr(built, key) == value, key


def test_a_removed_argument_would_not_construct():
    """Why the allow-list is checked: vLLM refuses unknown keys outright."""
    with pytest.raises(TypeError, match="swap_space"):
        AsyncEngineArgs(model="/weights", swap_space=4)


@pytest.mark.parametrize(
    ("engine_args", "pooling", "speculative"),
    [
        ({"runner": "pooling"}, True, False),
        ({"convert": "embed"}, True, False),
        ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, False, True),
    ],
)
def test_no_processor_is_named_where_vllm_refuses_one(engine_args, pooling, speculative):
    """vLLM refuses any named logits processor for pooling models and with speculative
    decoding, so packaging leaves the name out there (the model would not load otherwise)."""
    import torch
    from vllm.v1.sample.logits_processor import build_logitsprocs

    from serving.constraints import LOGITS_PROCESSOR
    from serving.package import vllm_repository_files

    files = vllm_repository_files("m", 1, "/weights", engine_args)
    model_json = json.loads(files["m/1/model.json"])
    assert "logits_processors" not in model_json
    config = types.SimpleNamespace(speculative_config=object() if speculative else None)
    device = torch.device("cpu")
    # What vLLM builds at engine start refuses the platform's processor by name.
    with pytest.raises(ValueError, match=r"do not support|not supported"):
        build_logitsprocs(config, device, False, pooling, [LOGITS_PROCESSOR])
