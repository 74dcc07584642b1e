"""Registering models and versions, and managing platform releases.

Views, forms, admin and tasks call these; none of them writes registry rows directly.
"""

from __future__ import annotations

from typing import Any

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
    ToolCallParser,
    VersionState,
)
from portal.registry.validation import validate_version_spec

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


def register_version(
    *,
    model: Model,
    artifact_uri: str,
    backend: str = Backend.VLLM,
    engine_args: dict[str, Any] | None = None,
    io_spec: dict[str, Any] | None = None,
    api_surface: str = ApiSurface.OPENAI_GRPC,
    constraint_plugins: list[str] | None = None,
    python_model: str = "",
    tool_call_parser: str = ToolCallParser.HERMES,
    created_by=None,
) -> ModelVersion:
    """Validate and store a new version with the next number, packaged against the default
    release. Materialization and packaging pick it up from the ``registered`` state."""
    engine_args = engine_args or {}
    io_spec = io_spec or {}
    constraint_plugins = constraint_plugins or []
    release = default_release()
    if tool_call_parser not in ToolCallParser.values:
        known = ", ".join(ToolCallParser.values)
        raise ValidationError({"tool_call_parser": [f"Unknown tool call format (known: {known})."]})
    validate_version_spec(
        release=release,
        artifact_uri=artifact_uri,
        backend=backend,
        engine_args=engine_args,
        io_spec=io_spec,
        api_surface=api_surface,
        constraint_plugins=constraint_plugins,
        python_model=python_model,
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
        version_created(version)  # the cache copies its weights once this commits
    return version


def retry_version(version: ModelVersion, *, actor: Actor) -> ModelVersion:
    """Send a failed version back to ``registered`` and copy it again."""
    if version.state != VersionState.FAILED:
        raise Conflict(
            f"Version {version.number} is {version.state}; only failed versions are retried.",
            code="not_failed",
        )
    # Back in registered, the cache copies its weights again (a hook of that state).
    return transition_version(
        version, VersionState.REGISTERED, reason="Retry requested.", actor=actor
    )


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
