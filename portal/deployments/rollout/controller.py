"""The rollout controller: compare what a deployment wants with what runs, take one safe step.

:func:`reconcile` is the whole controller. It holds no state between calls: it observes the
deployment's instances through its launcher (:mod:`~portal.deployments.runtime.instances`), decides from the deployment's
states, stage and ``step`` notes what the next safe step is, takes it, records why in the
timeline, and returns how soon it wants to look again. A worker killed anywhere in between
leaves a deployment that the next call picks up from the same facts.

Red-Black, per stage ``p`` of ``stages`` (``N`` replicas, new version ``T``, serving ``P``):

1. *scale*: start ``T`` instances up to ``ceil(N·p/100)``; wait until all pass health checks
   (within ``health_deadline_seconds``).
2. *shift*: in one routing-table write, send ``p``% to ``T`` and ``100-p``% to ``P``.
3. *bake*: for ``bake_seconds`` the new instances must stay healthy and their error rate (from
   their own metrics) within ``max_error_rate``; then the next stage. ``P`` keeps all ``N``
   instances through every stage, the last one's bake included; only once that bake has
   passed is ``P`` retired.

Any failure, or an abort or rollback request, rolls back: ``P`` is first restored to ``N``
ready instances (it has them, unless some were lost), then gets 100% of the traffic, and only
then are ``T``'s instances drained.

``N`` itself is the autoscaler's when the deployment has a scaling policy (:mod:`~portal.deployments.state.autoscaling`):
each step first reads the serving instances' load and may change ``N``, and every set then
follows from it, so during a rollout both versions grow or shrink together at the stage's split.
A serving deployment idle for its ``scale_to_zero_after_seconds`` sleeps (every instance
drained, the route kept for the gateway to hold requests on) until :func:`wake` is asked for.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.core.actors import CONTROLLER
from portal.core.redis_clients import redis_client
from portal.deployments.lifecycle import record_event, transition_deployment
from portal.deployments.models import (
    Deployment,
    DesiredState,
    EventKind,
    ObservedState,
    StageAnalysis,
)
from portal.deployments.rollout import canary
from portal.deployments.rollout.judge import Analysis, CanaryPolicy
from portal.deployments.rollout.rollout_health import scrape_counts, scrape_load
from portal.deployments.rollout.status import traffic_text
from portal.deployments.rollout.strategies import RolloutPlan, plan_for
from portal.deployments.runtime import instances, regional_cache
from portal.deployments.runtime.instances import View
from portal.deployments.runtime.launchers import get_launcher, version_set
from portal.deployments.state import autoscaling
from portal.deployments.state.autoscaling import InstanceLoad, ScalingPolicy
from portal.deployments.state.healing import RestartPolicy
from portal.deployments.state.rollout_state import Phase, RequestCounts, RolloutStep
from portal.deployments.traffic import routing
from portal.registry.models import ModelVersion, VersionState

D = ObservedState
LOCK_SECONDS = 30
ERROR_RETRY_SECONDS = 5.0
#: How long a new instance may fail its health check during a bake before that is a failure.
UNHEALTHY_GRACE_SECONDS = 10
#: How soon a step looks again while an instance it started is loading (a wake, a scale-up):
#: its readiness is what held requests and new capacity wait for.
STARTING_INTERVAL_SECONDS = 1.0
#: States in which the autoscaler may change the count (not while rolling back: a rollback
#: restores the exact previous set).
SCALED_STATES = (ObservedState.SERVING, ObservedState.PROGRESSING, ObservedState.PAUSED)
log = logging.getLogger(__name__)


def reconcile(deployment_id: int) -> float | None:
    """Take the next step for one deployment. Returns seconds until it should be looked at
    again, or None when it needs nothing more (a finished deployment with no instance left)."""
    client = redis_client()
    lock = client.lock(lock_key(deployment_id), timeout=LOCK_SECONDS)
    if not lock.acquire(blocking=False):
        return _interval()  # another worker is at it; look again soon in case it just finished
    try:
        try:
            # get(), not filter().first(): no ORDER BY to compile (a fifth of a steady step).
            deployment = Deployment.objects.select_related(
                "model__team",
                "target_version__release",
                "target_version__model__team",
                "previous_version__release",
                "previous_version__model__team",
                "instance_type",
                "region",
            ).get(pk=deployment_id)
        except Deployment.DoesNotExist:
            return None
        view = None
        try:
            view = instances.sync(deployment)
            _autoscale(deployment, view)
            delay = _STEPS[deployment.observed_state](deployment, plan_for(deployment), view)
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


def lock_key(deployment_id: int) -> str:
    """The Redis lock held while a worker reconciles the deployment."""
    return f"reconcile:{deployment_id}"


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
    names = get_launcher(deployment.region).start(version_set(deployment, version), count)
    instances.adopt(deployment, version, names)
    _note(
        deployment,
        f"Starting {count} instance(s) of v{version.number}: {why}.",
        version=version.number,
        instances=names,
    )


def _restart_lost(
    deployment: Deployment, view: View, version: ModelVersion, want: int, why: str
) -> float | None:
    """Start instances of ``version`` up to ``want`` live ones, as soon as its failures allow
    (:mod:`~portal.deployments.state.healing`). Returns how soon to look again when it started some or must wait; None
    when nothing is missing."""
    missing = want - len(view.live(version))
    if missing <= 0:
        return None
    now = time.time()
    decision = RestartPolicy.from_settings().decide(view.failure_times(version), now)
    if decision.not_before <= now:
        _start(deployment, version, missing, why)
        return _interval()
    resume = timezone.localtime(datetime.fromtimestamp(decision.not_before, tz=UTC))
    if decision.crash_loop:
        last = max(view.failed(version, since=0), key=lambda r: r.updated_at)
        message = (
            f"Crash loop: v{version.number} had {decision.recent_failures} instance failures "
            f"in the last {settings.CRASH_LOOP_WINDOW_SECONDS / 60:.0f} min, so it is not "
            f"restarted before {resume:%H:%M:%S}. Last failure, instance {last.name}: "
            f"{last.health_message}"
        )
        if deployment.status_message != message:
            _note(deployment, message, version=version.number, crash_loop=True)
        _waiting(deployment, message)
    else:
        _waiting(
            deployment,
            f"Restarting: {missing} instance(s) of v{version.number} lost; starting again at "
            f"{resume:%H:%M:%S} (back-off after {decision.recent_failures} failure(s)).",
        )
    return min(settings.RECONCILE_IDLE_INTERVAL_SECONDS, max(decision.not_before - now, 0.0))


#: How the statuses :func:`_restart_lost` writes begin, so a whole set again can say so.
_HEALING_STATUS = ("Crash loop: ", "Restarting: ")


def _keep_fallback_share(deployment: Deployment, plan: RolloutPlan, view: View) -> None:
    """During a rollout, the previous version stays whole: an instance of it that dies is
    replaced (one of the new version's dying rolls back instead), so a rollback never waits
    for a start."""
    if plan.fallback is None:
        return
    shifted = deployment.traffic.get(deployment.target_version.number, 0)
    _restart_lost(
        deployment,
        view,
        plan.fallback,
        plan.old_instances(shifted),
        f"v{plan.fallback.number} stays whole until the last bake has passed",
    )


def _stage_words(plan: RolloutPlan, stage: int) -> str:
    """``Stage 2 of 3: `` for a staged shift; nothing for all at once, which has no stages."""
    return f"Stage {stage} of {plan.stage_count}: " if plan.fallback is not None else ""


def _paused_reason(deployment: Deployment, plan: RolloutPlan) -> str:
    split = traffic_text(deployment.traffic, deployment.target_version.number)
    where = f" at stage {deployment.current_stage} of {plan.stage_count}" if plan.fallback else ""
    return f"Paused{where}; traffic stays {split}."


def _counts(view: View, version: ModelVersion) -> dict[str, RequestCounts]:
    counts = {}
    for instance in view.ready(version):
        url = instance.endpoints.get("metrics")
        scraped = scrape_counts(url) if url else None
        if scraped is not None:
            counts[instance.name] = scraped
    return counts


# --- autoscaling --------------------------------------------------------------------------------


def _serving_rows(deployment: Deployment, view: View) -> list[Any]:
    """The ready instances of the versions the traffic split names: those taking the load."""
    versions = [v for v in (deployment.target_version, deployment.previous_version) if v]
    return [
        row
        for version in versions
        if deployment.traffic.get(version.number)
        for row in view.ready(version)
        if row.endpoints.get("metrics")
    ]


def _loads(rows: list[Any]) -> list[InstanceLoad]:
    """Each instance's load, read in parallel; those that did not answer are left out."""
    if not rows:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(rows))) as pool:
        found = pool.map(lambda row: scrape_load(row.endpoints["metrics"]), rows)
    return [load for load in found if load is not None]


def _autoscale(deployment: Deployment, view: View) -> None:
    """Set ``replicas`` from the serving instances' load, by the deployment's policy, and say
    why in the timeline when it changes. Asleep, rolling back or with a fixed count: nothing."""
    if deployment.observed_state not in SCALED_STATES or deployment.scaling.asleep:
        return
    policy = ScalingPolicy.of(deployment)
    if not policy.autoscales and deployment.replicas == policy.min_replicas:
        return
    loads = _loads(_serving_rows(deployment, view)) if policy.autoscales else []
    replicas, state, decision = autoscaling.decide(
        policy, deployment.scaling, deployment.replicas, loads, time.time()
    )
    if decision is None:
        if state != deployment.scaling:
            _update(deployment, scaling=state)
        return
    _update(deployment, replicas=replicas, scaling=state)
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.SCALING,
        message=f"Scaled {decision.replicas_from} → {decision.replicas_to}: {decision.reason}.",
        data=decision.to_json(),
    )


def _hold_stage_shares(deployment: Deployment, plan: RolloutPlan, view: View) -> None:
    """During a rollout, after ``N`` changed: the new version's set follows its share of the
    split already made (the *scale* phase grows it towards the next stage itself), and the
    previous version's to the new ``N`` (:func:`_keep_fallback_share` grows it)."""
    target = deployment.target_version
    shifted = deployment.traffic.get(target.number, 0)
    if deployment.step.phase in (Phase.SHIFT, Phase.BAKE) and shifted:
        want = plan.new_instances(shifted)
        live = len(view.live(target))
        if live < want:
            _start(deployment, target, want - live, f"{want} serve its {shifted}% now")
        elif live > want:
            instances.retire_extra(view, target, want, f"scaled down: {want} serve {shifted}%")
    if plan.fallback is not None:
        keep = plan.old_instances(shifted)
        if len(view.live(plan.fallback)) > keep:
            instances.retire_extra(
                view, plan.fallback, keep, f"scaled down: {keep} serve {100 - shifted}%"
            )


def _last_activity(deployment: Deployment, view: View, requests: dict[str, float]) -> float | None:
    """When the deployment last had a reason to be awake: its last request through the
    gateways (``requests``, by route), its last wake, or its newest instance becoming ready."""
    times = [deployment.scaling.woken_at, requests.get(routing.route_path(deployment))]
    if deployment.last_request_at is not None:
        times.append(deployment.last_request_at.timestamp())
    times += [r.ready_at.timestamp() for r in view.ready(deployment.target_version) if r.ready_at]
    found = [t for t in times if t is not None]
    return max(found) if found else None


def _maybe_sleep(deployment: Deployment, view: View) -> bool:
    """Scale to zero when the policy allows and nothing has called for that long, and no
    request is in flight on any instance. Returns whether it went to sleep."""
    after = deployment.scale_to_zero_after_seconds
    requests = get_launcher(deployment.region).last_requests() if after is not None else None
    if after is None or requests is None:
        return False  # (a launcher that cannot tell when a route was called never sleeps)
    idle = autoscaling.idle_for(_last_activity(deployment, view, requests), time.time())
    if idle < after:
        return False
    rows = _serving_rows(deployment, view)
    loads = _loads(rows)
    if len(loads) < len(rows) or any(load.in_flight for load in loads):
        return False  # a request still running, or an instance that did not say: stay up
    target = deployment.target_version
    retiring = instances.retire_extra(view, target, 0, "scaled to zero")
    message = (
        f"Scaled to zero: no request for {idle / 60:.0f} min (the policy's "
        f"{after} s); the gateway holds the next request and starts an instance."
    )
    _update(
        deployment,
        scaling=deployment.scaling.but(
            asleep_since=time.time(), recommendations=(), recording_since=None
        ),
        status_message=message,
    )
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.SCALING,
        message=message,
        data={"asleep": True, "idle_seconds": round(idle), "retiring": retiring},
    )
    return True


def _woken(deployment: Deployment, view: View) -> None:
    """After a wake, once the first instance is ready: how long the cold start took."""
    woken_at = deployment.scaling.woken_at
    ready = view.ready(deployment.target_version)
    if woken_at is None or not ready:
        return
    first = min((r.ready_at.timestamp() for r in ready if r.ready_at), default=time.time())
    seconds = round(max(0.0, first - woken_at), 2)
    _update(
        deployment,
        scaling=deployment.scaling.but(woken_at=None, cold_start_seconds=seconds),
        status_message=f"Awake: v{deployment.target_version.number} serves again; the cold "
        f"start took {seconds:.1f} s.",
    )
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.SCALING,
        message=f"Cold start: the first instance was ready {seconds:.1f} s after the wake.",
        data={"cold_start_seconds": seconds},
    )


# --- failures -----------------------------------------------------------------------------------


def _rollout_failure(deployment: Deployment, view: View) -> str | None:
    """Why the new version cannot go on, if it cannot."""
    target = deployment.target_version
    if target.state == VersionState.FAILED:
        return f"v{target.number} failed: {target.failure_reason}"
    for instance in view.failed(target, since=deployment.step.rollout_started_at):
        return f"instance {instance.name} of v{target.number} crashed: {instance.health_message}"
    deadline = deployment.health_deadline_seconds
    for instance in view.not_ready(target):
        if time.time() - instance.created_at.timestamp() > deadline and not instance.was_ready:
            return (
                f"instance {instance.name} of v{target.number} did not pass its health check "
                f"within {deadline} s"
            )
    if deployment.step.phase == Phase.BAKE:
        for instance in view.unhealthy_for(target, UNHEALTHY_GRACE_SECONDS):
            return (
                f"instance {instance.name} of v{target.number} failed its health check for "
                f"over {UNHEALTHY_GRACE_SECONDS} s"
            )
        return _error_rate_breach(deployment, view)
    return None


def _error_rate_breach(deployment: Deployment, view: View) -> str | None:
    now = _counts(view, deployment.target_version)
    step = deployment.step.with_late_baselines(now)
    if step is not deployment.step:
        _update(deployment, step=step)
    total = step.requests_since_baseline(now)
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


def _begin_rollback(deployment: Deployment, plan: RolloutPlan, reason: str) -> float:
    transition_deployment(
        deployment,
        D.ROLLING_BACK,
        reason=(
            f"Rolling back to v{plan.fallback.number}: {reason}."
            if plan.fallback is not None
            else f"Stopping the rollout: {reason}."
        ),
        step=RolloutStep(phase=Phase.RESTORE, reason=reason),
    )
    return 0.0


# --- one function per observed state --------------------------------------------------------


def _pending(deployment: Deployment, plan: RolloutPlan, view: View) -> float | None:
    target = deployment.target_version
    if deployment.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        if plan.fallback is not None:
            return _begin_rollback(deployment, plan, "the rollout was aborted before it started")
        transition_deployment(deployment, D.ABORTED, reason="Aborted before anything started.")
        return 0.0
    if target.state == VersionState.FAILED:
        why = f"v{target.number} failed: {target.failure_reason}"
        if plan.fallback is not None:
            return _begin_rollback(deployment, plan, why)
        transition_deployment(deployment, D.FAILED, reason=why)
        return 0.0
    if target.state != VersionState.READY:
        return _waiting(deployment, f"Waiting for v{target.number} to be ready ({target.state}).")
    try:
        copying = regional_cache.waiting_for(deployment.region, target)
    except regional_cache.CopyFailed as exc:
        if plan.fallback is not None:
            return _begin_rollback(deployment, plan, str(exc))
        transition_deployment(deployment, D.FAILED, reason=f"{str(exc)[0].upper()}{str(exc)[1:]}.")
        return 0.0
    if copying is not None:
        return _waiting(deployment, copying)
    if deployment.desired_state == DesiredState.PAUSED:
        return _waiting(deployment, "Paused before the rollout started.")
    transition_deployment(
        deployment,
        D.PROGRESSING,
        reason=f"Rolling out v{target.number} on {deployment.replicas} instance(s), "
        f"{plan.describe()}.",
        current_stage=1,
        step=RolloutStep(phase=Phase.SCALE, rollout_started_at=time.time()),
    )
    return 0.0


def _progressing(deployment: Deployment, plan: RolloutPlan, view: View) -> float | None:
    if deployment.desired_state == DesiredState.ABORTED:
        return _begin_rollback(deployment, plan, "abort requested")
    if deployment.desired_state == DesiredState.ROLLBACK:
        return _begin_rollback(deployment, plan, "rollback requested")
    if deployment.desired_state == DesiredState.PAUSED:
        transition_deployment(
            deployment,
            D.PAUSED,
            reason=_paused_reason(deployment, plan),
        )
        return _interval()
    failure = _rollout_failure(deployment, view)
    if failure:
        return _begin_rollback(deployment, plan, failure)
    _hold_stage_shares(deployment, plan, view)
    _keep_fallback_share(deployment, plan, view)
    if deployment.promote_requested:
        # Promote finishes the rollout now: straight to the last stage, and no bake (one under
        # way ends at once); health is still watched until the old version is retired.
        changes: dict[str, Any] = {
            "promote_requested": False,
            "step": deployment.step.but(promoted=True),
        }
        if deployment.current_stage < plan.stage_count:
            _note(deployment, f"Promoted: skipping to stage {plan.stage_count} (100%), no bake.")
            changes.update(
                current_stage=plan.stage_count,
                step=deployment.step.but(phase=Phase.SCALE, promoted=True),
            )
        elif deployment.step.phase == Phase.BAKE:
            _note(deployment, f"Promoted: the bake of stage {plan.stage_count} ends now.")
        _update(deployment, **changes)
    if deployment.step.phase == Phase.SHIFT:
        return _shifted(deployment, plan, view)
    if deployment.step.phase == Phase.BAKE:
        return _bake(deployment, plan, view)
    return _scale(deployment, plan, view)


def _scale(deployment: Deployment, plan: RolloutPlan, view: View) -> float:
    target, stage = deployment.target_version, deployment.current_stage
    percent = plan.percent(deployment)
    want = plan.new_instances(percent)
    missing = want - len(view.live(target))
    if missing > 0:
        _start(deployment, target, missing, f"stage {stage} needs {want}")
        return _interval()
    ready = len(view.ready(target))
    if ready < want:
        return _waiting(
            deployment,
            f"{_stage_words(plan, stage)}{ready} of {want} v{target.number} instance(s) passed "
            "their health check.",
        )
    # Every new instance is ready: shift traffic (the old set stays whole, see strategies.py).
    traffic = plan.traffic(percent)
    # The split is stored before it is published: a table rebuilt from the database (beat's
    # backstop, or a lost record) must carry it too.
    _update(deployment, traffic=traffic, step=deployment.step.but(phase=Phase.SHIFT))
    generation = routing.publish(deployment, view.rows)
    _update(deployment, step=deployment.step.but(generation=generation))
    _note(
        deployment,
        f"{_stage_words(plan, stage)}traffic {traffic_text(traffic, target.number)}.",
        traffic=traffic,
    )
    return 0.0


def _shifted(deployment: Deployment, plan: RolloutPlan, view: View) -> float:
    if not get_launcher(deployment.region).traffic_applied(deployment.step.generation):
        return _waiting(deployment, "Waiting for the gateways to take the new traffic split.")
    baseline = _counts(view, deployment.target_version)
    _update(
        deployment,
        step=deployment.step.but(
            phase=Phase.BAKE,
            bake_started_at=time.time(),
            extensions=0,
            baseline=baseline,
            unread=tuple(
                row.name
                for row in view.ready(deployment.target_version)
                if row.name not in baseline
            ),
        ),
        status_message=(
            f"{_stage_words(plan, deployment.current_stage)}baking for {deployment.bake_seconds} s."
            if plan.bakes and not deployment.step.promoted
            else "Every instance is ready and takes the traffic."
        ),
    )
    return _interval()


def _read_and_judge(
    deployment: Deployment, plan: RolloutPlan, view: View, ends: float
) -> canary.BakeJudgement:
    """Both versions' observations over the bake (their instances' front ends, and the
    gateways' for KServe requests), judged by the deployment's policy."""
    assert plan.fallback is not None
    target, fallback, started = (
        deployment.target_version,
        plan.fallback,
        deployment.step.bake_started_at,
    )
    return canary.judge_bake(
        CanaryPolicy.from_dict(deployment.canary_policy or {}),
        view.ready(fallback),
        view.ready(target),
        started,
        ends,
        gateway_records=get_launcher(deployment.region).gateway_observations(
            routing.route_path(deployment), started, ends
        ),
        labels=(f"v{fallback.number}", f"v{target.number}"),
    )


def _judge_bake(deployment: Deployment, plan: RolloutPlan, view: View, ends: float) -> float | str:
    """The canary analysis at the end of a bake (:mod:`.canary`). Returns how soon to look
    again when the rollout does not go on (it rolls back, holds, or bakes longer for want of
    data), else the words the "baked" note ends with."""
    assert plan.fallback is not None
    target, fallback, stage = deployment.target_version, plan.fallback, deployment.current_stage
    step = deployment.step
    # A worker that stopped after keeping this bake's verdict and before acting on it left
    # the verdict: act on it (the one on the page), not on a second reading.
    prior = canary.kept(deployment, ends)
    judgement: canary.BakeJudgement | None = None
    verdict: StageAnalysis | Analysis
    if prior is not None:
        verdict = prior
    else:
        judgement = _read_and_judge(deployment, plan, view, ends)
        verdict = judgement.analysis
    decision, reason, score = verdict.decision, verdict.reason, verdict.score

    def keep(action: str) -> None:
        if judgement is not None:
            canary.keep(deployment, judgement, fallback, action)

    words = f"canary analysis of stage {stage}: {reason}"
    data = {"canary": decision, "score": score}
    if decision == "promote":
        keep("the rollout went on")
        return f"; {words}"
    if decision == "rollback":
        keep(f"rolled back to v{fallback.number}")
        return _begin_rollback(deployment, plan, words)
    if decision == "not_enough_data":
        if step.extensions < settings.CANARY_MAX_BAKE_EXTENSIONS:
            action = f"bake extended by {deployment.bake_seconds} s"
            keep(action)
            _update(deployment, step=step.but(extensions=step.extensions + 1))
            _note(
                deployment,
                f"{_stage_words(plan, stage)}{action} "
                f"({step.extensions + 1} of {settings.CANARY_MAX_BAKE_EXTENSIONS}): {words}.",
                **data,
            )
            return _interval()
        words += f", after {step.extensions} extension(s) of the bake"
    keep("held for a person")
    transition_deployment(
        deployment,
        D.PAUSED,
        reason=f"Held at stage {stage} of {plan.stage_count}: {words}. Traffic stays "
        f"{traffic_text(deployment.traffic, target.number)}; resume to bake again, promote, or "
        "roll back.",
        data=data,
        desired_state=DesiredState.PAUSED,
    )
    return _interval()


def _bake(deployment: Deployment, plan: RolloutPlan, view: View) -> float:
    if plan.bakes and not deployment.step.promoted:
        step = deployment.step
        ends = step.bake_started_at + deployment.bake_seconds * (1 + step.extensions)
        if ends > time.time():
            return min(_interval(), ends - time.time())
        verdict = ""
        if deployment.canary_analysis and plan.fallback is not None:
            if canary.judged_stage(deployment.stage_percent):
                judged = _judge_bake(deployment, plan, view, ends)
                if isinstance(judged, float):
                    return judged
                verdict = judged
            else:
                verdict = (
                    f"; no canary analysis at {deployment.stage_percent}%: "
                    f"v{plan.fallback.number} takes no requests to compare with"
                )
        _note(
            deployment,
            f"Stage {deployment.current_stage} of {plan.stage_count} baked: healthy, error rate "
            f"in bounds{verdict}.",
            bake_ended_at=ends,
        )
    if deployment.current_stage < plan.stage_count:
        _update(
            deployment,
            current_stage=deployment.current_stage + 1,
            step=RolloutStep(
                phase=Phase.SCALE, rollout_started_at=deployment.step.rollout_started_at
            ),
        )
        return 0.0
    target, fallback = deployment.target_version, plan.fallback
    retiring: list[str] = []
    if fallback is not None:
        retiring = instances.retire_extra(view, fallback, 0, f"v{fallback.number} retired")
    transition_deployment(
        deployment,
        D.SERVING,
        reason=f"v{target.number} serves 100% on {deployment.replicas} instance(s)"
        + (f"; draining {len(retiring)} v{fallback.number} instance(s)." if fallback else "."),
        traffic={target.number: 100},
        step=RolloutStep(),
    )
    return 0.0


def _paused(deployment: Deployment, plan: RolloutPlan, view: View) -> float | None:
    if deployment.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
        return _begin_rollback(
            deployment, plan, f"{deployment.desired_state} requested while paused"
        )
    failure = _rollout_failure(deployment, view)
    if failure:
        return _begin_rollback(deployment, plan, failure)
    _hold_stage_shares(deployment, plan, view)
    _keep_fallback_share(deployment, plan, view)
    if deployment.desired_state == DesiredState.ACTIVE:
        # The bake starts over: its baseline and clock are stale after a pause.
        phase = deployment.step.phase or Phase.SCALE
        transition_deployment(
            deployment,
            D.PROGRESSING,
            reason=f"Resumed at stage {deployment.current_stage}.",
            step=deployment.step.but(phase=Phase.SHIFT if phase == Phase.BAKE else phase),
        )
        return 0.0
    return _interval()


def _rolling_back(deployment: Deployment, plan: RolloutPlan, view: View) -> float | None:
    reason = deployment.step.reason or deployment.status_message
    target, fallback = deployment.target_version, plan.fallback
    if fallback is None:
        # Nothing to go back to: take everything down, then say how it ended.
        if instances.retire_all(view, "the rollout ended"):
            return _interval()
        final = D.ABORTED if deployment.desired_state == DesiredState.ABORTED else D.FAILED
        transition_deployment(
            deployment,
            final,
            reason=reason[0].upper() + reason[1:] + ".",
            traffic={},
            step=RolloutStep(),
        )
        return None
    if deployment.step.phase == Phase.RESTORE:
        return _restore(deployment, fallback, reason, view)
    if view.live(target) or view.draining(target):
        return _waiting(deployment, f"Draining v{target.number}.")
    transition_deployment(
        deployment,
        D.SERVING,
        reason=f"Rolled back to v{fallback.number} because {reason}.",
        data={"rolled_back_from": target.number, "reason": reason},
        target_version=fallback,
        previous_version=None,
        current_stage=0,
        desired_state=DesiredState.ACTIVE,
        promote_requested=False,
        step=RolloutStep(),
    )
    return 0.0


def _restore(deployment: Deployment, fallback: ModelVersion, reason: str, view: View) -> float:
    """Bring the previous set back to full strength, then give it all the traffic and drain the
    new one; the new version keeps its share until then."""
    target, replicas = deployment.target_version, deployment.replicas
    missing = replicas - len(view.live(fallback))
    if missing > 0:
        _start(deployment, fallback, missing, "restoring the previous serving set")
        return _interval()
    ready = len(view.ready(fallback))
    if ready < replicas:
        deadline = deployment.health_deadline_seconds
        for instance in view.not_ready(fallback):
            if time.time() - instance.created_at.timestamp() > deadline:
                transition_deployment(
                    deployment,
                    D.FAILED,
                    reason=f"Could not restore v{fallback.number}: instance {instance.name} "
                    f"did not pass its health check within {deadline} s "
                    f"(rolling back because {reason}).",
                )
                return 0.0
        return _waiting(
            deployment,
            f"Restoring v{fallback.number}: {ready} of {replicas} ready; "
            f"v{target.number} keeps its share until then.",
        )
    _update(
        deployment,
        traffic={fallback.number: 100},
        step=deployment.step.but(phase=Phase.DRAIN),
    )
    retiring = instances.retire_extra(view, target, 0, "rolled back")
    _note(
        deployment,
        f"v{fallback.number} restored on {replicas} ready instance(s) and takes 100% of the "
        f"traffic; draining {len(retiring)} v{target.number} instance(s).",
        traffic=deployment.traffic,
    )
    return 0.0


def _serving(deployment: Deployment, plan: RolloutPlan, view: View) -> float | None:
    target = deployment.target_version
    if deployment.desired_state == DesiredState.ROLLBACK and plan.fallback is not None:
        return _begin_rollback(deployment, plan, "rollback requested")
    for version in view.versions():
        if version.pk != target.pk:
            instances.retire_extra(view, version, 0, f"v{version.number} no longer serves")
    if deployment.scaling.asleep:
        # Scaled to zero: nothing runs, the route stays (the gateways hold its requests).
        instances.retire_extra(view, target, 0, "scaled to zero")
        if deployment.traffic != {target.number: 100}:
            _update(deployment, traffic={target.number: 100})
        return settings.RECONCILE_IDLE_INTERVAL_SECONDS
    limit = settings.UNHEALTHY_REPLACE_SECONDS
    stuck = view.unhealthy_for(target, limit)
    if stuck:
        names = instances.retire(stuck, f"failed its health check for over {limit:.0f} s")
        _note(deployment, f"Replacing {len(names)} instance(s) failing their health check.")
    wait = _restart_lost(
        deployment, view, target, deployment.replicas, f"{deployment.replicas} replica(s) wanted"
    )
    if wait is not None:
        return wait
    if len(view.live(target)) > deployment.replicas:
        instances.retire_extra(view, target, deployment.replicas, "scaled down")
    wanted = {target.number: 100}
    if deployment.traffic != wanted:
        _update(deployment, traffic=wanted)
    ready = len(view.ready(target))
    if deployment.status_message.startswith(_HEALING_STATUS) and ready >= deployment.replicas:
        _update(
            deployment,
            status_message=f"v{target.number} serves on {ready} instance(s) again; lost "
            "instances were replaced.",
        )
    _woken(deployment, view)
    if view.not_ready(target):
        return STARTING_INTERVAL_SECONDS  # capacity (or a held request) waits for it
    if _maybe_sleep(deployment, view):
        return _interval()
    return settings.RECONCILE_IDLE_INTERVAL_SECONDS


def _finished(deployment: Deployment, plan: RolloutPlan, view: View) -> float | None:
    """Failed, aborted or retired: nothing may keep running."""
    if deployment.traffic:
        _update(deployment, traffic={})
    if instances.retire_all(view, f"the deployment is {deployment.observed_state}"):
        return _interval()
    return None


_STEPS: dict[str, Callable[[Deployment, RolloutPlan, View], float | None]] = {
    D.PENDING: _pending,
    D.PROGRESSING: _progressing,
    D.PAUSED: _paused,
    D.SERVING: _serving,
    D.ROLLING_BACK: _rolling_back,
    D.ABORTED: _finished,
    D.FAILED: _finished,
    D.RETIRED: _finished,
}
