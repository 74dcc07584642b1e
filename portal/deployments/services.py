"""Creating and changing deployments. State moves go through :mod:`portal.core.transitions`."""

from __future__ import annotations

import itertools

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from portal.cache.services import prepare_for_deploy
from portal.core.actors import Actor
from portal.core.errors import Conflict
from portal.core.transitions import record_event, transition_deployment
from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    DesiredState,
    EventKind,
    InstanceType,
    ObservedState,
    Strategy,
)
from portal.registry.models import Model, ModelVersion, VersionState

MAX_REPLICAS = 64
MAX_BAKE_SECONDS = 24 * 3600


def validate_stages(stages: object) -> list[int]:
    valid = (
        isinstance(stages, list)
        and 1 <= len(stages) <= 10
        and all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 100 for s in stages)
        and all(a < b for a, b in itertools.pairwise(stages))
        and stages[-1] == 100
    )
    if not valid:
        raise ValidationError(
            {
                "stages": [
                    "Must be 1 to 10 increasing traffic percentages ending at 100, e.g. [10, 50, 100]."
                ]
            }
        )
    return stages  # type: ignore[return-value]


def _check_version(model: Model, version: ModelVersion) -> None:
    if version.model_id != model.pk:
        raise ValidationError({"version": [f"Version {version.pk} does not belong to {model}."]})
    if version.state == VersionState.FAILED:
        raise ValidationError(
            {
                "version": [
                    f"Version {version.number} failed ({version.failure_reason}); fix and retry it first."
                ]
            }
        )


def create_deployment(
    *,
    model: Model,
    strategy: str,
    version: ModelVersion,
    instance_type: InstanceType,
    actor: Actor,
    replicas: int = 1,
    stages: list[int] | None = None,
    bake_seconds: int = 60,
) -> Deployment:
    """Ask for ``version`` to be served. A version not yet ready is waited for by the controller,
    and one whose weights were evicted from the model cache is copied back first."""
    _check_version(model, version)
    if not instance_type.is_active:
        raise ValidationError({"instance_type": [f"Instance type {instance_type} is retired."]})
    stages = validate_stages(stages if stages is not None else [10, 50, 100])
    deployment = Deployment(
        model=model,
        strategy=strategy,
        target_version=version,
        instance_type=instance_type,
        replicas=replicas,
        stages=stages,
        bake_seconds=bake_seconds,
        created_by=actor.user,
    )
    try:
        with transaction.atomic():
            deployment.save()
            record_event(
                deployment,
                actor=actor,
                kind=EventKind.CREATED,
                message=f"Deploy v{version.number} with {deployment.get_strategy_display()}, "
                f"{replicas} replica(s) on {instance_type}.",
                to_state=ObservedState.PENDING,
                data={"version": version.number, "replicas": replicas, "stages": stages},
            )
    except IntegrityError as exc:
        existing = Deployment.objects.filter(model=model, observed_state__in=LIVE_STATES)
        if strategy == Strategy.RED_BLACK:
            existing = existing.filter(strategy=strategy)
            why = "this model already has a live Red-Black deployment; change its version instead"
        else:
            existing = existing.filter(strategy=strategy, target_version=version)
            why = f"version {version.number} already has a live Versioned deployment"
        first = existing.first()
        raise Conflict(f"Cannot deploy: {why} (deployment {first.pk if first else '?'}).") from exc
    prepare_for_deploy(version)  # only once the deploy is accepted
    return deployment


def update_deployment(
    deployment: Deployment,
    *,
    actor: Actor,
    version: ModelVersion | None = None,
    replicas: int | None = None,
) -> Deployment:
    """Scale a deployment, or start a new Red-Black rollout towards another version."""
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if locked.observed_state not in LIVE_STATES:
            raise Conflict(f"Deployment is {locked.observed_state} and can no longer change.")
        if replicas is not None and replicas != locked.replicas:
            record_event(
                locked,
                actor=actor,
                kind=EventKind.UPDATED,
                message=f"Replicas {locked.replicas} → {replicas}.",
                data={"replicas": [locked.replicas, replicas]},
            )
            locked.replicas = replicas
            locked.save(update_fields=["replicas", "updated_at"])
        if version is not None and version.pk != locked.target_version_id:
            _start_new_rollout(locked, version, actor)
    deployment.refresh_from_db()
    return deployment


def _start_new_rollout(deployment: Deployment, version: ModelVersion, actor: Actor) -> None:
    if deployment.strategy != Strategy.RED_BLACK:
        raise ValidationError(
            {"version": ["A Versioned deployment serves one version; create a new deployment."]}
        )
    _check_version(deployment.model, version)
    if deployment.observed_state != ObservedState.SERVING or (
        deployment.desired_state != DesiredState.ACTIVE
    ):
        raise Conflict(
            f"A rollout is already under way ({deployment.observed_state}); wait for it, "
            "promote it, or abort it first."
        )
    old = deployment.target_version
    transition_deployment(
        deployment,
        ObservedState.PENDING,
        reason=f"New rollout v{old.number} → v{version.number}.",
        actor=actor,
        previous_version=old,
        target_version=version,
        current_stage=0,
        promote_requested=False,
    )
    prepare_for_deploy(version)
