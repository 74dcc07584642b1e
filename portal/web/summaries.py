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
from portal.deployments.rollout.status import DeploymentStatus, describe
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
    Action.PROMOTE: "Finish the rollout now: all traffic to the new version, no more stages or bake?",
    Action.ABORT: "Abort the rollout? Traffic goes back to the serving version.",
    Action.ROLLBACK: "Roll back to the previous version? Its instances start again if needed.",
}


@dataclass(frozen=True)
class HealthBadge:
    """A badge: ``level`` is ok, warn, bad or idle (the CSS class), ``label`` what it says."""

    level: str
    label: str


@dataclass
class ModelRow:
    model: Model
    deployments: list[Deployment] = field(default_factory=list)
    #: Each deployment's status, in the order of ``deployments``.
    statuses: list[DeploymentStatus] = field(default_factory=list)
    health: HealthBadge = HealthBadge("idle", "not deployed")

    @property
    def entries(self) -> list[tuple[Deployment, DeploymentStatus]]:
        return list(zip(self.deployments, self.statuses, strict=True))

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


def _row_badge(statuses: list[DeploymentStatus], ready: int) -> HealthBadge:
    """The worst of the deployments' badges; when all are fine, the ready instances of all of
    them (two Versioned deployments with one each are "2 ready", not "1 ready")."""
    worst = max(statuses, key=lambda s: _BADNESS[s.level])
    if worst.level == "ok":
        return HealthBadge("ok", f"{ready} ready")
    return HealthBadge(worst.level, worst.badge)


def model_rows(models) -> list[ModelRow]:
    """One dashboard row per model: its live deployments with their status and the worst of
    their health; a model whose latest deployment failed, with nothing live, shows that one."""
    models = list(models)
    instances = Prefetch(
        "instances", queryset=Instance.objects.filter(state__in=SHOWN_INSTANCE_STATES)
    )
    live = list(
        Deployment.objects.filter(model__in=models, observed_state__in=LIVE_STATES)
        .select_related("target_version", "previous_version")
        .prefetch_related(instances)
        .order_by("created_at")
    )
    idle = {m.pk for m in models} - {d.model_id for d in live}
    failed = [
        d
        for d in Deployment.objects.filter(model_id__in=idle)
        .select_related("target_version", "previous_version")
        .order_by("model_id", "-created_at")
        .distinct("model_id")
        if d.observed_state == ObservedState.FAILED
    ]
    rows = {m.pk: ModelRow(m) for m in models}
    ready: dict[int, int] = {}
    for deployment in [*live, *failed]:
        row = rows[deployment.model_id]
        live_one = deployment.observed_state in LIVE_STATES
        running = list(deployment.instances.all()) if live_one else []
        row.deployments.append(deployment)
        row.statuses.append(describe(deployment, running))
        ready[row.model.pk] = ready.get(row.model.pk, 0) + sum(
            1 for i in running if i.state == InstanceState.READY
        )
    for row in rows.values():
        if row.statuses:
            row.health = _row_badge(row.statuses, ready.get(row.model.pk, 0))
    return list(rows.values())


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
