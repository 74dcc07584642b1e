"""Creating and changing deployments. State moves go through :mod:`portal.deployments.lifecycle`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.cache.services import prepare_for_deploy
from portal.core.actors import Actor
from portal.core.errors import Conflict
from portal.deployments import quotas, scaling_policy
from portal.deployments.kick import schedule
from portal.deployments.lifecycle import Action, record_event, request_action, transition_deployment
from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    DesiredState,
    EventKind,
    Instance,
    InstanceState,
    InstanceType,
    MultiRegionDeployment,
    ObservedState,
    Region,
    Strategy,
    WaveState,
    default_region,
)
from portal.deployments.rollout.judge import CanaryPolicy, PolicyError
from portal.deployments.runtime import regional_cache
from portal.deployments.runtime.launchers import get_launcher
from portal.deployments.state import rollout_limits
from portal.deployments.state.autoscaling import METRIC_WORDS, ScaleMetric
from portal.deployments.state.rollout_state import RolloutStep
from portal.deployments.traffic.routing import route_path
from portal.registry.models import Model, ModelVersion, VersionState

#: Who starts a region's rollout of a multi-region deployment.
WAVES = Actor(label="controller:waves")
#: What an update may change about how the next stages roll out.
ROLLOUT_SETTINGS = (
    "stages",
    "bake_seconds",
    "health_deadline_seconds",
    "max_error_rate",
    "canary_analysis",
    "canary_policy",
)


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


def _bounded(rollout: dict[str, object]) -> dict[str, object]:
    """The rollout settings :func:`rollout_limits.check_settings` checks (the canary ones are
    checked by the judge's policy parser)."""
    return {k: v for k, v in rollout.items() if not k.startswith("canary_")}


def _resolved_canary_policy(given: object) -> dict[str, object] | None:
    """The whole policy a given ``canary_policy`` means (fields left out take the platform
    default's; None for none given), or a refusal by field: ``canary_policy.metrics[1].alpha``."""
    if given is None:
        return None
    if not isinstance(given, dict):
        raise ValidationError({"canary_policy": ["Must be an object."]})
    try:
        return CanaryPolicy.from_dict(given).to_dict()
    except PolicyError as exc:
        raise ValidationError({f"canary_policy.{exc.field}": [exc.message]}) from exc


def _check_canary(strategy: str, stages: list[int], canary_analysis: bool) -> None:
    """Canary analysis compares two versions serving side by side: only a Red-Black rollout with
    a stage below 100% has that."""
    if not canary_analysis:
        return
    if strategy != Strategy.RED_BLACK:
        raise ValidationError(
            {"canary_analysis": ["Only a Red-Black rollout has two versions to compare."]}
        )
    if not any(int(p) < 100 for p in stages):
        raise ValidationError(
            {
                "canary_analysis": [
                    "Needs a stage below 100% (e.g. stages 10, 50, 100): at 100% the old version "
                    "takes no requests to compare the new one with."
                ]
            }
        )


def _change_words(name: str, before: object, after: object) -> str:
    if name == "canary_policy":
        return "canary_policy changed"
    return f"{name} {before} → {after}"


def check_instance_type(instance_type: InstanceType, version: ModelVersion) -> None:
    """Refuse an instance type that cannot serve the version's backend (see
    :meth:`InstanceType.cannot_run`), at deploy rather than when its instances fail to start."""
    why = instance_type.cannot_run(version.backend)
    if why is not None:
        raise ValidationError({"instance_type": [why]})


def instance_types_for(version: ModelVersion | None) -> list[InstanceType]:
    """The active instance types that can serve ``version`` (all active ones for None): what
    the deploy form offers."""
    active = InstanceType.objects.filter(is_active=True)
    if version is None:
        return list(active)
    return [t for t in active if t.cannot_run(version.backend) is None]


@dataclass(frozen=True)
class Deployed:
    """What :func:`deploy` did: ``created`` a new deployment, or rolled the model's live
    Red-Black deployment onto the version (``created`` false)."""

    deployment: Deployment
    created: bool


def deploy(
    *,
    model: Model,
    strategy: str,
    version: ModelVersion,
    instance_type: InstanceType,
    actor: Actor,
    replicas: int | None = None,
    stages: list[int] | None = None,
    bake_seconds: int | None = None,
    health_deadline_seconds: int | None = None,
    max_error_rate: float | None = None,
    canary_analysis: bool | None = None,
    canary_policy: dict[str, object] | None = None,
    allow_io_change: bool = False,
    scaling: dict[str, object] | None = None,
    region: Region | None = None,
) -> Deployed:
    """Serve ``version`` of ``model`` with ``strategy``: the one thing both the deploy page and
    ``POST /api/v1/deployments/`` do, so the same request has the same outcome in both.

    The rule: a model has one Red-Black endpoint, and deploying a version Red-Black onto a
    model whose Red-Black deployment is live rolls *that* deployment to the version (a staged
    rollout that rolls back to the serving version by itself on failure), exactly as updating
    its version would. Whoever deploys v5 Red-Black asks for v5 on the model's stable endpoint,
    and rolling the live deployment is the only way to give it; refusing (the API's old 409)
    only sent them to ``PATCH`` the deployment to do the same thing, and the deploy page has no
    other way to roll out a version. So:

    - Settings not given keep the live deployment's values (a call naming only the version
      never scales a deployment down to the defaults); given ones change it, recorded as an
      update. ``scaling`` holds the scaling policy's settings given
      (:mod:`.scaling_policy`).
    - The instance type is the live deployment's: a rollout cannot move the endpoint to another
      machine shape, so another one is refused (400) rather than silently ignored.
    - A rollout already under way, or an interface change without ``allow_io_change``, is
      refused as for an update (409 / 400), naming the deployment.
    - Versioned, or nothing live Red-Black: a new deployment, with the defaults of
      :mod:`portal.deployments.state.rollout_limits` for settings not given; a version already served
      Versioned by a live deployment is a conflict (409).
    """
    settings_given: dict[str, object] = {
        "stages": stages,
        "bake_seconds": bake_seconds,
        "health_deadline_seconds": health_deadline_seconds,
        "max_error_rate": max_error_rate,
        "canary_analysis": canary_analysis,
        "canary_policy": canary_policy,
    }
    rollout_limits.check_settings(replicas=replicas, **_bounded(settings_given))
    region = region or default_region()
    live = live_red_black(model, region) if strategy == Strategy.RED_BLACK else None
    if live is None:
        deployment = create_deployment(
            region=region,
            model=model,
            strategy=strategy,
            version=version,
            instance_type=instance_type,
            actor=actor,
            replicas=replicas,
            stages=stages,
            bake_seconds=bake_seconds,
            health_deadline_seconds=health_deadline_seconds,
            max_error_rate=max_error_rate,
            canary_analysis=canary_analysis,
            canary_policy=canary_policy,
            allow_io_change=allow_io_change,
            scaling=scaling,
        )
        return Deployed(deployment, created=True)
    if live.multi_region_id is not None:
        raise Conflict(
            f"Deployment {live.pk} is {region}'s part of multi-region deployment "
            f"{live.multi_region_id}: deploy a new version there, and it rolls out region by "
            "region."
        )
    if instance_type.pk != live.instance_type_id:
        raise ValidationError(
            {
                "instance_type": [
                    f"Deployment {live.pk} serves this model Red-Black on {live.instance_type}, "
                    f"and a rollout keeps its instance type: choose {live.instance_type}, or "
                    f"deploy v{version.number} Versioned to serve it on {instance_type}."
                ]
            }
        )
    _check_version(model, version)
    check_instance_type(instance_type, version)
    try:
        deployment = update_deployment(
            live,
            actor=actor,
            version=version,
            replicas=replicas,
            allow_io_change=allow_io_change,
            scaling=scaling,
            **{k: v for k, v in settings_given.items() if v is not None},
        )
    except Conflict as exc:
        raise Conflict(
            f"Cannot roll deployment {live.pk}, this model's live Red-Black deployment, onto "
            f"v{version.number}: {exc.message}"
        ) from exc
    return Deployed(deployment, created=False)


def create_deployment(
    *,
    model: Model,
    strategy: str,
    version: ModelVersion,
    instance_type: InstanceType,
    actor: Actor,
    replicas: int | None = None,
    stages: list[int] | None = None,
    bake_seconds: int | None = None,
    health_deadline_seconds: int | None = None,
    max_error_rate: float | None = None,
    canary_analysis: bool | None = None,
    canary_policy: dict[str, object] | None = None,
    allow_io_change: bool = False,
    scaling: dict[str, object] | None = None,
    region: Region | None = None,
    multi_region: MultiRegionDeployment | None = None,
    wave: int = 0,
    held: bool = False,
) -> Deployment:
    """Create a deployment serving ``version`` in ``region`` (None: the default region; people
    deploy through :func:`deploy`). A version not yet ready is waited for by the controller,
    and one whose weights were evicted from the model cache is copied back first. Settings not
    given take the defaults of :mod:`portal.deployments.state.rollout_limits`. ``multi_region`` and ``wave``
    make it a region's part of a multi-region deployment; ``held`` keeps it from starting
    (paused before its rollout) until its wave comes."""
    _check_version(model, version)
    region = region or default_region()
    if not instance_type.is_active:
        raise ValidationError({"instance_type": [f"Instance type {instance_type} is retired."]})
    if not region.is_active:
        raise ValidationError({"region": [f"Region {region} is retired."]})
    if not region.offers(instance_type):
        raise ValidationError(
            {"instance_type": [f"Region {region} does not offer instance type {instance_type}."]}
        )
    check_instance_type(instance_type, version)
    policy = scaling_policy.resolve(
        current=None, current_replicas=None, replicas=replicas, given=scaling or {}, version=version
    )
    replicas = policy.pop("replicas")
    stages = rollout_limits.default_stages() if stages is None else stages
    bake_seconds = rollout_limits.BAKE_SECONDS.default if bake_seconds is None else bake_seconds
    health_deadline_seconds = (
        rollout_limits.HEALTH_DEADLINE_SECONDS.default
        if health_deadline_seconds is None
        else health_deadline_seconds
    )
    max_error_rate = (
        rollout_limits.MAX_ERROR_RATE.default if max_error_rate is None else max_error_rate
    )
    rollout_limits.check_settings(
        replicas=replicas,
        stages=stages,
        bake_seconds=bake_seconds,
        health_deadline_seconds=health_deadline_seconds,
        max_error_rate=max_error_rate,
    )
    judged_by = _resolved_canary_policy(canary_policy) or CanaryPolicy.default().to_dict()
    _check_canary(strategy, stages, bool(canary_analysis))
    deployment = Deployment(
        model=model,
        strategy=strategy,
        target_version=version,
        instance_type=instance_type,
        replicas=replicas,
        **policy,
        stages=stages,
        bake_seconds=bake_seconds,
        health_deadline_seconds=health_deadline_seconds,
        max_error_rate=max_error_rate,
        canary_analysis=bool(canary_analysis),
        canary_policy=judged_by,
        allow_io_change=allow_io_change,
        region=region,
        multi_region=multi_region,
        wave=wave,
        desired_state=DesiredState.PAUSED if held else DesiredState.ACTIVE,
        created_by=actor.user,
    )
    try:
        with transaction.atomic():
            quotas.check_quota(
                model.team_id, replicas=policy["max_replicas"], instance_type=instance_type
            )
            deployment.save()
            record_event(
                deployment,
                actor=actor,
                kind=EventKind.CREATED,
                message=f"Deploy v{version.number} with {deployment.get_strategy_display()}, "
                f"{policy_words(deployment)} on {instance_type} in {region}"
                + (f" (wave {wave}, held until its wave starts)." if held else "."),
                to_state=ObservedState.PENDING,
                data={
                    "version": version.number,
                    "replicas": replicas,
                    "stages": stages,
                    "region": region.name,
                    **({"scaling": policy} if policy != _fixed(replicas) else {}),
                },
            )
    except IntegrityError as exc:
        existing = Deployment.objects.filter(
            model=model, region=region, observed_state__in=LIVE_STATES
        )
        if strategy == Strategy.RED_BLACK:
            existing = existing.filter(strategy=strategy)
            why = (
                f"this model already has a live Red-Black deployment in {region}; change its "
                "version instead"
            )
        else:
            existing = existing.filter(strategy=strategy, target_version=version)
            why = f"version {version.number} already has a live Versioned deployment"
        first = existing.first()
        raise Conflict(f"Cannot deploy: {why} (deployment {first.pk if first else '?'}).") from exc
    prepare_for_deploy(version)  # only once the deploy is accepted
    regional_cache.prepare(region, version)
    kick(deployment)
    return deployment


def update_deployment(
    deployment: Deployment,
    *,
    actor: Actor,
    version: ModelVersion | None = None,
    replicas: int | None = None,
    allow_io_change: bool = False,
    scaling: dict[str, object] | None = None,
    **rollout: object,
) -> Deployment:
    """Scale a deployment, change how its next stages roll out (``stages``, ``bake_seconds``,
    ``health_deadline_seconds``, ``max_error_rate``), or start a new Red-Black rollout towards
    another version.

    A version whose interface differs from the serving one is refused unless
    ``allow_io_change``: during a Red-Black rollout old callers would reach it and fail."""
    unknown = set(rollout) - set(ROLLOUT_SETTINGS)
    if unknown:
        raise TypeError(f"unknown rollout settings: {sorted(unknown)}")
    if version is not None and version.pk != deployment.target_version_id:
        _refuse_regional(deployment, "change its version")
    if rollout.get("canary_policy") is not None:
        rollout["canary_policy"] = _resolved_canary_policy(rollout["canary_policy"])
    rollout_limits.check_settings(replicas=replicas, **_bounded(rollout))
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if locked.observed_state not in LIVE_STATES:
            raise Conflict(f"Deployment is {locked.observed_state} and can no longer change.")
        changed = {k: v for k, v in rollout.items() if getattr(locked, k) != v}
        _check_canary(
            locked.strategy,
            changed.get("stages", locked.stages),  # type: ignore[arg-type]
            bool(changed.get("canary_analysis", locked.canary_analysis)),
        )
        if changed:
            record_event(
                locked,
                actor=actor,
                kind=EventKind.UPDATED,
                message="Rollout settings: "
                + ", ".join(_change_words(k, getattr(locked, k), v) for k, v in changed.items())
                + ".",
                data={k: [getattr(locked, k), v] for k, v in changed.items()},
            )
            for name, value in changed.items():
                setattr(locked, name, value)
            locked.save(update_fields=[*changed, "updated_at"])
        _apply_policy(locked, actor, replicas, scaling or {}, version or locked.target_version)
        if version is not None and version.pk != locked.target_version_id:
            _start_new_rollout(locked, version, actor, allow_io_change)
    deployment.refresh_from_db()
    kick(deployment)
    return deployment


def start_regional_rollout(
    deployment: Deployment, version: ModelVersion, *, promote: bool = False
) -> None:
    """The wave controller's start of a region's rollout (:mod:`~portal.deployments.regions.waves`): what a person's
    version change does, for a region's part of a multi-region deployment (whose interface
    was checked for every region when the new version was asked for)."""
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        _start_new_rollout(locked, version, WAVES, allow_io_change=True)
        if promote:
            locked.promote_requested = True
            locked.save(update_fields=["promote_requested", "updated_at"])
    deployment.refresh_from_db()
    kick(deployment)


def _fixed(replicas: int) -> dict[str, object]:
    """The policy of a fixed count: what a deployment without autoscaling has."""
    return {**scaling_policy.defaults(), "min_replicas": replicas, "max_replicas": replicas}


def policy_words(deployment: Deployment) -> str:
    """The scaling policy in a few words: "2 replica(s)", "1-4 replicas on in-flight requests
    per instance 4", with ", to zero after 600 s idle"."""
    if deployment.min_replicas == deployment.max_replicas:
        words = f"{deployment.replicas} replica(s)"
    else:
        words = (
            f"{deployment.min_replicas}-{deployment.max_replicas} replicas on "
            f"{METRIC_WORDS[ScaleMetric(deployment.scale_metric)]} {deployment.scale_target:g}"
        )
    if deployment.scale_to_zero_after_seconds is not None:
        words += f", to zero after {deployment.scale_to_zero_after_seconds} s idle"
    return words


def _apply_policy(
    locked: Deployment,
    actor: Actor,
    replicas: int | None,
    given: dict[str, object],
    version: ModelVersion,
) -> None:
    """Change the replicas and scaling policy of ``locked`` (inside its transaction), recorded
    as one update; a deployment asleep whose policy no longer scales to zero is woken."""
    if replicas is None and not given:
        return
    current = {name: getattr(locked, name) for name in scaling_policy.POLICY_SETTINGS}
    wanted = scaling_policy.resolve(
        current=current,
        current_replicas=locked.replicas,
        replicas=replicas,
        given=given,
        version=version,
    )
    changed = {k: v for k, v in wanted.items() if getattr(locked, k) != v}
    if not changed:
        return
    if wanted["max_replicas"] > locked.max_replicas:
        quotas.check_quota(
            locked.model.team_id,
            replicas=wanted["max_replicas"],
            instance_type=locked.instance_type,
            replacing=locked,
        )
    if (
        locked.min_replicas == locked.max_replicas
        and wanted["min_replicas"] == wanted["max_replicas"]
    ):
        shown = {k: v for k, v in changed.items() if k not in ("min_replicas", "max_replicas")}
    else:
        shown = changed  # a fixed count is its replicas; a policy shows its every change
    words = ", ".join(
        f"{'Replicas' if k == 'replicas' else k} {getattr(locked, k)} → {v}"
        for k, v in shown.items()
    )
    record_event(
        locked,
        actor=actor,
        kind=EventKind.UPDATED,
        message=f"{words[0].upper()}{words[1:]}.",
        data={k: [getattr(locked, k), v] for k, v in shown.items()},
    )
    for name, value in changed.items():
        setattr(locked, name, value)
    fields = [*changed, "updated_at"]
    if locked.scaling.asleep and locked.scale_to_zero_after_seconds is None:
        locked.scaling = locked.scaling.but(asleep_since=None, woken_at=time.time())
        fields.append("scaling")
    locked.save(update_fields=fields)


def _start_new_rollout(
    deployment: Deployment, version: ModelVersion, actor: Actor, allow_io_change: bool
) -> None:
    changed = _check_new_rollout(deployment, version, allow_io_change)
    old = deployment.target_version
    transition_deployment(
        deployment,
        ObservedState.PENDING,
        reason=f"New rollout v{old.number} → v{version.number}."
        + (f" Interface change allowed: {'; '.join(changed)}." if changed else ""),
        actor=actor,
        previous_version=old,
        target_version=version,
        current_stage=0,
        promote_requested=False,
        allow_io_change=allow_io_change,
        step=RolloutStep(),
        data={"from_version": old.number, "version": version.number},
    )
    prepare_for_deploy(version)
    regional_cache.prepare(deployment.region, version)


def check_rollout(
    regional: list[Deployment], version: ModelVersion, *, allow_io_change: bool
) -> None:
    """Refuse a multi-region rollout to ``version`` that any of its regions would refuse (the
    version, the instance type, scale to zero, the interface, a region not at rest), before
    anything moves anywhere."""
    for deployment in regional:
        try:
            _check_new_rollout(deployment, version, allow_io_change)
        except Conflict as exc:
            raise Conflict(f"In {deployment.region}: {exc.message}") from exc


def _check_new_rollout(
    deployment: Deployment, version: ModelVersion, allow_io_change: bool
) -> list[str]:
    """Why ``deployment`` cannot roll to ``version`` now (raises), else the interface changes
    it would make (allowed by ``allow_io_change``)."""
    if deployment.strategy != Strategy.RED_BLACK:
        raise ValidationError(
            {"version": ["A Versioned deployment serves one version; create a new deployment."]}
        )
    _check_version(deployment.model, version)
    why = deployment.instance_type.cannot_run(version.backend)
    if why is not None:  # a rollout keeps the deployment's instance type
        raise ValidationError(
            {
                "version": [
                    f"{why} Deployment {deployment.pk} keeps it; deploy v{version.number} "
                    "Versioned on another type."
                ]
            }
        )
    if deployment.scale_to_zero_after_seconds is not None:
        why = scaling_policy.cannot_scale_to_zero(version)
        if why is not None:
            raise ValidationError(
                {"version": [f"{why} Turn scale to zero off first (scale_to_zero_after_seconds)."]}
            )
    if deployment.observed_state != ObservedState.SERVING or (
        deployment.desired_state != DesiredState.ACTIVE
    ):
        raise Conflict(
            f"A rollout is already under way ({deployment.observed_state}); wait for it, "
            "promote it, or abort it first."
        )
    old = deployment.target_version
    changed = interface_changes(old, version)
    if changed and not allow_io_change:
        raise ValidationError(
            {
                "version": [
                    f"v{version.number} changes the model's interface ({'; '.join(changed)}). "
                    "During a Red-Black rollout callers still using the old interface would "
                    "reach it and fail: deploy it Versioned (its own endpoint), or set "
                    "allow_io_change if every caller copes with both."
                ]
            }
        )
    return changed


def act(deployment: Deployment, action: Action, *, actor: Actor, reason: str = "") -> Deployment:
    """Record a person's pause/resume/abort/promote/rollback and wake the controller for it.
    A region's part of a multi-region deployment takes its actions from the wave controller:
    people act on the whole rollout."""
    _refuse_regional(deployment, f"{action} it")
    deployment = request_action(deployment, action, actor=actor, reason=reason)
    kick(deployment)
    return deployment


def _refuse_regional(deployment: Deployment, what: str) -> None:
    if deployment.multi_region_id is not None:
        raise Conflict(
            f"Cannot {what}: deployment {deployment.pk} is {deployment.region}'s part of "
            f"multi-region deployment {deployment.multi_region_id}; act on the whole rollout "
            "there."
        )


def kick(deployment: Deployment) -> None:
    """Have the controller look at the deployment as soon as this transaction commits."""
    transaction.on_commit(lambda: schedule(deployment.pk))


# --- Strategy advice ---------------------------------------------------------------------------


def interface_changes(serving: ModelVersion, candidate: ModelVersion) -> list[str]:
    """How ``candidate``'s interface differs from ``serving``'s: what callers would notice."""
    changes = []
    if serving.backend != candidate.backend:
        changes.append(f"backend {serving.backend} → {candidate.backend}")
    if serving.api_surface != candidate.api_surface:
        changes.append(f"API surface {serving.api_surface} → {candidate.api_surface}")
    if serving.tool_call_parser != candidate.tool_call_parser:
        changes.append(
            f"tool-call format {serving.tool_call_parser} → {candidate.tool_call_parser}"
        )
    if (serving.io_spec or {}) != (candidate.io_spec or {}):
        changes.append("I/O spec (tensor names, types or shapes) differs")
    return changes


@dataclass(frozen=True)
class Advice:
    strategy: str
    reason: str
    interface_changes: list[str]


def live_red_black(model: Model, region: Region | None = None) -> Deployment | None:
    """The model's live Red-Black deployment in ``region`` (None: the default region; there is
    at most one per region): what a new version of an unchanged interface rolls onto."""
    return (
        Deployment.objects.filter(
            model=model,
            region=region or default_region(),
            strategy=Strategy.RED_BLACK,
            observed_state__in=LIVE_STATES,
        )
        .select_related("target_version", "instance_type")
        .first()
    )


def advise_strategy(
    model: Model, version: ModelVersion, serving: Deployment | None = None
) -> Advice:
    """Which strategy fits rolling out ``version``, and why, in words for the author.
    ``serving`` is the model's live Red-Black deployment when the caller already has it."""
    serving = serving or live_red_black(model)
    if serving is None:
        return Advice(
            Strategy.RED_BLACK,
            "Nothing serves this model Red-Black yet: Red-Black gives it one stable endpoint "
            "that later versions roll onto in stages. Choose Versioned only if callers must "
            "pin this exact version.",
            [],
        )
    changed = interface_changes(serving.target_version, version)
    if changed:
        return Advice(
            Strategy.VERSIONED,
            f"v{version.number} changes the interface of v{serving.target_version.number} "
            f"({'; '.join(changed)}). Red-Black would send old callers to it mid-rollout, where "
            "they fail. Versioned serves it on its own endpoint beside the old one, so callers "
            "switch when ready; it costs the new version's instances on top of the old ones "
            "until the old one is cleaned up.",
            changed,
        )
    return Advice(
        Strategy.RED_BLACK,
        f"v{version.number} keeps v{serving.target_version.number}'s interface: Red-Black "
        "shifts the existing endpoint to it in stages and rolls back by itself on failure, "
        "without extra instances beyond one stage.",
        [],
    )


# --- What beat looks after ---------------------------------------------------------------------


def watched_deployments() -> QuerySet[Deployment]:
    """Deployments the controller must keep looking at: live ones, and any with an instance
    still running."""
    running = Instance.objects.exclude(
        state__in=[InstanceState.STOPPED, InstanceState.FAILED]
    ).values("deployment_id")
    return Deployment.objects.filter(Q(observed_state__in=LIVE_STATES) | Q(pk__in=running))


def rolling_multi_region() -> list[int]:
    """Multi-region deployments whose wave controller has work: a rollout in flight, or an
    action asked of one at rest."""
    rolling = (WaveState.PENDING, WaveState.PROGRESSING, WaveState.PAUSED, WaveState.ROLLING_BACK)
    return list(
        MultiRegionDeployment.objects.filter(
            Q(observed_state__in=rolling)
            | Q(observed_state__in=(WaveState.SERVING, WaveState.HALTED))
            & ~Q(desired_state=DesiredState.ACTIVE)
        ).values_list("pk", flat=True)
    )


def stalled_deployments() -> list[int]:
    """Deployments the controller should be looking at and has not lately (its worker died)."""
    stale = timezone.now() - timedelta(seconds=settings.RECONCILE_STALE_SECONDS)
    return list(
        watched_deployments()
        .filter(Q(last_reconciled_at__isnull=True) | Q(last_reconciled_at__lt=stale))
        .values_list("pk", flat=True)
    )


def waiting_for(version: ModelVersion) -> list[int]:
    return list(
        Deployment.objects.filter(
            target_version=version, observed_state=ObservedState.PENDING
        ).values_list("pk", flat=True)
    )


def waiting_in_region(version_id: int, region_id: int) -> list[int]:
    return list(
        Deployment.objects.filter(
            target_version_id=version_id,
            region_id=region_id,
            observed_state=ObservedState.PENDING,
        ).values_list("pk", flat=True)
    )


def retire_idle_versioned() -> list[int]:
    """Retire Versioned deployments with no request for ``VERSIONED_IDLE_SECONDS``, never the
    newest version a model serves Versioned. Each region's gateways say when its routes were
    last called. Returns the retired deployments' ids."""
    seen_in: dict[int | None, dict[str, float] | None] = {
        region.pk: get_launcher(region).last_requests() for region in Region.objects.all()
    }
    idle_for = settings.VERSIONED_IDLE_SECONDS
    live = Deployment.objects.filter(
        strategy=Strategy.VERSIONED, observed_state__in=LIVE_STATES
    ).select_related("model__team", "target_version")
    newest: dict[
        tuple[int, int | None], int
    ] = {}  # by (model, region): each region keeps its latest
    for deployment in live:
        where = (deployment.model_id, deployment.region_id)
        newest[where] = max(newest.get(where, 0), deployment.target_version.number)
    retired = []
    for deployment in live:
        if deployment.observed_state != ObservedState.SERVING:
            continue
        latest = newest[(deployment.model_id, deployment.region_id)]
        if deployment.target_version.number == latest:
            continue  # the latest version is always kept
        seen = seen_in.get(deployment.region_id)
        if seen is None:
            continue  # its launcher cannot tell when a route was last called: keep it
        serving_since = (
            deployment.events.filter(to_state=ObservedState.SERVING)
            .order_by("-created_at")
            .values_list("created_at", flat=True)
            .first()
        )
        reported = seen.get(route_path(deployment), 0.0)
        remembered = deployment.last_request_at.timestamp() if deployment.last_request_at else 0.0
        if reported > remembered:
            Deployment.objects.filter(pk=deployment.pk).update(
                last_request_at=datetime.fromtimestamp(reported, tz=UTC)
            )
        called = max(reported, remembered)
        last = max(called, serving_since.timestamp() if serving_since else time.time())
        if time.time() - last < idle_for:
            continue
        transition_deployment(
            deployment,
            ObservedState.RETIRED,
            reason=f"No request for {idle_for} s and v{latest} is newer: "
            "retired by the Versioned clean-up.",
            traffic={},
        )
        retired.append(deployment.pk)
    return retired


def versions_in_use() -> set[int]:
    """Versions a live or recently finished deployment serves, may roll back to, or runs an
    instance of: the model cache never evicts their files (registered with the cache in
    ``DeploymentsConfig.ready``)."""
    recent = timezone.now() - timedelta(seconds=settings.MODEL_CACHE_RECENT_USE_SECONDS)
    deployments = Deployment.objects.filter(
        Q(observed_state__in=LIVE_STATES) | Q(updated_at__gte=recent)
    ).values_list("target_version_id", "previous_version_id")
    used = {vid for pair in deployments for vid in pair if vid is not None}
    used.update(
        Instance.objects.exclude(state__in=[InstanceState.STOPPED, InstanceState.FAILED])
        .values_list("version_id", flat=True)
        .distinct()
    )
    return used
