"""One truthful status of a deployment: the headline, the stage, the progress and the traffic bar,
derived together from its typed state (:mod:`~portal.deployments.state.rollout_state`) and its traffic split.

The page, the dashboard, the admin and the API all show :func:`describe`'s answer, so they cannot
contradict each other: the percent a headline names, the stage it counts and the bar it draws
come from the same split. A deployment with nothing to replace (a first Red-Black deploy, any
Versioned one) goes all at once and has no stages to count; only a staged shift of a Red-Black
rollout has "stage k of n", and only while it is in progress or paused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    DesiredState,
    Instance,
    InstanceState,
    ObservedState,
    Strategy,
)
from portal.deployments.rollout.strategies import StagedShift, plan_for
from portal.deployments.state.rollout_state import Phase, Traffic
from portal.registry.models import VersionState

D = ObservedState

#: Instances that run or are on their way in or out (stopped and failed ones are history).
RUNNING_STATES = (
    InstanceState.PENDING,
    InstanceState.STARTING,
    InstanceState.READY,
    InstanceState.UNHEALTHY,
    InstanceState.DRAINING,
)


def traffic_text(traffic: Traffic, first: int | None = None) -> str:
    """``{2: 10, 1: 90}`` → ``v2 10% · v1 90%``: the version ``first`` (the one rolling in)
    leads, the others follow newest first. ``no traffic`` when nothing serves."""
    order = sorted(traffic, key=lambda number: (number != first, -number))
    return " · ".join(f"v{number} {traffic[number]}%" for number in order) or "no traffic"


@dataclass(frozen=True)
class Segment:
    """One part of the traffic bar: ``role`` is ``new`` for the target version, else ``old``."""

    version: int
    percent: int
    role: str

    @property
    def label(self) -> str:
        return f"v{self.version}"


@dataclass(frozen=True)
class DeploymentStatus:
    """What a deployment is doing, in words and numbers that agree by construction."""

    #: One line: "Baking v2 at 50% (stage 2 of 3)".
    headline: str
    #: ok, warn, bad or idle: the badge's colour (CSS class).
    level: str
    #: The badge's words: "2 of 2 ready", "rolling back", "failed".
    badge: str
    #: The stage of a staged rollout in progress or paused (1-based), else None.
    stage: int | None
    stage_count: int | None
    #: The percent on the target version the stage asks for (None without a stage).
    stage_percent: int | None
    #: The version the deployment is heading for (the target, or the fallback while rolling
    #: back), and its share of the traffic now, as the bar draws it.
    heading_to: int | None
    percent: int
    #: ``percent`` as a fraction (0..1), for a progress bar.
    progress: float
    segments: list[Segment] = field(default_factory=list)
    #: Why (a rollback's or failure's reason), when the headline does not say it all.
    detail: str = ""
    #: When the bake under way ends (Unix time), for a countdown; None when nothing bakes.
    bake_ends_at: float | None = None
    #: The version a finished rollback rolled back from (what "roll forward" deploys again).
    rolled_back_from: int | None = None

    @property
    def traffic(self) -> str:
        """The bar in words: "v2 50% · v1 50%"."""
        return traffic_text({s.version: s.percent for s in self.segments}, self.heading_to)

    def as_dict(self) -> dict:
        return {
            "headline": self.headline,
            "level": self.level,
            "badge": self.badge,
            "stage": self.stage,
            "stage_count": self.stage_count,
            "stage_percent": self.stage_percent,
            "version": self.heading_to,
            "percent": self.percent,
            "progress": self.progress,
            "traffic": self.traffic,
            "detail": self.detail,
            "rolled_back_from": self.rolled_back_from,
            "bake_ends_at": (
                None
                if self.bake_ends_at is None
                else datetime.fromtimestamp(self.bake_ends_at, UTC).isoformat()
            ),
        }


def describe(deployment: Deployment, instances: Iterable[Instance] = ()) -> DeploymentStatus:
    """The deployment's status from its typed state, traffic and ``instances`` (its rows, e.g.
    the page's list; only running ones count). Reads the timeline only to name what a
    finished rollback rolled back from."""
    running = [i for i in instances if i.state in RUNNING_STATES]
    return _Describer(deployment, running).status()


class _Describer:
    def __init__(self, deployment: Deployment, running: list[Instance]) -> None:
        self.d = deployment
        self.running = running
        self.plan = plan_for(deployment)
        self.staged = isinstance(self.plan, StagedShift)
        self.target = deployment.target_version.number
        self.fallback = self.plan.fallback.number if self.plan.fallback is not None else None
        self.rolled_back_from: int | None = None  # found by serving()

    # --- facts ---------------------------------------------------------------------------

    def ready(self, number: int) -> int:
        return sum(
            1
            for i in self.running
            if i.state == InstanceState.READY and i.version_id is not None and self._is(i, number)
        )

    def _is(self, instance: Instance, number: int) -> bool:
        version = self.d.target_version if number == self.target else self.d.previous_version
        return version is not None and instance.version_id == version.pk

    def stage(self) -> tuple[int | None, int | None, int | None]:
        """(stage, of how many, its percent): only a staged rollout in progress or paused."""
        stages = list(self.d.stages)
        k = self.d.current_stage
        if not self.staged or self.d.observed_state not in (D.PROGRESSING, D.PAUSED):
            return None, None, None
        if not 1 <= k <= len(stages):
            return None, None, None
        return k, len(stages), int(stages[k - 1])

    def heading_to(self) -> int | None:
        if self.d.observed_state == D.ROLLING_BACK:
            return self.fallback
        if self.d.observed_state in LIVE_STATES:
            return self.target
        return None

    def segments(self) -> list[Segment]:
        """The bar: the other versions first (oldest first), the target last."""
        traffic = self.d.traffic
        shares = [
            Segment(n, p, "old") for n, p in sorted(traffic.items()) if n != self.target and p > 0
        ]
        if traffic.get(self.target):
            shares.append(Segment(self.target, traffic[self.target], "new"))
        return shares

    def what(self) -> str:
        """What is being deployed, by its plan."""
        if self.staged:
            return f"Rolling out v{self.fallback} → v{self.target}"
        if self.d.strategy == Strategy.VERSIONED:
            return f"Deploying Versioned v{self.target}"
        return f"Deploying v{self.target} (all at once)"

    # --- the status ------------------------------------------------------------------------

    def status(self) -> DeploymentStatus:
        stage, count, stage_percent = self.stage()
        heading = self.heading_to()
        percent = self.d.traffic.get(heading, 0) if heading is not None else 0
        headline, detail = self.headline(stage, count, stage_percent, percent)
        level, badge = self.badge()
        return DeploymentStatus(
            headline=headline,
            level=level,
            badge=badge,
            stage=stage,
            stage_count=count,
            stage_percent=stage_percent,
            heading_to=heading,
            percent=percent,
            progress=percent / 100,
            segments=self.segments(),
            detail=detail,
            bake_ends_at=self.bake_ends_at(),
            rolled_back_from=self.rolled_back_from,
        )

    def bake_ends_at(self) -> float | None:
        """A bake's end while one runs; a paused rollout's bake starts over when resumed."""
        d = self.d
        if d.observed_state != D.PROGRESSING or d.step.phase != Phase.BAKE:
            return None
        if not self.plan.bakes or d.step.promoted or not d.step.bake_started_at:
            return None
        return d.step.bake_started_at + d.bake_seconds

    def headline(
        self, stage: int | None, count: int | None, goal: int | None, percent: int
    ) -> tuple[str, str]:
        d, t = self.d, self.target
        state = d.observed_state
        if state == D.PENDING:
            return self.pending(), ""
        if state in (D.PROGRESSING, D.PAUSED):
            text = self.rolling_out(stage, count, goal, percent)
            return text + self.asked(), ""
        if state == D.ROLLING_BACK:
            reason = d.step.reason
            if self.fallback is None:
                return f"Stopping v{t}: nothing to roll back to", reason
            if d.step.phase == Phase.DRAIN:
                return (
                    f"Rolling back to v{self.fallback}: {percent}% on v{self.fallback}, "
                    f"draining v{t}",
                    reason,
                )
            ready, want = self.ready(self.fallback), d.replicas
            return (
                f"Rolling back to v{self.fallback}: {percent}% on v{self.fallback}, restoring "
                f"its instances ({ready} of {want} ready)",
                reason,
            )
        if state == D.SERVING:
            return self.serving()
        reason = d.status_message.rstrip(".")
        if state == D.FAILED:
            return f"Failed: {reason}" if reason else "Failed", ""
        if state == D.ABORTED:
            return f"Aborted: {reason}" if reason else "Aborted", ""
        return "Retired", ""

    def pending(self) -> str:
        d, version = self.d, self.d.target_version
        if d.desired_state in (DesiredState.ABORTED, DesiredState.ROLLBACK):
            return f"{self.what()}: aborted before it started"
        if version.state == VersionState.FAILED:
            return f"{self.what()}: v{self.target} failed ({version.failure_reason})"
        if version.state != VersionState.READY:
            return f"Waiting for v{self.target} to be ready ({version.get_state_display().lower()})"
        if d.desired_state == DesiredState.PAUSED:
            return f"{self.what()}: paused before it started"
        return f"{self.what()}: starting"

    def rolling_out(self, stage: int | None, count: int | None, goal: int | None, pct: int) -> str:
        d, t = self.d, self.target
        phase = d.step.phase or Phase.SCALE
        if d.observed_state == D.PAUSED:
            if stage is not None:
                return f"Paused at stage {stage} of {count}: {pct}% on v{t}"
            return f"{self.what()}: paused"
        if stage is not None:
            where = f"{self.what()}: stage {stage} of {count}, {pct}% on v{t}"
            if phase == Phase.BAKE:
                return f"Baking v{t} at {pct}% (stage {stage} of {count})"
            if phase == Phase.SHIFT:
                return f"{where} (the gateways are taking the split)"
            want = self.plan.new_instances(goal or 0)
            return f"{where}; starting v{t} instances for {goal}% ({self.ready(t)} of {want} ready)"
        if phase == Phase.SCALE:
            want = self.plan.new_instances(100)
            return f"{self.what()}: waiting for instances ({self.ready(t)} of {want} ready)"
        return f"{self.what()}: {pct}% on v{t}, finishing"

    def asked(self) -> str:
        """What a person asked that the controller has not carried out yet."""
        d = self.d
        if d.promote_requested:
            return " · promote requested"
        if d.desired_state == DesiredState.ACTIVE:
            return " · resume requested" if d.observed_state == D.PAUSED else ""
        if d.desired_state == DesiredState.PAUSED:
            return "" if d.observed_state == D.PAUSED else " · pause requested"
        asked = "abort" if d.desired_state == DesiredState.ABORTED else "rollback"
        return f" · {asked} requested"

    def serving(self) -> tuple[str, str]:
        d, t = self.d, self.target
        ready = self.ready(t)
        if d.scaling.asleep:
            return f"Scaled to zero: v{t} starts on the next request", ""
        if d.scaling.woken_at is not None and not ready:
            return f"Waking: starting v{t} for a request held at the gateway", ""
        short = f" ({ready} of {d.replicas} instances ready)" if ready < d.replicas else ""
        if d.strategy == Strategy.VERSIONED:
            return f"Versioned v{t}: serving{short}", ""
        if d.current_stage == 0:  # a rollback sets it to 0; a rollout leaves it at its last
            rolled_from, reason = _rollback_of(d)
            self.rolled_back_from = rolled_from
            if rolled_from is not None:
                return f"Rolled back from v{rolled_from} to v{t}{short}", reason
            return f"Rolled back to v{t}{short}", reason
        return f"Serving v{t}{short}", ""

    def badge(self) -> tuple[str, str]:
        d = self.d
        state = d.observed_state
        if state not in LIVE_STATES:
            return ("bad" if state == D.FAILED else "idle"), d.get_observed_state_display().lower()
        unhealthy = sum(1 for i in self.running if i.state == InstanceState.UNHEALTHY)
        if unhealthy:
            return "bad", f"{unhealthy} unhealthy"
        if state == D.ROLLING_BACK:
            return "warn", "rolling back"
        if state == D.PAUSED:
            return "warn", "paused"
        ready = sum(1 for i in self.running if i.state == InstanceState.READY)
        if state == D.PENDING:
            return "warn", "waiting"
        if state == D.PROGRESSING:
            return "warn", f"rolling out, {ready} ready" if ready else "rolling out"
        if d.scaling.asleep:
            return "idle", "scaled to zero"
        if d.scaling.woken_at is not None and not ready:
            return "warn", "waking"
        if not ready:
            return "bad", "no ready instance"
        if ready < d.replicas:
            return "warn", f"{ready} of {d.replicas} ready"
        return "ok", f"{ready} ready"


def _rollback_of(deployment: Deployment) -> tuple[int | None, str]:
    """The version a finished rollback rolled back from and why, from the event that ended it
    (:func:`.controller._rolling_back` writes both into its data)."""
    event = (
        deployment.events.filter(from_state=D.ROLLING_BACK, to_state=D.SERVING)
        .order_by("-id")
        .first()
    )
    if event is None:
        return None, ""
    rolled_from = event.data.get("rolled_back_from")
    return (int(rolled_from) if rolled_from is not None else None), str(
        event.data.get("reason", "")
    )
