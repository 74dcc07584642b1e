"""What the pages show about models and deployments, computed in one place from the rows the
controller and workers keep up to date (pages never ask a launcher or an instance directly)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Prefetch

from portal.core.errors import InvalidTransition
from portal.deployments.lifecycle import Action, action_changes
from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    Instance,
    InstanceState,
    ObservedState,
)
from portal.registry.models import Model

#: Instances shown on a deployment's page: those running or on their way in or out.
SHOWN_INSTANCE_STATES = (
    InstanceState.PENDING,
    InstanceState.STARTING,
    InstanceState.READY,
    InstanceState.UNHEALTHY,
    InstanceState.DRAINING,
)

#: What each action does, for its confirmation question.
ACTION_QUESTIONS = {
    Action.PAUSE: "Pause the rollout at its current stage?",
    Action.RESUME: "Resume the rollout?",
    Action.PROMOTE: "Skip the remaining stages and send all traffic to the new version?",
    Action.ABORT: "Abort the rollout? Traffic goes back to the serving version.",
    Action.ROLLBACK: "Roll back to the previous version? Its instances start again if needed.",
}


@dataclass(frozen=True)
class HealthBadge:
    """A badge: ``level`` is ok, warn, bad or idle (the CSS class), ``label`` what it says."""

    level: str
    label: str


def health_of(deployment: Deployment, instances: list[Instance]) -> HealthBadge:
    if deployment.observed_state not in LIVE_STATES:
        return HealthBadge("idle", deployment.get_observed_state_display())
    running = [i for i in instances if i.state in SHOWN_INSTANCE_STATES]
    unhealthy = [i for i in running if i.state == InstanceState.UNHEALTHY]
    ready = [i for i in running if i.state == InstanceState.READY]
    if unhealthy:
        return HealthBadge("bad", f"{len(unhealthy)} unhealthy")
    if deployment.observed_state == ObservedState.ROLLING_BACK:
        return HealthBadge("warn", "rolling back")
    if deployment.observed_state in (ObservedState.PENDING, ObservedState.PROGRESSING):
        return HealthBadge("warn", f"{len(ready)}/{len(running)} ready, rolling out")
    if deployment.observed_state == ObservedState.PAUSED:
        return HealthBadge("warn", "paused")
    if not ready:
        return HealthBadge("bad", "no ready instance")
    return HealthBadge("ok", f"{len(ready)} ready")


@dataclass
class ModelRow:
    model: Model
    deployments: list[Deployment] = field(default_factory=list)
    health: HealthBadge = HealthBadge("idle", "not deployed")

    @property
    def serving_versions(self) -> list[str]:
        """Version numbers with traffic, busiest first: ``["v2 (75%)", "v1 (25%)"]``."""
        shares: dict[int, int] = {}
        for deployment in self.deployments:
            for number, percent in deployment.traffic.items():
                shares[number] = shares.get(number, 0) + percent
        ordered = sorted(shares.items(), key=lambda kv: -kv[1])
        if len(ordered) == 1:
            return [f"v{ordered[0][0]}"]
        return [f"v{n} ({p}%)" for n, p in ordered if p]


_BADNESS = {"bad": 3, "warn": 2, "ok": 1, "idle": 0}


def model_rows(models) -> list[ModelRow]:
    """One dashboard row per model, with its live deployments and the worst of their health."""
    models = list(models)
    live = (
        Deployment.objects.filter(model__in=models, observed_state__in=LIVE_STATES)
        .select_related("target_version")
        .prefetch_related(
            Prefetch("instances", queryset=Instance.objects.filter(state__in=SHOWN_INSTANCE_STATES))
        )
    )
    rows = {m.pk: ModelRow(m) for m in models}
    for deployment in live:
        row = rows[deployment.model_id]
        row.deployments.append(deployment)
        health = health_of(deployment, list(deployment.instances.all()))
        if _BADNESS[health.level] > _BADNESS[row.health.level]:
            row.health = health
    return list(rows.values())


def traffic_split(deployment: Deployment) -> list[tuple[str, int, str]]:
    """The traffic bar, old version first: ``(label, percent, role)`` with role old or new."""
    traffic = deployment.traffic
    new = deployment.target_version.number
    bars = [(f"v{n}", p, "old") for n, p in sorted(traffic.items()) if n != new and p > 0]
    if traffic.get(new):
        bars.append((f"v{new}", traffic[new], "new"))
    return bars


def available_actions(deployment: Deployment) -> list[tuple[str, str]]:
    """The actions a person can take right now, with the question that confirms each."""
    actions = []
    for action in Action:
        try:
            action_changes(deployment, action)
        except InvalidTransition:
            continue
        actions.append((action.value, ACTION_QUESTIONS[action]))
    return actions


def stage_label(deployment: Deployment) -> str:
    if deployment.observed_state == ObservedState.SERVING:
        return "rollout complete"
    percent = deployment.stage_percent
    if percent is not None:
        return (
            f"stage {deployment.current_stage} of {len(deployment.stages)} "
            f"({percent}% on v{deployment.target_version.number})"
        )
    return "not started"
