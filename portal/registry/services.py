"""Registering models and versions, and managing platform releases.

Views, forms, admin and tasks call these; none of them writes registry rows directly.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from portal.accounts.models import Team
from portal.core.actors import Actor
from portal.core.errors import Conflict
from portal.registry.lifecycle import transition_version, version_created
from portal.registry.models import (
    ApiSurface,
    Backend,
    Model,
    ModelVersion,
    PlatformRelease,
    PluginWheel,
    ToolCallParser,
    VersionState,
)
from portal.registry.plugins import (
    PluginRefused,
    clash_errors,
    info_from_row,
    inspect_wheel,
    requirement_errors,
)
from portal.registry.validation import validate_artifact_uri, validate_version_spec
from serving.package import takes_logits_processors

EDITABLE_VERSION_STATES = (VersionState.REGISTERED, VersionState.FAILED)


def default_release() -> PlatformRelease:
    release = PlatformRelease.objects.filter(is_default=True).first()
    if release is None:
        raise Conflict(
            "No default platform release is configured; an operator must mark one as default.",
            code="no_default_release",
        )
    return release


def set_default_release(release: PlatformRelease) -> None:
    """Make ``release`` the one new versions are packaged against. Existing versions keep theirs."""
    with transaction.atomic():
        PlatformRelease.objects.select_for_update().filter(is_default=True).exclude(
            pk=release.pk
        ).update(is_default=False)
        PlatformRelease.objects.filter(pk=release.pk).update(is_default=True)
    release.is_default = True


def create_model(
    *, team: Team, slug: str, task: str, description: str = "", created_by=None
) -> Model:
    model = Model(team=team, slug=slug, task=task, description=description, created_by=created_by)
    model.full_clean(validate_unique=False, validate_constraints=False)
    try:
        with transaction.atomic():
            model.save()
    except IntegrityError as exc:
        raise ValidationError(
            {"slug": [f"Team {team.slug} already has a model {slug!r}."]}
        ) from exc
    return model


def update_model(model: Model, *, description: str | None = None) -> Model:
    if description is not None:
        model.description = description
        model.full_clean(validate_unique=False, validate_constraints=False)
        model.save(update_fields=["description"])
    return model


def check_version_spec(
    *,
    release: PlatformRelease,
    tool_call_parser: str = ToolCallParser.HERMES,
    plugins: list[PluginWheel] | None = None,
    **spec: Any,
) -> None:
    """Everything registering would refuse about a version, every field at once, storing
    nothing. The web form also calls it when some of its fields did not even parse, so the
    others' errors show in the same answer (as the API's do)."""
    errors: dict[str, list[str]] = {}
    if plugins:
        problems = plugin_errors(
            plugins,
            backend=spec.get("backend", Backend.VLLM),
            engine_args=spec.get("engine_args") or {},
            release=release,
        )
        if problems:
            errors["plugins"] = problems
    if tool_call_parser not in ToolCallParser.values:
        known = ", ".join(ToolCallParser.values)
        errors["tool_call_parser"] = [f"Unknown tool call format (known: {known})."]
    try:
        validate_version_spec(release=release, **spec)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if errors:
        raise ValidationError(errors)


def not_deployable_reason(version: ModelVersion) -> str | None:
    """Why a deploy of ``version`` cannot start from the pages now, or None when it can (it is
    ready). The pages offer deploying ready versions only; the API also takes one still being
    copied or packaged, which the controller waits for."""
    if version.state == VersionState.READY:
        return None
    if version.state == VersionState.FAILED:
        return (
            f"v{version.number} failed ({version.failure_reason}); retry it, with a corrected "
            "source if that was the problem, or register a new version."
        )
    return (
        f"v{version.number} is not ready yet ({version.get_state_display().lower()}); it can "
        "be deployed once its weights are copied and packaged."
    )


def default_api_surface(backend: str) -> str:
    """The OpenAI front end for vLLM; KServe v2 only for the Python backend, the one surface
    it supports (its tensors are the author's, not the OpenAI front end's contract)."""
    return ApiSurface.GRPC if backend == Backend.PYTHON else ApiSurface.OPENAI_GRPC


def register_version(
    *,
    model: Model,
    artifact_uri: str,
    backend: str = Backend.VLLM,
    engine_args: dict[str, Any] | None = None,
    io_spec: dict[str, Any] | None = None,
    api_surface: str | None = None,
    constraint_plugins: list[str] | None = None,
    python_model: str = "",
    tool_call_parser: str = ToolCallParser.HERMES,
    plugins: Iterable[str | int] | None = None,
    created_by=None,
) -> ModelVersion:
    """Validate and store a new version with the next number, packaged against the default
    release. Materialization and packaging pick it up from the ``registered`` state. The API
    surface defaults to the one the backend supports best (:func:`default_api_surface`).
    ``plugins`` names uploaded plugin wheels of the model's team, by sha256 or id."""
    api_surface = api_surface or default_api_surface(backend)
    wheels = team_plugin_wheels(model.team, plugins or [])
    engine_args = engine_args or {}
    io_spec = io_spec or {}
    constraint_plugins = constraint_plugins or []
    release = default_release()
    check_version_spec(
        release=release,
        artifact_uri=artifact_uri,
        backend=backend,
        engine_args=engine_args,
        io_spec=io_spec,
        api_surface=api_surface,
        constraint_plugins=constraint_plugins,
        python_model=python_model,
        tool_call_parser=tool_call_parser,
        plugins=wheels,
    )
    with transaction.atomic():
        locked = Model.objects.select_for_update().get(pk=model.pk)
        number = locked.next_version_number
        locked.next_version_number = number + 1
        locked.save(update_fields=["next_version_number"])
        version = ModelVersion.objects.create(
            model=locked,
            number=number,
            artifact_uri=artifact_uri,
            backend=backend,
            engine_args=engine_args,
            io_spec=io_spec,
            api_surface=api_surface,
            constraint_plugins=constraint_plugins,
            python_model=python_model,
            tool_call_parser=tool_call_parser,
            release=release,
            created_by=created_by,
        )
        if wheels:
            version.plugins.set(wheels)
        version_created(version)  # the cache copies its weights once this commits
    return version


def retry_version(
    version: ModelVersion, *, actor: Actor, artifact_uri: str | None = None
) -> ModelVersion:
    """Send a failed version back to ``registered`` and copy it again, from ``artifact_uri``
    when given: a failure is often a typo in the source, which this corrects (checked as at
    registration) instead of a new version being needed."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.state != VersionState.FAILED:
            raise Conflict(
                f"Version {locked.number} is {locked.state}; only failed versions are retried.",
                code="not_failed",
            )
        reason = "Retry requested."
        if artifact_uri is not None and artifact_uri != locked.artifact_uri:
            validate_artifact_uri(artifact_uri)
            reason = f"Retry requested with the source {locked.artifact_uri} → {artifact_uri}."
            locked.artifact_uri = artifact_uri
            locked.save(update_fields=["artifact_uri"])
        # Back in registered, the cache copies its weights again (a hook of that state).
        return transition_version(locked, VersionState.REGISTERED, reason=reason, actor=actor)


def update_version(version: ModelVersion, **fields: Any) -> ModelVersion:
    """Change a version that has not started processing. Ready versions are immutable."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.state not in EDITABLE_VERSION_STATES:
            raise Conflict(
                f"Version {locked.number} is {locked.state} and can no longer change; "
                "register a new version instead.",
                code="immutable_version",
            )
        for name, value in fields.items():
            setattr(locked, name, value)
        validate_version_spec(
            release=locked.release,
            artifact_uri=locked.artifact_uri,
            backend=locked.backend,
            engine_args=locked.engine_args,
            io_spec=locked.io_spec,
            api_surface=locked.api_surface,
            constraint_plugins=locked.constraint_plugins,
            python_model=locked.python_model,
        )
        locked.save()
    return locked


# --- plugin wheels ------------------------------------------------------------------------------

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def plugins_dir() -> Path:
    return settings.MODEL_CACHE_ROOT / "plugins"


def team_plugin_wheels(team: Team, refs: Iterable[str | int]) -> list[PluginWheel]:
    """The team's uploaded wheels that ``refs`` name (sha256 or id), in order; an unknown one,
    or another team's, is a ``plugins`` field error."""
    found: list[PluginWheel] = []
    errors = []
    for ref in refs:
        text = str(ref).strip().lower()
        rows = PluginWheel.objects.filter(team=team)
        if _SHA256.match(text):
            wheel = rows.filter(sha256=text).first()
        elif text.isdigit():
            wheel = rows.filter(pk=int(text)).first()
        else:
            errors.append(f"{ref!r} is neither a plugin wheel's sha256 nor its id.")
            continue
        if wheel is None:
            errors.append(f"No plugin wheel {ref!r} in team {team.slug}: upload it first.")
        elif wheel in found:
            errors.append(f"{wheel.filename} is named twice.")
        else:
            found.append(wheel)
    if errors:
        raise ValidationError({"plugins": errors})
    return found


def plugin_errors(
    plugins: list[PluginWheel], *, backend: str, engine_args: dict[str, Any], release
) -> list[str]:
    """Why these uploaded wheels cannot ship with a version of this backend and release."""
    if backend != Backend.VLLM:
        return [
            "Plugins extend vLLM; a Python-backend version runs your model.py, not vLLM. Ship "
            "what model.py imports in its artifact instead."
        ]
    errors = []
    infos = [info_from_row(w) for w in plugins]
    for info in infos:
        errors += [f"{info.filename}: {e}" for e in requirement_errors(info.requires, release)]
    errors += clash_errors(infos)
    if any(info.logits_processors for info in infos) and not takes_logits_processors(engine_args):
        errors.append(
            "vLLM refuses custom logits processors for pooling models and with speculative "
            "decoding; the model would not load."
        )
    return errors


def upload_plugin_wheel(
    *, team: Team, chunks: Iterable[bytes], filename: str, created_by=None
) -> tuple[PluginWheel, bool]:
    """Store an uploaded wheel content-addressed under ``MODEL_CACHE_ROOT/plugins/`` (written
    beside its place, fsynced, renamed in) once it was inspected; return its row and whether it
    is new (the same bytes uploaded again by the team give the row they already have)."""
    limit = settings.PLUGIN_WHEEL_MAX_BYTES
    incoming = plugins_dir() / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=incoming, prefix=".upload-", suffix=".whl")
    tmp = Path(tmp_name)
    try:
        size = 0
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise ValidationError(
                        {"wheel": [f"{filename}: over the limit of {limit} bytes per wheel."]}
                    )
                handle.write(chunk)
        release = PlatformRelease.objects.filter(is_default=True).first()
        try:
            info = inspect_wheel(tmp, filename=filename, release=release)
        except PluginRefused as exc:
            raise ValidationError({"wheel": [str(exc)]}) from exc
        existing = PluginWheel.objects.filter(team=team, sha256=info.sha256).first()
        if existing is not None:
            return existing, False
        wheel = PluginWheel(
            team=team,
            sha256=info.sha256,
            filename=info.filename,
            name=info.name,
            version=info.version,
            entry_points=info.entry_points,
            requires=info.requires,
            size=info.size,
            created_by=created_by,
        )
        final = settings.MODEL_CACHE_ROOT / wheel.storage_path
        final.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("rb") as written:  # only a wheel that passed inspection is made durable
            os.fsync(written.fileno())
        os.replace(tmp, final)
        try:
            with transaction.atomic():
                wheel.save()
        except IntegrityError:  # the same bytes uploaded twice at once: one row wins
            return PluginWheel.objects.get(team=team, sha256=info.sha256), False
        return wheel, True
    finally:
        tmp.unlink(missing_ok=True)
