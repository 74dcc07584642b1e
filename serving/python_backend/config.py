"""A Python-backend model's configuration: ``config.pbtxt`` read into Triton's own
``ModelConfig`` protobuf, checked as Triton checks it, and written as the JSON Triton hands to
``auto_complete_config`` and ``initialize(args["model_config"])``.

That JSON is ``MessageToJson`` with proto field names and every field printed, then with the
64-bit integer fields (``dims``, ``max_queue_delay_microseconds``...) turned back from strings
into numbers (Triton core's ``ModelConfigToJson``); authors index it as ``config["input"][0]
["dims"]`` and expect ints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import descriptor, json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.repository import (
    PYTHON_BACKEND,
    RepositoryError,
    python_model_file,
    served_version,
    take_directory_name,
)

BACKEND = PYTHON_BACKEND
WILDCARD = -1

# model_config.proto DataType -> KServe protocol datatype string.
PROTOCOL_TYPES: dict[int, str] = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_UINT8: "UINT8",
    mc.TYPE_UINT16: "UINT16",
    mc.TYPE_UINT32: "UINT32",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT8: "INT8",
    mc.TYPE_INT16: "INT16",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_FP16: "FP16",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_FP64: "FP64",
    mc.TYPE_STRING: "BYTES",
    mc.TYPE_BF16: "BF16",
}
_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


class ConfigError(ValueError):
    """The model's configuration cannot be served; the message names the field."""


@contextmanager
def _refused_as_config_error() -> Iterator[None]:
    """The repository's rules (:mod:`serving.repository`) refuse with their own error; a handle
    loading a model expects this module's."""
    try:
        yield
    except RepositoryError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the configuration, in protocol terms."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None


def read_config(model_dir: Path) -> mc.ModelConfig:
    """``<model_dir>/config.pbtxt`` (optional, as with Triton's auto-complete: the name comes
    from the directory and the backend from ``model.py``)."""
    path = model_dir / "config.pbtxt"
    config = mc.ModelConfig()
    if path.is_file():
        try:
            text_format.Parse(path.read_text(), config)
        except text_format.ParseError as exc:
            raise ConfigError(f"{path} is not a valid model configuration: {exc}") from None
    with _refused_as_config_error():
        take_directory_name(config, model_dir, path)
    if config.platform:
        raise ConfigError(
            f"{path}: 'platform' must not be set for a Python-backend model (it is "
            f"'{config.platform}'); set backend: \"python\""
        )
    if not config.backend:
        config.backend = BACKEND
    if config.backend != BACKEND:
        raise ConfigError(f"{path}: backend '{config.backend}' is not '{BACKEND}'")
    return config


def _fix_int64(message_descriptor: descriptor.Descriptor, value: dict[str, Any]) -> None:
    """Turn the strings protobuf's JSON writes for 64-bit ints back into numbers, in place.
    Map keys stay strings (JSON allows nothing else), as in Triton."""
    for field in message_descriptor.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
            sub = field.message_type
            if sub.GetOptions().map_entry:
                value_field = sub.fields_by_name["value"]
                if value_field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
                    for entry in item.values():
                        _fix_int64(value_field.message_type, entry)
                elif value_field.type in _INT64_TYPES:
                    for key in list(item):
                        item[key] = int(item[key])
            elif isinstance(item, list):
                for entry in item:
                    _fix_int64(sub, entry)
            else:
                _fix_int64(sub, item)
        elif field.type in _INT64_TYPES:
            value[field.name] = [int(v) for v in item] if isinstance(item, list) else int(item)


def to_dict(config: mc.ModelConfig) -> dict[str, Any]:
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _fix_int64(mc.ModelConfig.DESCRIPTOR, data)
    return data


def to_json(config: mc.ModelConfig) -> str:
    return json.dumps(to_dict(config))


def from_json(text: str, origin: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    return config


def normalize(config: mc.ModelConfig) -> None:
    """The defaults Triton core fills in before a model instance starts."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.instance_group:
        config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = 1
    if not config.HasField("model_transaction_policy"):
        config.model_transaction_policy.decoupled = False


def validate(config: mc.ModelConfig) -> None:
    """The checks Triton makes on inputs and outputs at load (``ValidateIOShape``)."""
    if config.max_batch_size < 0:
        raise ConfigError(f"model '{config.name}': max_batch_size must be >= 0")
    for kind, ios in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for io in ios:
            prefix = f"model '{config.name}' {kind} "
            if not io.name:
                raise ConfigError(prefix + "must specify 'name'")
            if io.name in seen:
                raise ConfigError(prefix + f"'{io.name}' is declared twice")
            seen.add(io.name)
            if io.data_type == mc.TYPE_INVALID:
                raise ConfigError(prefix + f"'{io.name}' must specify 'data_type'")
            if io.data_type == mc.TYPE_BF16:
                raise ConfigError(
                    prefix + f"'{io.name}': TYPE_BF16 is not supported by the CPU runner "
                    "(numpy has no bfloat16)"
                )
            if not io.dims:
                raise ConfigError(prefix + f"'{io.name}' must specify 'dims'")
            for dim in list(io.dims) + list(io.reshape.shape):
                if dim < 1 and dim != WILDCARD:
                    raise ConfigError(
                        prefix + f"'{io.name}' dimension must be integer >= 1, or -1 to "
                        "indicate a variable-size dimension"
                    )
    if config.HasField("sequence_batching") or config.HasField("ensemble_scheduling"):
        raise ConfigError(
            f"model '{config.name}': sequence batching and ensembles are not supported by the "
            "CPU runner"
        )


def input_specs(config: mc.ModelConfig) -> dict[str, TensorSpec]:
    return {
        io.name: TensorSpec(
            io.name,
            PROTOCOL_TYPES[io.data_type],
            tuple(io.dims),
            io.optional,
            tuple(io.reshape.shape) if io.HasField("reshape") else None,
        )
        for io in config.input
    }


def output_specs(config: mc.ModelConfig) -> dict[str, TensorSpec]:
    return {
        io.name: TensorSpec(io.name, PROTOCOL_TYPES[io.data_type], tuple(io.dims))
        for io in config.output
    }


def is_decoupled(config: mc.ModelConfig) -> bool:
    return bool(config.model_transaction_policy.decoupled)


def find_version(model_dir: Path, config: mc.ModelConfig, version: str | None) -> Path:
    """The version directory to serve: the one asked for, else the one the repository serves
    (:func:`serving.repository.served_version`), holding ``model.py`` (or
    ``default_model_filename``)."""
    with _refused_as_config_error():
        if version is None:
            version = str(served_version(model_dir, config))
        chosen = model_dir / version
        if not chosen.is_dir():
            raise ConfigError(f"model '{config.name}': version directory {chosen} is missing")
        python_model_file(chosen, config)
    return chosen
