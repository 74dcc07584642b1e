"""The rollout controller: compare what a deployment wants with what runs, take one safe step.

:func:`reconcile` is the whole controller. It holds no state between calls: it observes the
deployment's instances through its launcher (:mod:`.instances`), decides from the deployment's
states, stage and ``step`` notes what the next safe step is, takes it, records why in the
timeline, and returns how soon it wants to look again. A worker killed anywhere in between
leaves a deployment that the next call picks up from the same facts.

Red-Black, per stage ``p`` of ``stages`` (``N`` replicas, new version ``T``, serving ``P``):

1. *scale*: start ``T`` instances up to ``ceil(N·p/100)``; wait until all pass health checks
   (within ``health_deadline_seconds``).
2. *shift*: in one routing-table write, send ``p``% to ``T`` and ``100-p``% to ``P``, and take
   ``P``'s instances beyond ``N - floor(N·p/100)`` out of it; once every gateway has the table,
   those drain. ``P`` is never shrunk before ``T`` is ready to take its share.
3. *bake*: for ``bake_seconds`` the new instances must stay healthy and their error rate (from
   their own metrics) within ``max_error_rate``; then the next stage. After the last stage's
   bake, ``P`` is retired.

Any failure, or an abort or rollback request, rolls back: ``P`` is first restored to ``N``
ready instances, then gets 100% of the traffic, and only then are ``T``'s instances drained.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.core.actors import CONTROLLER
from portal.core.redis_clients import redis_client
from portal.deployments import instances, routing
from portal.deployments.instances import View
from portal.deployments.launchers import get_launcher, version_set
from portal.deployments.lifecycle import record_event, transition_deployment
from portal.deployments.models import (
    Deployment,
    DesiredState,
    EventKind,
    ObservedState,
    Strategy,
)
from portal.deployments.rollout_health import RequestCounts, scrape_counts
from portal.registry.models import ModelVersion, VersionState

D = ObservedState
LOCK_SECONDS = 30
ERROR_RETRY_SECONDS = 5.0
#: How long a new instance may fail its health check during a bake before that is a failure.
UNHEALTHY_GRACE_SECONDS = 10
log = logging.getLogger(__name__)


def reconcile(deployment_id: int) -> float | None:
    """Take the next step for one deployment. Returns seconds until it should be looked at
    again, or None when it needs nothing more (a finished deployment with no instance left)."""
    client = redis_client()
    lock = client.lock(f"reconcile:{deployment_id}", timeout=LOCK_SECONDS)
    if not lock.acquire(blocking=False):
        return _interval()  # another worker is at it; look again soon in case it just finished
    try:
        deployment = (
            Deployment.objects.select_related(
                "model__team",
                "target_version__release",
                "target_version__model__team",
                "previous_version__release",
                "previous_version__model__team",
                "instance_type",
            )
            .filter(pk=deployment_id)
            .first()
        )
        if deployment is None:
            return None
        view = None
        try:
            view = instances.sync(deployment)
            delay = _STEPS[deployment.observed_state](deployment, view)
            instances.stop_drained(deployment, view, routing.publish(deployment, view.rows))
        except Exception as exc:  # a launcher or its API failing: say so, and try again
            log.exception("reconciling deployment %s failed", deployment_id)
            Deployment.objects.filter(pk=deployment_id).update(
                status_message=f"The controller hit an error and retries in "
                f"{ERROR_RETRY_SECONDS:.0f} s: {exc!r}"
            )
            delay = ERROR_RETRY_SECONDS
        with transaction.atomic():  # the step's bookkeeping in one commit
            if view is not None:
                instances.record_seen(view)
            Deployment.objects.filter(pk=deployment_id).update(last_reconciled_at=timezone.now())
        return delay
    finally:
        # A lock that expired (a step longer than LOCK_SECONDS) has nothing left to undo.
        with contextlib.suppress(redis.exceptions.LockError):
            lock.release()


# --- helpers ------------------------------------------------------------------------------------


def _interval() -> float:
    return settings.RECONCILE_INTERVAL_SECONDS


def _update(deployment: Deployment, **changes: Any) -> None:
    """Write controller-owned fields without touching what people write (desired state)."""
    Deployment.objects.filter(pk=deployment.pk).update(**changes, updated_at=timezone.now())
    for name, value in changes.items():
        setattr(deployment, name, value)


def _note(deployment: Deployment, message: str, **data: Any) -> None:
    record_event(deployment, actor=CONTROLLER, kind=EventKind.STATE, message=message, data=data)


def _waiting(deployment: Deployment, message: str) -> float:
    """Say what the rollout waits for (in the status, not the timeline: it repeats)."""
    if deployment.status_message != message:
        _update(deployment, status_message=message)
    return _interval()


def _start(deployment: Deployment, version: ModelVersion, count: int, why: str) -> None:
    names = get_launcher().start(version_set(deployment, version), count)
    instances.adopt(deployment, version, names)
    _note(
        deployment,
        f"Starting {count} instance(s) of v{version.number}: {why}.",
        version=version.number,
        instances=names,
    )


def _percent(deployment: Deployment) -> int:
    if deployment.previous_version_id is None or deployment.strategy == Strategy.VERSIONED:
        return 100
    # Entering PROGRESSING sets stage 1, so there is always a current stage here.
    return deployment.stage_percent or deployment.stages[0]


def _new_count(replicas: int, percent: int) -> int:
    return replicas if percent >= 100 else max(1, math.ceil(replicas * percent / 100))


def _old_count(replicas: int, percent: int) -> int:
    return replicas - math.floor(replicas * percent / 100)


def _traffic(deployment: Deployment, percent: int) -> dict[str, int]:
    split = {str(deployment.target_version.number): percent}
    if deployment.previous_version is not None and percent < 100:
        split[str(deployment.previous_version.number)] = 100 - percent
    return split


def _counts(view: View, version: ModelVersion) -> dict[str, list[float]]:
    counts = {}
    for instance in view.ready(version):
        url = instance.endpoints.get("metrics")
        scraped = scrape_counts(url) if url else None
        if scraped is not None:
            counts[instance.name] = scraped.as_list()
    return counts


# --- failures -----------------------------------------------------------------------------------


def _rollout_failure(deployment: Deployment, view: View) -> str | None:
    """Why the new version cannot go on, if it cannot."""
    target = deployment.target_version
    if target.state == VersionState.FAILED:
        return f"v{target.number} failed: {target.failure_reason}"
    since = float(deployment.step.get("rollout_started_at", 0))
    for instance in view.failed(target, since=since):
        return f"instance {instance.name} of v{target.number} crashed: {instance.health_message}"
    deadline = deployment.health_deadline_seconds
    for instance in view.not_ready(target):
        if time.time() - instance.created_at.timestamp() > deadline and not instance.was_ready:
            return (
                f"instance {instance.name} of v{target.number} did not pass its health check "
                f"within {deadline} s"
            )
    if deployment.step.get("phase") == "bake":
        for instance in view.unhealthy(target):
            # One slow health check is not a failure; one that keeps failing is.
            if time.time() - instance.updated_at.timestamp() > UNHEALTHY_GRACE_SECONDS:
                return (
                    f"instance {instance.name} of v{target.number} failed its health check for "
                    f"over {UNHEALTHY_GRACE_SECONDS} s"
                )
        return _error_rate_breach(deployment, view)
    return None


def _error_rate_breach(deployment: Deployment, view: View) -> str | None:
    baseline = deployment.step.get("baseline", {})
    total = RequestCounts(0, 0)
    for name, now in _counts(view, deployment.target_version).items():
        before = baseline.get(name, [0.0, 0.0])
        total = RequestCounts(
            total.success + now[0] - before[0], total.failure + now[1] - before[1]
        )
    if total.total < settings.ROLLOUT_MIN_REQUESTS:
        return None
    rate = total.failure / total.total
    if rate > deployment.max_error_rate:
        return (
            f"v{deployment.target_version.number}'s error rate {rate:.0%} "
            f"({total.failure:.0f} of {total.total:.0f} requests) exceeded the "
            f"{deployment.max_error_rate:.0%} bound during the bake"
        )
    return None


def _begin_rollback(deployment: Deployment, reason: str) -> float:
    previous = deployment.previous_version
    transition_deployment(
        deployment,
        D.ROLLING_BACK,
        reason=(
            f"Rolling back to v{previous.number}: {reason}."
            if previous is not None
            else f"Stopping the rollout: {reason}."
        ),
        step={"phase": "restore", "reason": reason},
    )
    return 0.0


# --- one function per observed state --------------------------------------------------------


def _pending(deployment: Deployment, view: View) -> float | None:
    target = deployment.target_version
    if deployment.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        if deployment.previous_version is not None:
            return _begin_rollback(deployment, "the rollout was aborted before it started")
        transition_deployment(deployment, D.ABORTED, reason="Aborted before anything started.")
        return 0.0
    if target.state == VersionState.FAILED:
        if deployment.previous_version is not None:
            return _begin_rollback(deployment, f"v{target.number} failed: {target.failure_reason}")
        transition_deployment(
            deployment, D.FAILED, reason=f"v{target.number} failed: {target.failure_reason}"
        )
        return 0.0
    if target.state != VersionState.READY:
        return _waiting(deployment, f"Waiting for v{target.number} to be ready ({target.state}).")
    if deployment.desired_state == DesiredState.PAUSED:
        return _waiting(deployment, "Paused before the rollout started.")
    plan = (
        f"stages {deployment.stages} % with {deployment.bake_seconds} s bake each"
        if deployment.previous_version is not None and deployment.strategy == Strategy.RED_BLACK
        else "all at once (nothing serves yet)"
    )
    transition_deployment(
        deployment,
        D.PROGRESSING,
        reason=f"Rolling out v{target.number} on {deployment.replicas} instance(s), {plan}.",
        current_stage=1,
        step={"phase": "scale", "rollout_started_at": time.time()},
    )
    return 0.0


def _progressing(deployment: Deployment, view: View) -> float | None:
    if deployment.desired_state == DesiredState.ABORTED:
        return _begin_rollback(deployment, "abort requested")
    if deployment.desired_state == DesiredState.ROLLBACK:
        return _begin_rollback(deployment, "rollback requested")
    if deployment.desired_state == DesiredState.PAUSED:
        transition_deployment(
            deployment,
            D.PAUSED,
            reason=f"Paused at stage {deployment.current_stage}; traffic stays {deployment.traffic}.",
        )
        return _interval()
    failure = _rollout_failure(deployment, view)
    if failure:
        return _begin_rollback(deployment, failure)
    last_stage = len(deployment.stages)
    if deployment.promote_requested:
        if deployment.current_stage < last_stage and deployment.previous_version is not None:
            _note(deployment, f"Promoted: skipping to stage {last_stage} (100%).")
            _update(
                deployment,
                current_stage=last_stage,
                step={**deployment.step, "phase": "scale"},
            )
        _update(deployment, promote_requested=False)
    phase = deployment.step.get("phase", "scale")
    if phase == "scale":
        return _scale(deployment, view)
    if phase == "shift":
        return _shifted(deployment, view)
    return _bake(deployment, view)


def _scale(deployment: Deployment, view: View) -> float:
    target, previous = deployment.target_version, deployment.previous_version
    percent = _percent(deployment)
    want = _new_count(deployment.replicas, percent)
    missing = want - len(view.live(target))
    if missing > 0:
        _start(deployment, target, missing, f"stage {deployment.current_stage} needs {want}")
        return _interval()
    ready = len(view.ready(target))
    if ready < want:
        return _waiting(
            deployment,
            f"Stage {deployment.current_stage}: {ready} of {want} v{target.number} instance(s) "
            "passed their health check.",
        )
    # Every new instance is ready: shift traffic, and only now shrink the old set.
    retiring: list[str] = []
    if previous is not None and percent < 100:
        keep = _old_count(deployment.replicas, percent)
        retiring = instances.retire_extra(
            view,
            previous,
            keep,
            f"stage {deployment.current_stage}: v{previous.number} keeps {keep}",
        )
    traffic = _traffic(deployment, percent)
    _update(deployment, traffic=traffic, step={**deployment.step, "phase": "shift"})
    generation = routing.publish(deployment, view.rows)
    _update(deployment, step={**deployment.step, "generation": generation})
    _note(
        deployment,
        f"Stage {deployment.current_stage}/{len(deployment.stages)}: traffic "
        + ", ".join(f"v{v} {w}%" for v, w in traffic.items())
        + (
            f"; draining {len(retiring)} v{previous.number} instance(s)"
            if previous and retiring
            else ""
        )
        + ".",
        traffic=traffic,
        retiring=retiring,
    )
    return 0.0


def _shifted(deployment: Deployment, view: View) -> float:
    generation = int(deployment.step.get("generation", 0))
    if not get_launcher().traffic_applied(generation):
        return _waiting(deployment, "Waiting for the gateways to take the new traffic split.")
    _update(
        deployment,
        step={
            **deployment.step,
            "phase": "bake",
            "bake_started_at": time.time(),
            "baseline": _counts(view, deployment.target_version),
        },
        status_message=f"Stage {deployment.current_stage}: baking for {deployment.bake_seconds} s.",
    )
    return _interval()


def _bake(deployment: Deployment, view: View) -> float:
    previous = deployment.previous_version
    if previous is not None:
        ends = float(deployment.step["bake_started_at"]) + deployment.bake_seconds
        if ends > time.time():
            return min(_interval(), ends - time.time())
        _note(
            deployment,
            f"Stage {deployment.current_stage} baked: healthy, error rate in bounds.",
            bake_ended_at=ends,
        )
    if previous is not None and deployment.current_stage < len(deployment.stages):
        _update(
            deployment,
            current_stage=deployment.current_stage + 1,
            step={"phase": "scale", "rollout_started_at": deployment.step["rollout_started_at"]},
        )
        return 0.0
    retiring: list[str] = []
    if previous is not None:
        retiring = instances.retire_extra(view, previous, 0, f"v{previous.number} retired")
    transition_deployment(
        deployment,
        D.SERVING,
        reason=f"v{deployment.target_version.number} serves 100% on {deployment.replicas} "
        f"instance(s)"
        + (f"; draining {len(retiring)} v{previous.number} instance(s)." if previous else "."),
        traffic={str(deployment.target_version.number): 100},
        step={},
    )
    return 0.0


def _paused(deployment: Deployment, view: View) -> float | None:
    if deployment.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        return _begin_rollback(deployment, f"{deployment.desired_state} requested while paused")
    failure = _rollout_failure(deployment, view)
    if failure:
        return _begin_rollback(deployment, failure)
    if deployment.desired_state == DesiredState.ACTIVE:
        # The bake starts over: its baseline and clock are stale after a pause.
        phase = "shift" if deployment.step.get("phase") == "bake" else deployment.step.get("phase")
        transition_deployment(
            deployment,
            D.PROGRESSING,
            reason=f"Resumed at stage {deployment.current_stage}.",
            step={**deployment.step, "phase": phase or "scale"},
        )
        return 0.0
    return _interval()


def _rolling_back(deployment: Deployment, view: View) -> float | None:
    reason = deployment.step.get("reason", deployment.status_message)
    target, previous = deployment.target_version, deployment.previous_version
    if previous is None:
        # Nothing to go back to: take everything down, then say how it ended.
        if instances.retire_all(view, "the rollout ended"):
            return _interval()
        final = D.ABORTED if deployment.desired_state == DesiredState.ABORTED else D.FAILED
        transition_deployment(
            deployment, final, reason=reason[0].upper() + reason[1:] + ".", traffic={}, step={}
        )
        return None
    if deployment.step.get("phase") == "restore":
        missing = deployment.replicas - len(view.live(previous))
        if missing > 0:
            _start(deployment, previous, missing, "restoring the previous serving set")
            return _interval()
        ready = len(view.ready(previous))
        if ready < deployment.replicas:
            for instance in view.not_ready(previous):
                age = time.time() - instance.created_at.timestamp()
                if age > deployment.health_deadline_seconds:
                    transition_deployment(
                        deployment,
                        D.FAILED,
                        reason=f"Could not restore v{previous.number}: instance {instance.name} "
                        f"did not pass its health check within {deployment.health_deadline_seconds} s "
                        f"(rolling back because {reason}).",
                    )
                    return 0.0
            return _waiting(
                deployment,
                f"Restoring v{previous.number}: {ready} of {deployment.replicas} ready; "
                f"v{target.number} keeps its share until then.",
            )
        # The previous set is whole again: give it everything, then drain the new one.
        _update(
            deployment,
            traffic={str(previous.number): 100},
            step={**deployment.step, "phase": "drain"},
        )
        retiring = instances.retire_extra(view, target, 0, "rolled back")
        _note(
            deployment,
            f"v{previous.number} restored on {deployment.replicas} ready instance(s) and takes "
            f"100% of the traffic; draining {len(retiring)} v{target.number} instance(s).",
            traffic=deployment.traffic,
        )
        return 0.0
    if view.live(target) or view.draining(target):
        return _waiting(deployment, f"Draining v{target.number}.")
    transition_deployment(
        deployment,
        D.SERVING,
        reason=f"Rolled back to v{previous.number} because {reason}.",
        target_version=previous,
        previous_version=None,
        current_stage=0,
        desired_state=DesiredState.ACTIVE,
        promote_requested=False,
        step={},
    )
    return 0.0


def _serving(deployment: Deployment, view: View) -> float | None:
    target = deployment.target_version
    if deployment.desired_state == DesiredState.ROLLBACK and deployment.previous_version:
        return _begin_rollback(deployment, "rollback requested")
    for version in view.versions():
        if version.pk != target.pk:
            instances.retire_extra(view, version, 0, f"v{version.number} no longer serves")
    missing = deployment.replicas - len(view.live(target))
    if missing > 0:
        _start(deployment, target, missing, f"{deployment.replicas} replica(s) wanted")
        return _interval()
    if missing < 0:
        instances.retire_extra(view, target, deployment.replicas, "scaled down")
    wanted = {str(target.number): 100}
    if deployment.traffic != wanted:
        _update(deployment, traffic=wanted)
    return settings.RECONCILE_IDLE_INTERVAL_SECONDS


def _finished(deployment: Deployment, view: View) -> float | None:
    """Failed, aborted or retired: nothing may keep running."""
    if deployment.traffic:
        _update(deployment, traffic={})
    if instances.retire_all(view, f"the deployment is {deployment.observed_state}"):
        return _interval()
    return None


_STEPS: dict[str, Callable[[Deployment, View], float | None]] = {
    D.PENDING: _pending,
    D.PROGRESSING: _progressing,
    D.PAUSED: _paused,
    D.SERVING: _serving,
    D.ROLLING_BACK: _rolling_back,
    D.ABORTED: _finished,
    D.FAILED: _finished,
    D.RETIRED: _finished,
}
