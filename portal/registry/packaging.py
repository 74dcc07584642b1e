"""Build a version's *model package*: the Triton model repository it is served from, plus a
manifest, as one deterministic tar archive stored content-addressed next to the model cache.

vLLM backend: ``config.pbtxt`` (backend ``vllm``) and ``<number>/model.json`` holding the
engine arguments, pointing at the weights in the model cache. Python backend: ``config.pbtxt``
with the author's tensor spec and ``<number>/model.py``. Every ``config.pbtxt`` is written from
and re-parsed with Triton's own ``ModelConfig`` protobuf. The vLLM version is never part of a
package: the release's serving image fixes it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from tritonclient.grpc import model_config_pb2 as mc

from portal.registry.lifecycle import transition_version
from portal.registry.models import Backend, ModelVersion, VersionState
from portal.registry.validation import (
    validate_engine_args,
    validate_io_spec,
    validate_python_model,
)
from serving.package import (
    MANIFEST_FORMAT,
    archive_bytes,
    file_entries,
    render_config,
    vllm_repository_files,
)


class PackagingError(Exception):
    """The version cannot be packaged; the message says why, for the version's failure reason."""


@dataclass(frozen=True)
class Package:
    digest: str
    path: Path
    manifest: dict[str, Any]


def triton_model_name(version: ModelVersion) -> str:
    """Team and model slugs are ``[-a-zA-Z0-9_]``, so ``team--model`` is unambiguous and a valid
    directory name; the Triton *version* directory is the platform's version number."""
    return f"{version.model.team.slug}--{version.model.slug}"


def weights_dir(version: ModelVersion) -> Path:
    """Where materialization leaves this version's weights and tokenizer in the model cache."""
    return settings.MODEL_CACHE_ROOT / version.cache_tree


def packages_dir() -> Path:
    return settings.MODEL_CACHE_ROOT / "packages"


# --- config.pbtxt ---------------------------------------------------------------------------


#: The ``config.pbtxt`` parameter that tells a Python-backend ``model.py`` where the version's
#: materialized artifact (weights, tokenizer, any files) lies in the model cache, as
#: ``model.json``'s ``model`` does for vLLM. ``model.py`` reads it from ``args["model_config"]``.
WEIGHTS_DIR_PARAMETER = "WEIGHTS_DIR"


def python_config(
    name: str, number: int, io_spec: dict[str, Any], gpus: bool, weights: str = ""
) -> mc.ModelConfig:
    config = mc.ModelConfig(
        name=name, backend="python", max_batch_size=io_spec.get("max_batch_size", 0)
    )
    if weights:
        config.parameters[WEIGHTS_DIR_PARAMETER].string_value = weights
    for side, tensors in (("input", io_spec["inputs"]), ("output", io_spec["outputs"])):
        for spec in tensors:
            tensor = getattr(config, side).add()
            tensor.name = spec["name"]
            tensor.data_type = mc.DataType.Value(spec["data_type"])
            tensor.dims.extend(spec["dims"])
            if side == "input" and spec.get("optional"):
                tensor.optional = True
    group = config.instance_group.add()
    group.count = 1
    group.kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
    config.version_policy.specific.versions.append(number)
    return config


# --- model repository -----------------------------------------------------------------------


def repository_files(version: ModelVersion, *, gpus: bool = True) -> dict[str, bytes]:
    """The Triton model repository for ``version``, as ``{relative path: content}``."""
    name, number = triton_model_name(version), version.number
    weights = str(weights_dir(version))
    try:
        if version.backend == Backend.VLLM:
            validate_engine_args(version.engine_args, version.release)
            return vllm_repository_files(
                name,
                number,
                weights,
                version.engine_args,
                tool_call_parser=version.tool_call_parser,
            )
        validate_io_spec(version.io_spec)
        source = version.python_model or _model_py_from_artifact(version)
        validate_python_model(source)
    except ValidationError as exc:
        raise PackagingError(_validation_message(exc)) from exc
    config = python_config(name, number, version.io_spec, gpus, weights)
    return {
        f"{name}/config.pbtxt": render_config(config).encode(),
        f"{name}/{number}/model.py": source.encode(),
    }


def _model_py_from_artifact(version: ModelVersion) -> str:
    path = weights_dir(version) / "model.py"
    if not path.is_file():
        raise PackagingError(
            f"The Python backend needs a model.py: none was uploaded and {path} is missing "
            "from the materialized artifact."
        )
    return path.read_text()


def manifest_for(version: ModelVersion, files: dict[str, bytes]) -> dict[str, Any]:
    release = version.release
    return {
        "format": MANIFEST_FORMAT,
        "model": triton_model_name(version),
        "version": version.number,
        "backend": version.backend,
        "api_surface": version.api_surface,
        "triton_embedded": version.api_surface == "openai+grpc",
        "constraint_plugins": list(version.constraint_plugins),
        "release": {
            "name": release.name,
            "triton_image": release.triton_image,
            "vllm_version": release.vllm_version,
        },
        "weights": str(weights_dir(version)),
        # An input, not the build time, so the same inputs always give the same digest.
        "created_at": version.created_at.isoformat(),
        "files": file_entries(files),
    }


# --- archive (the format itself lives with its reader, in serving.package) ---------------


def save_package(data: bytes) -> tuple[str, Path]:
    """Write ``data`` under its sha256, atomically; an identical package is stored once."""
    digest = hashlib.sha256(data).hexdigest()
    directory = packages_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest}.tar"
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == digest:
        return digest, path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".incoming-", suffix=".tar")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest, path


def build_package(version: ModelVersion) -> Package:
    files = repository_files(version)
    manifest = manifest_for(version, files)
    digest, path = save_package(archive_bytes(files, manifest))
    return Package(digest=digest, path=path, manifest=manifest)


def _validation_message(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
    return " ".join(exc.messages)


def package_version(version: ModelVersion) -> ModelVersion:
    """Move a materialized version through packaging to ``ready``, or to ``failed`` with why.

    Idempotent: a ready version is left alone, a version found in ``packaging`` (a worker died
    midway) is packaged again, and the content-addressed store makes a rebuild a no-op.
    """

    version.refresh_from_db()
    if version.state == VersionState.READY:
        return version
    if version.state == VersionState.MATERIALIZED:
        transition_version(version, VersionState.PACKAGING, reason="Building the model package.")
    elif version.state != VersionState.PACKAGING:
        raise PackagingError(
            f"Version {version.number} is {version.state}; only materialized versions are packaged."
        )
    try:
        package = build_package(version)
    except PackagingError as exc:
        return transition_version(version, VersionState.FAILED, reason=f"Packaging failed: {exc}")
    ModelVersion.objects.filter(pk=version.pk).update(
        package_digest=package.digest, package_manifest=package.manifest
    )
    return transition_version(
        version, VersionState.READY, reason=f"Package sha256:{package.digest} stored."
    )
