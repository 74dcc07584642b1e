"""Deployments across regions: create one, roll it to a new version, act on the whole rollout.

What people ask for is recorded here; the wave controller (:mod:`~portal.deployments.regions.waves`) carries it out, one
region at a time, through each region's own Red-Black deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Prefetch, QuerySet

from portal.core.actors import Actor
from portal.core.errors import Conflict, InvalidTransition
from portal.deployments import services
from portal.deployments.kick import schedule_waves
from portal.deployments.lifecycle import Action
from portal.deployments.models import (
    LIVE_STATES,
    LIVE_WAVE_STATES,
    Deployment,
    DesiredState,
    EventKind,
    InstanceType,
    MultiRegionDeployment,
    OnRegionFailure,
    Region,
    Strategy,
    WaveState,
)
from portal.deployments.state import rollout_limits
from portal.registry.models import Model, ModelVersion


@dataclass(frozen=True)
class RegionPart:
    """One region of a multi-region deployment, in wave order: where, and how many."""

    region: Region
    replicas: int | None = None
    #: None: the multi-region deployment's instance type.
    instance_type: InstanceType | None = None


def create(
    *,
    model: Model,
    version: ModelVersion,
    regions: list[RegionPart],
    instance_type: InstanceType,
    actor: Actor,
    on_region_failure: str = OnRegionFailure.ROLL_BACK_ALL,
    wave_bake_seconds: int | None = None,
    **rollout: object,
) -> MultiRegionDeployment:
    """Deploy ``version`` Red-Black in every region of ``regions``, one wave per region in the
    order given: the first region starts now, each next one once the previous serves the
    version and baked ``wave_bake_seconds``. ``rollout``: each region's ``stages``,
    ``bake_seconds``, ``health_deadline_seconds``, ``max_error_rate``, ``canary_analysis``,
    ``canary_policy``, ``scaling``."""
    names = [part.region.name for part in regions]
    if not regions:
        raise ValidationError({"regions": ["Name at least one region."]})
    if len(set(names)) != len(names):
        raise ValidationError({"regions": ["A region appears twice."]})
    if on_region_failure not in OnRegionFailure.values:
        raise ValidationError(
            {"on_region_failure": [f"One of: {', '.join(OnRegionFailure.values)}."]}
        )
    wave_bake_seconds = (
        rollout_limits.WAVE_BAKE_SECONDS.default if wave_bake_seconds is None else wave_bake_seconds
    )
    error = rollout_limits.WAVE_BAKE_SECONDS.error(wave_bake_seconds)
    if error:
        raise ValidationError({"wave_bake_seconds": [error]})
    taken = Deployment.objects.filter(
        model=model,
        region__in=[p.region for p in regions],
        strategy=Strategy.RED_BLACK,
        observed_state__in=LIVE_STATES,
    ).select_related("region")
    for deployment in taken:
        raise Conflict(
            f"Cannot deploy across regions: deployment {deployment.pk} already serves this "
            f"model Red-Black in {deployment.region}."
        )
    try:
        with transaction.atomic():
            group = MultiRegionDeployment.objects.create(
                model=model,
                target_version=version,
                on_region_failure=on_region_failure,
                wave_bake_seconds=wave_bake_seconds,
                created_by=actor.user,
            )
            for wave, part in enumerate(regions, start=1):
                services.create_deployment(
                    model=model,
                    strategy=Strategy.RED_BLACK,
                    version=version,
                    instance_type=part.instance_type or instance_type,
                    actor=actor,
                    replicas=part.replicas,
                    region=part.region,
                    multi_region=group,
                    wave=wave,
                    held=wave > 1,
                    **rollout,  # type: ignore[arg-type]
                )
    except IntegrityError as exc:
        raise Conflict(
            "Cannot deploy across regions: this model already has a live multi-region "
            "deployment; deploy the new version there."
        ) from exc
    kick(group)
    return group


def roll_out(
    group: MultiRegionDeployment,
    version: ModelVersion,
    *,
    actor: Actor,
    allow_io_change: bool = False,
) -> MultiRegionDeployment:
    """Start rolling ``group`` to ``version``, region by region. Refused (nothing changes in
    any region) while a rollout is under way, or when a region could not take the version."""
    with transaction.atomic():
        locked = MultiRegionDeployment.objects.select_for_update().get(pk=group.pk)
        if locked.observed_state != WaveState.SERVING or (
            locked.desired_state != DesiredState.ACTIVE
        ):
            raise Conflict(
                f"A multi-region rollout is {locked.observed_state}; wait for it, promote it, "
                "abort it or roll it back first."
            )
        if version.pk == locked.target_version_id:
            raise ValidationError({"version": [f"v{version.number} already serves."]})
        regional = list(locked.regional.select_related("instance_type", "region", "model"))
        services.check_rollout(regional, version, allow_io_change=allow_io_change)
        previous = locked.target_version
        locked.previous_version = previous
        locked.target_version = version
        locked.observed_state = WaveState.PENDING
        locked.current_wave = 0
        locked.wave_phase = ""
        locked.promoted = locked.promote_requested = False
        locked.reason = locked.failed_region = ""
        locked.status_message = f"Rolling out v{version.number} region by region."
        locked.save()
        from portal.deployments.regions.waves import note

        note(
            locked,
            f"Roll out v{version.number} (from v{previous.number}) region by region: "
            f"{', '.join(str(d.region) for d in sorted(regional, key=lambda d: d.wave))}.",
            regional,
            actor=actor,
            kind=EventKind.UPDATED,
            version=version.number,
            from_version=previous.number,
        )
    kick(locked)
    return locked


def act(
    group: MultiRegionDeployment, action: Action, *, actor: Actor, reason: str = ""
) -> MultiRegionDeployment:
    """Record a pause/resume/promote/abort/rollback of the whole rollout; the wave controller
    carries it out in every region concerned."""
    from portal.deployments.regions.waves import note

    with transaction.atomic():
        locked = MultiRegionDeployment.objects.select_for_update().get(pk=group.pk)
        changes = action_changes(locked, action)
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.save(update_fields=[*changes, "updated_at"])
        note(
            locked,
            f"{action.capitalize()} requested for every region."
            + (f" Reason: {reason}" if reason else ""),
            list(locked.regional.select_related("region")),
            actor=actor,
            kind=EventKind.ACTION,
            action=str(action),
            reason=reason,
        )
    kick(locked)
    return locked


_IN_FLIGHT = (WaveState.PENDING, WaveState.PROGRESSING, WaveState.PAUSED)


def action_changes(group: MultiRegionDeployment, action: Action) -> dict[str, object]:
    observed, desired = group.observed_state, group.desired_state

    def refuse(why: str) -> InvalidTransition:
        return InvalidTransition(f"Cannot {action} this multi-region deployment: {why}")

    if desired not in (DesiredState.ACTIVE, DesiredState.PAUSED):
        raise refuse(f"it is already asked to {desired}.")
    if action == Action.PAUSE:
        if observed not in (WaveState.PENDING, WaveState.PROGRESSING) or desired != "active":
            raise refuse(f"it is {observed}, and only a rollout in progress can be paused.")
        return {"desired_state": DesiredState.PAUSED}
    if action == Action.RESUME:
        if desired != DesiredState.PAUSED:
            raise refuse("it is not paused.")
        return {"desired_state": DesiredState.ACTIVE}
    if action == Action.PROMOTE:
        if observed not in (WaveState.PROGRESSING, WaveState.PAUSED):
            raise refuse(f"it is {observed}; promote finishes a rollout in progress.")
        return {"desired_state": DesiredState.ACTIVE, "promote_requested": True}
    if action == Action.ABORT:
        if observed not in (*_IN_FLIGHT, WaveState.HALTED):
            raise refuse(f"it is {observed}; only a rollout in progress or halted can be aborted.")
        return {"desired_state": DesiredState.ABORTED}
    if action == Action.ROLLBACK:
        if group.previous_version_id is None:
            raise refuse("there is no previous version to go back to.")
        if observed not in (*_IN_FLIGHT, WaveState.SERVING, WaveState.HALTED):
            raise refuse(f"it is {observed}.")
        return {"desired_state": DesiredState.ROLLBACK}
    raise refuse("unknown action.")


def with_regions() -> QuerySet[MultiRegionDeployment]:
    """Multi-region deployments with their regions' deployments (in wave order) and those
    deployments' instances, as the page and the API show them, in four queries."""
    return MultiRegionDeployment.objects.select_related(
        "model__team", "target_version", "previous_version"
    ).prefetch_related(
        Prefetch(
            "regional",
            queryset=Deployment.objects.select_related(
                "region", "target_version", "previous_version", "model__team"
            )
            .prefetch_related("instances__version")
            .order_by("wave"),
        )
    )


def live(model: Model) -> MultiRegionDeployment | None:
    return MultiRegionDeployment.objects.filter(
        model=model, observed_state__in=LIVE_WAVE_STATES
    ).first()


def kick(group: MultiRegionDeployment) -> None:
    """Have the wave controller look at ``group`` as soon as this transaction commits."""
    transaction.on_commit(lambda: schedule_waves(group.pk))
