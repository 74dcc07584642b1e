"""Validation of what authors submit, shared by the API, the web forms and the admin.

Every function raises Django's ``ValidationError`` keyed by the field at fault, so a form shows
the message next to the field and the API returns it under that field's name.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from tritonclient.grpc import model_config_pb2

from portal.registry.engine_args import (
    ENGINE_ARG_TYPES as ENGINE_ARG_TYPES,  # re-exported: tests build their release from it
)
from portal.registry.engine_args import (
    ENGINE_ARGS,
    PINNED_VLLM_VERSION,
    PLATFORM_OWNED_ENGINE_ARGS,
    REMOVED_ENGINE_ARGS,
    engine_arg_errors,
    unusable_engine_arg_errors,
)
from portal.registry.models import ApiSurface, Backend, PlatformRelease

ALLOWED_SCHEMES = ("s3", "hf", "file")
MAX_URI_LENGTH = 1024

MULTIMODAL_ARGS = frozenset({"limit_mm_per_prompt", "mm_processor_kwargs"})

# Keys that would pin or override what the platform release fixes: the vLLM version, the
# serving image, or extra pip requirements. Matched after lower-casing and turning any run of
# non-alphanumerics into "_".
_FORBIDDEN_KEY = re.compile(
    r"^(vllm|wheel|pip|packages|dependencies|install_requires|python_packages|requirements)$"
    r"|vllm_(version|wheel|package|pin|image)|version_vllm|triton_version"
    r"|(docker|container|serving|triton|base|runtime|server)_image|^image(_(tag|uri|name|ref))?$"
    r"|(^|_)pip(_|$)|requirement"
)
_FORBIDDEN_VALUE = re.compile(
    r"\bvllm\s*(==|>=|<=|~=|!=|===|@|>|<)|\bpip\s+install\b|nvcr\.io/|tritonserver:",
    re.IGNORECASE,
)
_PYTHON_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")

TRITON_DATA_TYPES = frozenset(
    name for name in model_config_pb2.DataType.DESCRIPTOR.values_by_name if name != "TYPE_INVALID"
)
MAX_TENSOR_DIMS = 8
IO_SPEC_TENSOR_KEYS = frozenset({"name", "data_type", "dims", "optional"})


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(key).lower()).strip("_")


def _walk(
    value: Any, path: str = "", parent: str | None = None
) -> Iterator[tuple[str, str | None, str | None, Any]]:
    """Yield ``(path, parent_key, key, value)`` for every key and every leaf value, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            yield child, parent, str(key), item
            yield from _walk(item, child, str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]", parent)
    else:
        yield path, parent, None, value


def find_version_overrides(payload: Any, path: str = "") -> list[str]:
    """Paths in ``payload`` that try to pin the vLLM version, the image or pip requirements."""
    found: list[str] = []
    for where, parent, key, value in _walk(payload, path):
        if key is not None:
            norm = _norm_key(key)
            # "image" is also a modality name inside vLLM's multimodal settings.
            if norm == "image" and parent in MULTIMODAL_ARGS:
                continue
            if _FORBIDDEN_KEY.search(norm):
                found.append(where)
        elif isinstance(value, str) and _FORBIDDEN_VALUE.search(value):
            found.append(where)
    return sorted(set(found))


def override_message(paths: Iterable[str], release: PlatformRelease | None) -> str:
    pinned = (
        f"vLLM {release.vllm_version} in {release.triton_image}"
        if release is not None
        else "the platform release"
    )
    return (
        f"{', '.join(paths)}: the vLLM version, serving image and pip requirements are pinned "
        f"by the platform ({pinned}) and cannot be set or overridden, because Triton's vLLM "
        "backend is built against one vLLM API and a mismatched pair does not load at all."
    )


def reject_version_overrides(payload: Any, release: PlatformRelease | None, field: str) -> None:
    """Raise if any key or value anywhere in ``payload`` tries to override a pinned component."""
    paths = find_version_overrides(payload)
    if paths:
        raise ValidationError({field: [override_message(paths, release)]})


def validate_engine_args(engine_args: Any, release: PlatformRelease) -> None:
    """Check vLLM engine arguments against the release's allow-list and the values the pinned
    vLLM accepts, so a model that would not load is refused at registration, not on a GPU."""
    if not isinstance(engine_args, dict):
        raise ValidationError({"engine_args": ["Must be a JSON object of engine-argument names."]})
    reject_version_overrides(engine_args, release, "engine_args")
    if release.vllm_version != PINNED_VLLM_VERSION:
        raise ValidationError(
            {
                "engine_args": [
                    f"Release {release.name} pins vLLM {release.vllm_version}, whose engine "
                    f"arguments this portal cannot check (it knows vLLM {PINNED_VLLM_VERSION}); "
                    "choose another release."
                ]
            }
        )
    errors: list[str] = []
    owned = sorted(set(engine_args) & PLATFORM_OWNED_ENGINE_ARGS)
    if owned:
        errors.append(
            f"{', '.join(owned)}: set by the platform from the artifact source, the model "
            "cache and the constraint processor; leave them out."
        )
    errors.extend(
        f"{name}: {why}" for name, why in REMOVED_ENGINE_ARGS.items() if name in engine_args
    )
    allowed = set(release.allowed_engine_args)
    unknown = sorted(
        set(engine_args) - allowed - PLATFORM_OWNED_ENGINE_ARGS - set(REMOVED_ENGINE_ARGS)
    )
    if unknown:
        errors.append(
            f"Unknown or not allowed engine argument(s): {', '.join(unknown)}. "
            f"Release {release.name} allows: {', '.join(sorted(allowed))}."
        )
    # A release saved before its allow-list was checked may still allow an unusable name.
    unusable = set(engine_args) & allowed - set(ENGINE_ARGS) - set(REMOVED_ENGINE_ARGS)
    errors.extend(unusable_engine_arg_errors(sorted(unusable - PLATFORM_OWNED_ENGINE_ARGS)))
    for name, value in engine_args.items():
        if name in allowed and name in ENGINE_ARGS:
            errors.extend(engine_arg_errors(name, value))
    if errors:
        raise ValidationError({"engine_args": errors})


def validate_artifact_uri(uri: Any) -> str:
    """Accept ``s3://bucket/prefix``, ``hf://org/name[@revision]`` or ``file:///path`` under an
    allowed root; reject everything else, including any ``..`` segment."""
    field = "artifact_uri"
    if not isinstance(uri, str) or not uri:
        raise ValidationError({field: ["Must be a non-empty string."]})
    if len(uri) > MAX_URI_LENGTH:
        raise ValidationError({field: [f"Must be at most {MAX_URI_LENGTH} characters."]})
    if any(ch.isspace() or ord(ch) < 32 or ch == "\\" for ch in uri):
        raise ValidationError({field: ["Must not contain whitespace, control characters or '\\'."]})
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise ValidationError(
            {field: [f"Scheme {scheme or '(none)'!r} is not allowed; use s3://, hf:// or file://."]}
        )
    if parts.query or parts.fragment or "@" in parts.netloc or ":" in parts.netloc:
        raise ValidationError(
            {field: ["Must not carry credentials, a port, a query string or a fragment."]}
        )
    decoded = unquote(unquote(parts.path))
    if any(segment in {"..", "."} for segment in decoded.split("/")):
        raise ValidationError({field: ["Must not contain '.' or '..' path segments."]})
    if scheme == "s3":
        _check_s3(parts.netloc, decoded)
    elif scheme == "hf":
        _check_hf(parts.netloc, decoded)
    else:
        _check_file(parts.netloc, decoded)
    return uri


def _check_s3(bucket: str, key: str) -> None:
    if not _S3_BUCKET.match(bucket):
        raise ValidationError({"artifact_uri": [f"{bucket!r} is not a valid S3 bucket name."]})
    if "//" in key:
        raise ValidationError({"artifact_uri": ["S3 key prefix must not contain empty segments."]})


def _check_hf(org: str, rest: str) -> None:
    name, _, revision = rest.lstrip("/").partition("@")
    if not _HF_PART.match(org) or not _HF_PART.match(name):
        raise ValidationError(
            {"artifact_uri": ["Hugging Face sources look like hf://org/name or hf://org/name@rev."]}
        )
    if revision and not _HF_REVISION.match(revision):
        raise ValidationError({"artifact_uri": [f"{revision!r} is not a valid revision."]})


def _check_file(host: str, path: str) -> None:
    if host not in ("", "localhost"):
        raise ValidationError({"artifact_uri": ["file:// sources must be local (file:///path)."]})
    if not path.startswith("/"):
        raise ValidationError({"artifact_uri": ["file:// sources need an absolute path."]})
    resolved = Path(os.path.realpath(path))
    roots = settings.ARTIFACT_FILE_ROOTS
    if not any(resolved == root or root in resolved.parents for root in roots):
        allowed = ", ".join(str(root) for root in roots)
        raise ValidationError(
            {"artifact_uri": [f"{path} is outside the allowed artifact roots ({allowed})."]}
        )
    if settings.ARTIFACT_FILE_CHECK_ON_REGISTER:
        _check_local_artifact(path, resolved)


def _check_local_artifact(path: str, resolved: Path) -> None:
    """The copy reads a ``file://`` source as one file or a directory holding files; one that
    is missing, empty or unreadable would only fail later on a worker, so say so now (the
    portal and the workers share the allowed roots)."""
    field = "artifact_uri"
    if not resolved.exists():
        raise ValidationError({field: [f"{path} does not exist."]})
    if not (resolved.is_file() or resolved.is_dir()):
        raise ValidationError({field: [f"{path} is neither a file nor a directory."]})
    if not os.access(resolved, os.R_OK | (os.X_OK if resolved.is_dir() else 0)):
        raise ValidationError({field: [f"{path} is not readable by the platform."]})
    if resolved.is_dir() and not any(p.is_file() for p in resolved.rglob("*")):
        raise ValidationError(
            {field: [f"{path} is a directory holding no files: point at the model's weights."]}
        )


def validate_io_spec(io_spec: Any) -> None:
    """A Python-backend tensor spec: ``{"inputs": [...], "outputs": [...]}``, each tensor with a
    name, a Triton data type (``TYPE_FP32``, ...) and dims (-1 for a variable size)."""
    field = "io_spec"
    if not isinstance(io_spec, dict) or not io_spec:
        raise ValidationError({field: ["The Python backend needs inputs and outputs."]})
    errors: list[str] = []
    unknown = sorted(set(io_spec) - {"inputs", "outputs", "max_batch_size"})
    if unknown:
        errors.append(f"Unknown key(s): {', '.join(unknown)}.")
    mbs = io_spec.get("max_batch_size", 0)
    if not isinstance(mbs, int) or isinstance(mbs, bool) or mbs < 0:
        errors.append("max_batch_size: must be a non-negative integer.")
    for side in ("inputs", "outputs"):
        tensors = io_spec.get(side)
        if not isinstance(tensors, list) or not tensors:
            errors.append(f"{side}: must be a non-empty list of tensors.")
            continue
        seen: set[str] = set()
        for index, tensor in enumerate(tensors):
            errors.extend(_tensor_errors(f"{side}[{index}]", tensor, seen))
    if errors:
        raise ValidationError({field: errors})


def _tensor_errors(where: str, tensor: Any, seen: set[str]) -> list[str]:
    if not isinstance(tensor, dict):
        return [f"{where}: must be an object with name, data_type and dims."]
    errors = []
    unknown = sorted(set(tensor) - IO_SPEC_TENSOR_KEYS)
    if unknown:
        errors.append(f"{where}: unknown key(s) {', '.join(unknown)}.")
    name = tensor.get("name")
    if not isinstance(name, str) or not _PYTHON_NAME.match(name):
        errors.append(f"{where}.name: must be an identifier of at most 64 characters.")
    elif name in seen:
        errors.append(f"{where}.name: {name!r} is declared twice.")
    else:
        seen.add(name)
    if tensor.get("data_type") not in TRITON_DATA_TYPES:
        errors.append(
            f"{where}.data_type: {tensor.get('data_type')!r} is not a Triton data type "
            f"(one of {', '.join(sorted(TRITON_DATA_TYPES))})."
        )
    dims = tensor.get("dims")
    valid_dims = (
        isinstance(dims, list)
        and 1 <= len(dims) <= MAX_TENSOR_DIMS
        and all(isinstance(d, int) and not isinstance(d, bool) and (d == -1 or d > 0) for d in dims)
    )
    if not valid_dims:
        errors.append(
            f"{where}.dims: must be a list of 1 to {MAX_TENSOR_DIMS} sizes, each positive or -1."
        )
    if "optional" in tensor and not isinstance(tensor["optional"], bool):
        errors.append(f"{where}.optional: must be true or false.")
    return errors


def validate_constraint_plugins(plugins: Any) -> None:
    known = set(settings.CONSTRAINT_PLUGINS)
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ValidationError({"constraint_plugins": ["Must be a list of plugin names."]})
    errors = [
        f"Unknown plugin {p!r}; known: {', '.join(sorted(known))}."
        for p in plugins
        if p not in known
    ]
    if len(set(plugins)) != len(plugins):
        errors.append("Each plugin may be listed once.")
    if errors:
        raise ValidationError({"constraint_plugins": errors})


def validate_version_spec(
    *,
    release: PlatformRelease,
    artifact_uri: Any,
    backend: str,
    engine_args: Any,
    io_spec: Any,
    api_surface: str,
    constraint_plugins: Any,
    python_model: str = "",
) -> None:
    """Validate a whole version as submitted, collecting every field's errors at once."""
    errors: dict[str, list[str]] = {}

    def collect(check, *args) -> None:
        try:
            check(*args)
        except ValidationError as exc:
            for key, messages in exc.message_dict.items():
                errors.setdefault(key, []).extend(messages)

    collect(validate_artifact_uri, artifact_uri)
    collect(validate_constraint_plugins, constraint_plugins)
    if python_model and backend != Backend.PYTHON:
        errors.setdefault("python_model", []).append("model.py applies to the Python backend only.")
    elif python_model:
        collect(validate_python_model, python_model)
    if backend == Backend.VLLM:
        collect(validate_engine_args, engine_args, release)
        if io_spec:
            errors.setdefault("io_spec", []).append(
                "Leave io_spec empty for the vLLM backend: Triton's vLLM backend generates the "
                "tensor spec itself. Use the Python backend for a custom I/O spec."
            )
    elif backend == Backend.PYTHON:
        collect(validate_io_spec, io_spec)
        if engine_args:
            errors.setdefault("engine_args", []).append(
                "Engine arguments apply to the vLLM backend only; leave them empty."
            )
        if api_surface == ApiSurface.OPENAI_GRPC:
            errors.setdefault("api_surface", []).append(
                "The OpenAI front end needs the vLLM backend's tensor contract; a Python-backend "
                "model is served over KServe v2 gRPC only (choose 'grpc')."
            )
        collect(reject_version_overrides, io_spec, release, "io_spec")
    else:
        errors.setdefault("backend", []).append(f"Unknown backend {backend!r}.")
    if errors:
        raise ValidationError(errors)


MAX_PYTHON_MODEL_BYTES = 1024 * 1024


def validate_python_model(source: Any) -> None:
    """Check an author's ``model.py`` statically: it parses, and defines
    ``TritonPythonModel.execute``. Author code is never imported or run in the portal."""
    field = "python_model"
    if not isinstance(source, str) or not source.strip():
        raise ValidationError({field: ["model.py is empty."]})
    if len(source.encode()) > MAX_PYTHON_MODEL_BYTES:
        raise ValidationError({field: [f"model.py is larger than {MAX_PYTHON_MODEL_BYTES} bytes."]})
    try:
        tree = ast.parse(source, filename="model.py")
    except SyntaxError as exc:
        raise ValidationError(
            {field: [f"model.py does not parse: line {exc.lineno}: {exc.msg}."]}
        ) from exc
    classes = [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel"
    ]
    if not classes:
        raise ValidationError(
            {field: ["model.py must define a top-level class TritonPythonModel."]}
        )
    methods = {
        node.name
        for node in classes[-1].body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if "execute" not in methods:
        raise ValidationError(
            {field: ["TritonPythonModel must define execute(self, requests), which Triton calls."]}
        )
