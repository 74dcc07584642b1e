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
from portal.registry.models import Backend, ModelVersion, PluginWheel, VersionState
from portal.registry.plugins import (
    PluginRefused,
    PluginWheelInfo,
    check_requirements,
    clash_errors,
    info_from_json,
    info_from_row,
    inspect_wheel,
)
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


# --- plugin wheels ---------------------------------------------------------------------------

#: The folder of a Triton model that holds its plugin wheels (Triton ignores non-numeric
#: subdirectories of a model), and the one an artifact ships wheels in.
PLUGINS_DIR = "plugins"


@dataclass(frozen=True)
class PackagedPlugin:
    info: PluginWheelInfo
    #: The wheel's bytes; None where only its description is needed (the version page).
    data: bytes | None = None


def collect_plugins(version: ModelVersion) -> list[PackagedPlugin]:
    """The version's plugin wheels, read and checked: its uploaded ones (from the model cache's
    store, their sha256 verified) and the wheels under ``plugins/`` in its artifact (inspected
    here, as an upload is at registration). Refuses with the reason."""
    uploaded = version.plugins.all() if version.pk is not None else PluginWheel.objects.none()
    if version.backend != Backend.VLLM:
        if uploaded.exists():
            raise PackagingError("Plugins extend vLLM; a Python-backend version cannot ship them.")
        return []  # a Python backend's artifact files are its own (model.py reads them)
    found: list[PackagedPlugin] = []
    for wheel in uploaded.order_by("filename", "pk"):
        path = settings.MODEL_CACHE_ROOT / wheel.storage_path
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PackagingError(
                f"Plugin {wheel.filename}: stored wheel unreadable ({exc})"
            ) from exc
        if hashlib.sha256(data).hexdigest() != wheel.sha256:
            raise PackagingError(f"Plugin {wheel.filename}: stored wheel does not match its sha256")
        info = info_from_row(wheel)
        found.append(PackagedPlugin(info, data))
    shipped = weights_dir(version) / PLUGINS_DIR
    if shipped.is_dir():
        for path in sorted(shipped.iterdir()):
            if not path.is_file():
                continue
            try:
                info = inspect_wheel(path)
            except PluginRefused as exc:
                raise PackagingError(f"plugin in the artifact refused: {exc}") from exc
            found.append(PackagedPlugin(info, path.read_bytes()))
    try:
        for plugin in found:
            check_requirements(plugin.info, version.release)
    except PluginRefused as exc:
        raise PackagingError(f"plugin refused: {exc}") from exc
    files = [p.info.filename for p in found]
    if duplicated := sorted({f for f in files if files.count(f) > 1}):
        raise PackagingError(f"plugin wheels shipped twice: {', '.join(duplicated)}")
    if errors := clash_errors([p.info for p in found]):
        raise PackagingError("plugins clash: " + "; ".join(errors))
    return sorted(found, key=lambda p: p.info.filename)


def described_plugins(version: ModelVersion) -> list[PackagedPlugin]:
    """A packaged version's plugins as its manifest lists them, without their bytes."""
    return [PackagedPlugin(info_from_json(e)) for e in version.package_manifest.get("plugins", [])]


def plugin_logits_processors(plugins: list[PackagedPlugin]) -> list[str]:
    return [
        plugin.info.logits_processors[name]
        for plugin in plugins
        for name in sorted(plugin.info.logits_processors)
    ]


def plugin_manifest(name: str, plugins: list[PackagedPlugin]) -> list[dict[str, Any]]:
    """The manifest's ``plugins`` list: the contract the instance's start-up reads."""
    return [
        {
            "file": f"{name}/{PLUGINS_DIR}/{p.info.filename}",
            "sha256": p.info.sha256,
            "size": p.info.size,
            "name": p.info.name,
            "version": p.info.version,
            "general_plugins": dict(sorted(p.info.general_plugins.items())),
            "logits_processors": dict(sorted(p.info.logits_processors.items())),
        }
        for p in plugins
    ]


# --- model repository -----------------------------------------------------------------------


def repository_files(
    version: ModelVersion, *, gpus: bool = True, plugins: list[PackagedPlugin] | None = None
) -> dict[str, bytes]:
    """The Triton model repository for ``version``, as ``{relative path: content}``, with its
    plugin wheels at ``<name>/plugins/<wheel>`` (``plugins``: already collected ones)."""
    name, number = triton_model_name(version), version.number
    weights = str(weights_dir(version))
    try:
        if version.backend == Backend.VLLM:
            validate_engine_args(version.engine_args, version.release)
            plugins = collect_plugins(version) if plugins is None else plugins
            try:
                files = vllm_repository_files(
                    name,
                    number,
                    weights,
                    version.engine_args,
                    tool_call_parser=version.tool_call_parser,
                    logits_processors=plugin_logits_processors(plugins),
                )
            except ValueError as exc:
                raise PackagingError(str(exc)) from exc
            for plugin in plugins:
                if plugin.data is not None:
                    files[f"{name}/{PLUGINS_DIR}/{plugin.info.filename}"] = plugin.data
            return files
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


def manifest_for(
    version: ModelVersion, files: dict[str, bytes], plugins: list[PackagedPlugin] | None = None
) -> dict[str, Any]:
    release = version.release
    manifest = {
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
    if plugins:
        manifest["plugins"] = plugin_manifest(triton_model_name(version), plugins)
    return manifest


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
    plugins = collect_plugins(version)
    files = repository_files(version, plugins=plugins)
    manifest = manifest_for(version, files, plugins)
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
