"""The wave controller: roll a multi-region deployment to a new version region by region.

Each region's part is an ordinary Red-Black :class:`~.models.Deployment` that the rollout
controller (:mod:`~portal.deployments.rollout.controller`) takes through its own stages and bakes, and rolls back by itself
when its new instances fail. This controller only decides *when* each region starts and what
a failure in one region does to the others, by writing the regional deployments' desired state
(their target version, pause, promote, abort, rollback) exactly as a person would. Like the
rollout controller it keeps nothing in memory: :func:`reconcile` reads the multi-region record
and its regions' deployments, takes one step and returns how soon to look again, so a worker
killed between two waves leaves a record the next one picks up.

For a new version ``T`` over the serving ``P``, wave ``i`` (one region, in ``wave`` order):

1. *rollout*: the region's deployment is pointed at ``T`` (or, in a first deploy, released from
   its hold) and runs its stages; the wave waits until it serves ``T`` at 100%.
2. *bake*: for ``wave_bake_seconds`` every region already moved must keep serving ``T`` with
   no instance of it failing; then wave ``i + 1``. After the last wave the rollout is done.

A region failing (its deployment rolled itself back, failed, or lost an instance of ``T``
during the bake between waves) follows ``on_region_failure``: *halt* stops the wave there,
regions already moved keep ``T``; *roll back all* asks every region already moved to roll
back to ``P`` as well, and the rollout ends serving ``P`` everywhere.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from portal.core.actors import CONTROLLER, Actor
from portal.core.redis_clients import redis_client
from portal.deployments import kick, services
from portal.deployments.lifecycle import record_event, transition_deployment
from portal.deployments.models import (
    Deployment,
    DesiredState,
    EventKind,
    Instance,
    InstanceState,
    MultiRegionDeployment,
    ObservedState,
    OnRegionFailure,
    WavePhase,
    WaveState,
)

W = WaveState
LOCK_SECONDS = 30
#: Observed states of a regional deployment whose own rollout is under way.
_ROLLING = (ObservedState.PENDING, ObservedState.PROGRESSING, ObservedState.PAUSED)


def reconcile(group_id: int) -> float | None:
    """Take the next step for one multi-region deployment; returns seconds until it should be
    looked at again, or None when it rests (serving, halted or ended: an action kicks it)."""
    lock = redis_client().lock(lock_key(group_id), timeout=LOCK_SECONDS)
    if not lock.acquire(blocking=False):
        return settings.RECONCILE_INTERVAL_SECONDS
    try:
        group = (
            MultiRegionDeployment.objects.select_related(
                "model__team", "target_version", "previous_version"
            )
            .filter(pk=group_id)
            .first()
        )
        if group is None:
            return None
        regional = list(_regional(group))
        delay = _STEPS[group.observed_state](group, regional)
        MultiRegionDeployment.objects.filter(pk=group_id).update(last_reconciled_at=timezone.now())
        return delay
    finally:
        with contextlib.suppress(redis.exceptions.LockError):
            lock.release()


def lock_key(group_id: int) -> str:
    return f"reconcile:wave:{group_id}"


def _regional(group: MultiRegionDeployment) -> QuerySet[Deployment]:
    return group.regional.select_related(
        "region", "target_version", "previous_version", "model__team"
    ).order_by("wave")


# --- helpers ------------------------------------------------------------------------------------


def _update(group: MultiRegionDeployment, **changes: Any) -> None:
    MultiRegionDeployment.objects.filter(pk=group.pk).update(**changes, updated_at=timezone.now())
    for name, value in changes.items():
        setattr(group, name, value)


def note(
    group: MultiRegionDeployment,
    message: str,
    regional: Deployment | list[Deployment],
    *,
    actor: Actor = CONTROLLER,
    kind: str = EventKind.STATE,
    **data: Any,
) -> None:
    """Record a step of the whole rollout in the timeline of the region(s) it concerns (every
    event belongs to a region's deployment, so each names its region)."""
    for deployment in regional if isinstance(regional, list) else [regional]:
        record_event(
            deployment,
            actor=actor,
            kind=kind,
            message=message,
            data={**data, "multi_region": group.pk, "region": deployment.region.name},
        )


def _transition(
    group: MultiRegionDeployment,
    state: str,
    message: str,
    regional: list[Deployment],
    **changes: Any,
) -> float:
    _update(group, observed_state=state, status_message=message, **changes)
    note(group, message, regional, wave_state=state)
    return 0.0


def _waiting(group: MultiRegionDeployment, message: str) -> float:
    if group.status_message != message:
        _update(group, status_message=message)
    return settings.RECONCILE_INTERVAL_SECONDS


def _ask(deployment: Deployment, why: str, **desired: Any) -> None:
    """Set a regional deployment's desired fields (as a person's action would) and have the
    rollout controller look at it now."""
    Deployment.objects.filter(pk=deployment.pk).update(**desired, updated_at=timezone.now())
    for name, value in desired.items():
        setattr(deployment, name, value)
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.ACTION,
        message=why,
        data={**desired, "region": deployment.region.name},
    )
    kick.schedule(deployment.pk)


def _words(group: MultiRegionDeployment, regional: list[Deployment]) -> str:
    return f"Wave {group.current_wave} of {len(regional)}"


def _serves(deployment: Deployment, version_id: int) -> bool:
    """Whether the region serves ``version_id`` alone, its own rollout finished."""
    return (
        deployment.observed_state == ObservedState.SERVING
        and deployment.target_version_id == version_id
    )


def _failure(group: MultiRegionDeployment, deployment: Deployment) -> str | None:
    """Why a region the wave has reached no longer carries the new version, or None."""
    target = group.target_version
    if deployment.observed_state in (ObservedState.FAILED, ObservedState.ABORTED):
        return f"its deployment {deployment.observed_state}: {deployment.status_message}"
    if deployment.observed_state == ObservedState.ROLLING_BACK:
        return f"it is rolling back: {deployment.step.reason or deployment.status_message}"
    if deployment.target_version_id != target.pk and deployment.observed_state in (
        ObservedState.SERVING,
    ):
        return f"it rolled back to v{deployment.target_version.number}: {_why_back(deployment)}"
    return None


def _why_back(deployment: Deployment) -> str:
    """The reason the region's own rollback recorded."""
    event = (
        deployment.events.filter(data__has_key="rolled_back_from").order_by("-created_at").first()
    )
    return (event.data.get("reason") if event else None) or deployment.status_message


def _failed_since(group: MultiRegionDeployment, deployment: Deployment, since: float) -> int:
    """How many instances of the new version failed in the region since ``since``."""
    return Instance.objects.filter(
        deployment=deployment,
        version=group.target_version,
        state=InstanceState.FAILED,
        updated_at__gte=datetime.fromtimestamp(since, tz=UTC),
    ).count()


# --- the waves ----------------------------------------------------------------------------------


def _start_wave(group: MultiRegionDeployment, regional: list[Deployment]) -> float:
    """Point the current wave's region at the new version (idempotent: a region already on it
    is only released from a hold or promoted)."""
    deployment = regional[group.current_wave - 1]
    target = group.target_version
    words = _words(group, regional)
    if deployment.target_version_id != target.pk:
        if deployment.observed_state != ObservedState.SERVING:
            return _waiting(
                group,
                f"{words}: waiting for {deployment.region} to be serving "
                f"({deployment.observed_state}) before it rolls out v{target.number}.",
            )
        services.start_regional_rollout(deployment, target, promote=group.promoted)
        note(group, f"{words}: rolling out v{target.number} in {deployment.region}.", deployment)
    elif deployment.desired_state == DesiredState.PAUSED:
        _ask(
            deployment,
            f"{words}: released to roll out v{target.number} in {deployment.region}.",
            desired_state=DesiredState.ACTIVE,
            promote_requested=group.promoted,
        )
    _update(group, wave_phase=WavePhase.ROLLOUT, wave_started_at=time.time(), bake_started_at=None)
    return 0.0


def _region_failed(
    group: MultiRegionDeployment, regional: list[Deployment], failed: Deployment, why: str
) -> float:
    target = group.target_version
    moved = [d for d in regional[: group.current_wave] if d.pk != failed.pk]
    reason = f"v{target.number} failed in {failed.region}: {why}"
    changes = {"reason": reason, "failed_region": failed.region.name}
    if group.on_region_failure == OnRegionFailure.HALT:
        kept = ", ".join(str(d.region) for d in moved if _serves(d, target.pk))
        return _transition(
            group,
            W.HALTED,
            f"Halted at wave {group.current_wave} of {len(regional)}: {reason}."
            + (f" {kept} keep v{target.number}." if kept else "")
            + " Roll back, or deploy another version.",
            regional,
            **changes,
        )
    return _transition(
        group,
        W.ROLLING_BACK,
        f"Rolling back every region: {reason}.",
        regional,
        **changes,
    )


def _pending(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    if group.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        return _roll_back(group, regional, f"{group.desired_state} requested before it started")
    _update(group, observed_state=W.PROGRESSING, current_wave=1)
    note(
        group,
        f"Rolling out v{group.target_version.number} in {len(regional)} region(s), one wave "
        f"each: {', '.join(str(d.region) for d in regional)}"
        + (f", {group.wave_bake_seconds} s bake between waves." if len(regional) > 1 else "."),
        regional,
    )
    return _start_wave(group, regional)


def _progressing(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    if group.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        return _roll_back(group, regional, f"{group.desired_state} requested")
    active = regional[group.current_wave - 1]
    for deployment in regional[: group.current_wave]:
        why = _failure(group, deployment)
        if why is not None:
            return _region_failed(group, regional, deployment, why)
    if group.desired_state == DesiredState.PAUSED:
        if active.observed_state in _ROLLING and active.desired_state == DesiredState.ACTIVE:
            _ask(active, "Paused with the multi-region rollout.", desired_state=DesiredState.PAUSED)
        return _transition(
            group,
            W.PAUSED,
            f"Paused at wave {group.current_wave} of {len(regional)} ({active.region}).",
            regional,
        )
    if group.promote_requested:
        _update(group, promote_requested=False, promoted=True)
        note(group, "Promoted: every remaining region rolls out now, without bakes.", regional)
        if active.observed_state in (ObservedState.PROGRESSING, ObservedState.PAUSED):
            _ask(active, "Promoted with the multi-region rollout.", promote_requested=True)
    if group.wave_phase == WavePhase.BAKE:
        return _bake(group, regional)
    if active.target_version_id != group.target_version_id or (
        active.desired_state == DesiredState.PAUSED
        and active.observed_state == ObservedState.PENDING
    ):
        return _start_wave(group, regional)
    if not _serves(active, group.target_version_id):
        return _waiting(
            group,
            f"{_words(group, regional)}: {active.region} rolling out "
            f"(stage {active.current_stage} of {len(active.stages)}, {active.observed_state}).",
        )
    if group.current_wave == len(regional):
        return _transition(
            group,
            W.SERVING,
            f"v{group.target_version.number} serves in every region "
            f"({', '.join(str(d.region) for d in regional)}).",
            regional,
            wave_phase="",
            reason="",
            failed_region="",
        )
    note(
        group,
        f"{_words(group, regional)}: {active.region} serves v{group.target_version.number}.",
        active,
    )
    _update(group, wave_phase=WavePhase.BAKE, bake_started_at=time.time())
    return _bake(group, regional)


def _bake(group: MultiRegionDeployment, regional: list[Deployment]) -> float:
    """Between waves: the regions moved so far must keep the new version, healthy."""
    started = group.bake_started_at or time.time()
    for deployment in regional[: group.current_wave]:
        lost = _failed_since(group, deployment, started)
        if lost:
            return _region_failed(
                group,
                regional,
                deployment,
                f"{lost} instance(s) of v{group.target_version.number} failed during the bake "
                "between waves",
            )
    ends = started + group.wave_bake_seconds
    if not group.promoted and ends > time.time():
        _waiting(
            group,
            f"{_words(group, regional)} done; baking {group.wave_bake_seconds} s before "
            f"{regional[group.current_wave].region}.",
        )
        return min(settings.RECONCILE_INTERVAL_SECONDS, ends - time.time())
    if not group.promoted and group.wave_bake_seconds:
        note(
            group,
            f"{_words(group, regional)} baked: regions moved so far stayed healthy.",
            regional[: group.current_wave],
        )
    _update(group, current_wave=group.current_wave + 1)
    return _start_wave(group, regional)


def _paused(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    if group.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        return _roll_back(group, regional, f"{group.desired_state} requested while paused")
    for deployment in regional[: group.current_wave]:
        why = _failure(group, deployment)
        if why is not None:
            return _region_failed(group, regional, deployment, why)
    if group.desired_state != DesiredState.ACTIVE:
        return settings.RECONCILE_INTERVAL_SECONDS
    active = regional[group.current_wave - 1]
    if active.desired_state == DesiredState.PAUSED:
        _ask(active, "Resumed with the multi-region rollout.", desired_state=DesiredState.ACTIVE)
    # A bake between waves starts over: what was watched before the pause is stale.
    bake = {"bake_started_at": time.time()} if group.wave_phase == WavePhase.BAKE else {}
    return _transition(
        group,
        W.PROGRESSING,
        f"Resumed at wave {group.current_wave} of {len(regional)}.",
        regional,
        **bake,
    )


def _roll_back(group: MultiRegionDeployment, regional: list[Deployment], why: str) -> float:
    return _transition(
        group,
        W.ROLLING_BACK,
        f"Rolling back every region: {why}.",
        regional,
        reason=why,
    )


def _rolling_back(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    """Every region back on the previous version (or, in a first deploy, stopped); each
    region's own controller restores the previous set before draining the new one."""
    target, previous = group.target_version, group.previous_version
    busy = []
    for deployment in regional:
        if deployment.observed_state not in (
            ObservedState.PENDING,
            ObservedState.PROGRESSING,
            ObservedState.PAUSED,
            ObservedState.SERVING,
            ObservedState.ROLLING_BACK,
        ):
            continue  # ended (a first deploy's region aborted or failed)
        if deployment.target_version_id != target.pk:
            if deployment.observed_state != ObservedState.SERVING:
                busy.append(deployment)
            continue  # back on (or never left) the previous version
        if (
            deployment.previous_version_id is None
            and deployment.observed_state == ObservedState.SERVING
        ):
            # A first deploy has nothing to go back to: the region stops serving (as the
            # Versioned clean-up retires a deployment; its controller then drains it).
            transition_deployment(
                deployment,
                ObservedState.RETIRED,
                reason=f"Retired by the multi-region rollout, which had nothing to roll back to: "
                f"{group.reason}.",
                traffic={},
            )
            kick.schedule(deployment.pk)
            continue
        busy.append(deployment)
        if deployment.observed_state == ObservedState.ROLLING_BACK:
            continue
        if previous is None or deployment.previous_version_id is None:
            wanted = DesiredState.ABORTED
        else:
            wanted = DesiredState.ROLLBACK
        if deployment.desired_state != wanted:
            _ask(
                deployment,
                f"{'Rollback' if wanted == DesiredState.ROLLBACK else 'Abort'} requested by the "
                f"multi-region rollout: {group.reason or group.status_message}",
                desired_state=wanted,
                promote_requested=False,
            )
    if busy:
        return _waiting(
            group,
            f"Rolling back: waiting for {', '.join(str(d.region) for d in busy)}.",
        )
    if previous is None:
        _transition(
            group,
            W.ABORTED if group.desired_state == DesiredState.ABORTED else W.FAILED,
            f"Stopped in every region: {group.reason}.",
            regional,
        )
        return None
    _transition(
        group,
        W.SERVING,
        f"Rolled back: v{previous.number} serves in every region again because {group.reason}.",
        regional,
        target_version=previous,
        previous_version=None,
        desired_state=DesiredState.ACTIVE,
        promote_requested=False,
        promoted=False,
        current_wave=0,
        wave_phase="",
    )
    return None


def _serving(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    if group.desired_state == DesiredState.ROLLBACK and group.previous_version is not None:
        return _roll_back(group, regional, "rollback requested")
    return None


def _halted(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    if group.desired_state in (DesiredState.ROLLBACK, DesiredState.ABORTED):
        return _roll_back(group, regional, f"{group.desired_state} requested after a halt")
    return None


def _ended(group: MultiRegionDeployment, regional: list[Deployment]) -> float | None:
    return None


_STEPS: dict[str, Callable[[MultiRegionDeployment, list[Deployment]], float | None]] = {
    W.PENDING: _pending,
    W.PROGRESSING: _progressing,
    W.PAUSED: _paused,
    W.SERVING: _serving,
    W.HALTED: _halted,
    W.ROLLING_BACK: _rolling_back,
    W.ABORTED: _ended,
    W.FAILED: _ended,
}
