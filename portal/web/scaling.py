"""The deployment page's scaling panel: the policy in words, the count now, sleep and wake, the
last cold start, and the last scaling decisions with the numbers behind them.

Everything here reads what the controller already wrote (:mod:`portal.deployments.state.autoscaling`):
the policy's fields, ``Deployment.scaling`` and the ``scaling`` events of the timeline. A
decision is in both the state (the last ten) and an event; the events also hold the sleeps and
wakes, so the list merges the two, one row per decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from portal.deployments.models import Deployment, DeploymentEvent, EventKind, InstanceState
from portal.deployments.state.autoscaling import METRIC_WORDS, Decision

#: How many decisions the page lists, newest first.
SHOWN_DECISIONS = 10


@dataclass(frozen=True)
class DecisionRow:
    """One change of the count: when, ``"2 → 4"``, and why (with its numbers)."""

    at: datetime
    replicas_from: int | None
    replicas_to: int
    reason: str
    #: ``up``, ``down``, ``sleep`` or ``wake``: how the page marks the row.
    kind: str

    @property
    def change(self) -> str:
        if self.replicas_from is None:
            return f"→ {self.replicas_to}"
        return f"{self.replicas_from} → {self.replicas_to}"


@dataclass(frozen=True)
class ScalingPanel:
    policy: str
    #: Whether the count can change by itself (load, or scaling to zero when idle).
    changes: bool
    #: The count the deployment runs now (0 asleep) and its instances ready.
    wanted: int
    ready: int
    asleep_since: datetime | None
    woken_at: datetime | None
    cold_start_seconds: float | None
    decisions: list[DecisionRow]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def policy_text(deployment: Deployment) -> str:
    """ "fixed 2 replicas", or "1-4 replicas on in-flight requests per instance, target 4; up
    window 10 s, down 300 s", each with "; scale to zero after 600 s idle" when it may."""
    if deployment.min_replicas == deployment.max_replicas:
        words = f"fixed {_plural(deployment.min_replicas, 'replica')}"
    else:
        metric = METRIC_WORDS.get(deployment.scale_metric, deployment.scale_metric)
        words = (
            f"{deployment.min_replicas}-{deployment.max_replicas} replicas on {metric}, "
            f"target {deployment.scale_target:g}; up window "
            f"{deployment.scale_up_window_seconds} s, down {deployment.scale_down_window_seconds} s"
        )
    if deployment.scale_to_zero_after_seconds is not None:
        words += f"; scale to zero after {deployment.scale_to_zero_after_seconds} s idle"
    return words


def _moment(unix: float | None) -> datetime | None:
    return None if unix is None else datetime.fromtimestamp(unix, tz=UTC)


def _decision_row(decision: Decision) -> DecisionRow:
    return DecisionRow(
        at=datetime.fromtimestamp(decision.at, tz=UTC),
        replicas_from=decision.replicas_from,
        replicas_to=decision.replicas_to,
        reason=decision.reason,
        kind="up" if decision.replicas_to > decision.replicas_from else "down",
    )


def _event_row(event: DeploymentEvent) -> DecisionRow | None:
    """A scaling event as a row: a decision, a sleep or a wake (a cold start is not one)."""
    data: dict[str, Any] = event.data or {}
    if "replicas_to" in data and "at" in data:
        try:
            return _decision_row(Decision.from_json(data))
        except (KeyError, TypeError, ValueError):
            return None
    if data.get("asleep"):
        retiring = data.get("retiring")
        count = len(retiring) if isinstance(retiring, list) and retiring else None
        return DecisionRow(event.created_at, count, 0, event.message, "sleep")
    if data.get("woken"):
        replicas = data.get("replicas")
        to = replicas if isinstance(replicas, int) else 1
        return DecisionRow(event.created_at, 0, to, event.message, "wake")
    return None


def _key(row: DecisionRow) -> tuple[int, int | None, int]:
    # A decision's event repeats the state's: the same moment (to the second) and counts.
    return round(row.at.timestamp()), row.replicas_from, row.replicas_to


def decision_rows(
    decisions: Iterable[Decision], events: Iterable[DeploymentEvent]
) -> list[DecisionRow]:
    """The state's decisions and the scaling events as one list, newest first, each once."""
    rows: dict[tuple[int, int | None, int], DecisionRow] = {}
    for event in events:
        row = _event_row(event)
        if row is not None:
            rows.setdefault(_key(row), row)
    for decision in decisions:
        row = _decision_row(decision)
        rows.setdefault(_key(row), row)
    return sorted(rows.values(), key=lambda r: r.at, reverse=True)[:SHOWN_DECISIONS]


def scaling_panel(deployment: Deployment, instances: Sequence[Any]) -> ScalingPanel:
    """The panel of ``deployment``; ``instances`` are those the live part already read."""
    state = deployment.scaling
    events = deployment.events.filter(kind=EventKind.SCALING).order_by("-created_at", "-id")
    return ScalingPanel(
        policy=policy_text(deployment),
        changes=deployment.min_replicas < deployment.max_replicas
        or deployment.scale_to_zero_after_seconds is not None,
        wanted=0 if state.asleep else deployment.replicas,
        ready=sum(1 for i in instances if i.state == InstanceState.READY),
        asleep_since=_moment(state.asleep_since),
        woken_at=_moment(state.woken_at),
        cold_start_seconds=state.cold_start_seconds,
        decisions=decision_rows(state.decisions, events[: SHOWN_DECISIONS * 2]),
    )


def scaling_context(deployment: Deployment, instances: Sequence[Any]) -> dict[str, Any]:
    """What the deployment page's scaling panel (``web/_scaling.html``) needs."""
    return {"scaling": scaling_panel(deployment, instances)}
