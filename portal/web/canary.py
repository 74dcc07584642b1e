"""The deployment page's canary analysis panel, and the analysis windows its charts mark.

Everything here reads the :class:`~portal.deployments.models.StageAnalysis` rows the controller
wrote (:mod:`portal.deployments.rollout.canary`): each bake's verdicts as
``MetricVerdict.to_dict`` stored them, and the policy it was judged by. Nothing is judged again;
this only puts the stored numbers into words and units people read (seconds as ms, rates as
percent with their counts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from portal.deployments.models import Deployment, StageAnalysis
from portal.deployments.rollout.judge import UNITS

#: How the page marks a metric's verdict and a bake's decision (portal.css's badge classes).
VERDICT_BADGES = {"pass": "badge-ok", "marginal": "badge-warn", "fail": "badge-bad"}
DECISION_BADGES = {
    "promote": "badge-ok",
    "hold": "badge-warn",
    "rollback": "badge-bad",
    "not_enough_data": "badge-warn",
}
WORDS = {"nodata": "no data", "not_enough_data": "not enough data"}


def words(value: str) -> str:
    """A verdict or decision as the page says it."""
    return WORDS.get(value, value)


def amount(name: str, value: float | None) -> str:
    """One value of a latency-kind metric in its unit: seconds as ms (bakes compare tens of
    milliseconds, which "0.0421 s" hides), completion tokens as tokens."""
    if value is None:
        return "—"
    unit = UNITS.get(name, "")
    if unit == " s":
        ms = value * 1000
        digits = 0 if abs(ms) >= 100 else 1 if abs(ms) >= 10 else 2
        return f"{ms:,.{digits}f} ms"
    number = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{number}{unit}"


def p_value(value: float | None) -> str:
    if value is None:
        return "—"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


@dataclass(frozen=True)
class Side:
    """One version's value of a metric: the number(s), and how many requests they are of."""

    value: str
    count: str


@dataclass(frozen=True)
class MetricRow:
    name: str
    kind: str
    verdict: str
    verdict_words: str
    badge: str
    reason: str
    baseline: Side
    canary: Side
    change: str
    #: The policy's bound on the change, as the change is written ("10%", "1 pts").
    bound: str
    p_value: str
    #: "critical" or "report only": how the metric weighs in the decision, if not plainly.
    weight: str


def _metric_policy(policy: dict[str, Any], name: str) -> dict[str, Any]:
    for metric in policy.get("metrics") or []:
        if isinstance(metric, dict) and metric.get("name") == name:
            return metric
    return {}


def _latency_side(name: str, verdict: dict[str, Any], side: str) -> Side:
    p50, p99 = verdict.get(f"{side}_p50"), verdict.get(f"{side}_p99")
    value = "—" if p50 is None else f"p50 {amount(name, p50)} · p99 {amount(name, p99)}"
    return Side(value, f"{verdict.get(f'{side}_count') or 0:,} samples")


def _rate_side(verdict: dict[str, Any], side: str) -> Side:
    rate, events = verdict.get(f"{side}_rate"), verdict.get(f"{side}_events")
    total = verdict.get(f"{side}_count") or 0
    value = "—" if rate is None else f"{rate:.2%}"
    count = f"{total:,} requests" if events is None else f"{events:,} of {total:,} requests"
    return Side(value, count)


def metric_row(verdict: dict[str, Any], policy: dict[str, Any]) -> MetricRow:
    """One metric's line of the table, from its stored verdict and the policy that judged it."""
    name = str(verdict.get("name", ""))
    kind = str(verdict.get("kind", ""))
    rules = _metric_policy(policy, name)
    bound = rules.get("max_change")
    if kind == "rate":
        baseline, canary = _rate_side(verdict, "baseline"), _rate_side(verdict, "canary")
        difference = verdict.get("difference")
        change = "—" if difference is None else f"{difference * 100:+.2f} pts"
        bound_text = "" if bound is None else f"{bound * 100:g} pts"
    else:
        baseline = _latency_side(name, verdict, "baseline")
        canary = _latency_side(name, verdict, "canary")
        ratio = verdict.get("ratio")
        statistic = rules.get("statistic", "p50")
        if ratio is not None:
            change = f"{statistic} {(ratio - 1) * 100:+.0f}%"
        elif verdict.get("canary_p50") is not None:  # a baseline of zero: stored as None
            change = f"{statistic} from 0"
        else:
            change = "—"
        bound_text = "" if bound is None else f"{bound * 100:g}%"
    weight = "critical" if rules.get("critical") else ""
    weight = "report only" if rules.get("report_only") else weight
    state = str(verdict.get("verdict", ""))
    return MetricRow(
        name=name,
        kind=kind,
        verdict=state,
        verdict_words=words(state),
        badge=VERDICT_BADGES.get(state, ""),
        reason=str(verdict.get("reason", "")),
        baseline=baseline,
        canary=canary,
        change=change,
        bound=bound_text,
        p_value=p_value(verdict.get("p_value")),
        weight=weight,
    )


def sample_notes(analysis: StageAnalysis) -> list[str]:
    """What the bake was judged on: requests read per version, and anything missing from it
    (an instance not read, a record that no longer reached back to the window's start)."""
    notes = []
    for side, number in (
        ("baseline", analysis.baseline_version),
        ("canary", analysis.canary_version),
    ):
        read = analysis.sample.get(side) if isinstance(analysis.sample, dict) else None
        if not isinstance(read, dict):
            continue
        instances = read.get("instances") or []
        notes.append(
            f"v{number}: {read.get('requests', 0):,} requests read from "
            f"{len(instances)} instance{'' if len(instances) == 1 else 's'}"
        )
        if read.get("unread"):
            notes.append(f"v{number}: not read from {', '.join(read['unread'])}")
        if read.get("truncated"):
            notes.append(
                f"v{number}: an instance's record no longer reached back to the window's "
                "start, so the bake was judged on its last part"
            )
    return notes


@dataclass(frozen=True)
class Look:
    """One analysis of a bake (a bake extended for want of data is looked at again)."""

    analysis: StageAnalysis
    decision_words: str
    badge: str
    score: str
    #: How long the window judged was.
    window_seconds: float
    metrics: list[MetricRow]
    notes: list[str]


@dataclass
class Stage:
    stage: int
    percent: int
    looks: list[Look] = field(default_factory=list)


@dataclass
class Rollout:
    """One rollout's judged bakes: v{canary} against v{baseline}, stage by stage."""

    baseline_version: int
    canary_version: int
    stages: list[Stage] = field(default_factory=list)


def look(analysis: StageAnalysis) -> Look:
    policy = analysis.policy if isinstance(analysis.policy, dict) else {}
    score = "—" if analysis.score is None else f"{analysis.score:.1f}"
    if analysis.score is not None and "pass_score" in policy:
        score += (
            f" (promotes at {policy['pass_score']:g} or more, "
            f"rolls back under {policy.get('marginal_score', 0):g})"
        )
    return Look(
        analysis=analysis,
        decision_words=words(analysis.decision),
        badge=DECISION_BADGES.get(analysis.decision, ""),
        score=score,
        window_seconds=(analysis.window_end - analysis.window_start).total_seconds(),
        metrics=[metric_row(v, policy) for v in analysis.verdicts if isinstance(v, dict)],
        notes=sample_notes(analysis),
    )


def group(analyses: Iterable[StageAnalysis]) -> list[Rollout]:
    """The analyses (oldest first) by rollout, newest rollout first, and by stage within one.
    The rows name no rollout, so one begins where the versions compared change, where the stage
    goes back, or after a rollback (which ends a rollout)."""
    rollouts: list[Rollout] = []
    previous: StageAnalysis | None = None
    for analysis in analyses:
        if (
            previous is None
            or (previous.baseline_version, previous.canary_version)
            != (analysis.baseline_version, analysis.canary_version)
            or analysis.stage < previous.stage
            or previous.decision == "rollback"
        ):
            rollouts.append(Rollout(analysis.baseline_version, analysis.canary_version))
        stages = rollouts[-1].stages
        if not stages or stages[-1].stage != analysis.stage:
            stages.append(Stage(analysis.stage, analysis.percent))
        stages[-1].looks.append(look(analysis))
        previous = analysis
    return rollouts[::-1]


def canary_context(deployment: Deployment) -> dict[str, Any]:
    """The panel's context: shown when the deployment has analyses, or has canary analysis on
    (then it says no bake was judged yet)."""
    analyses = list(deployment.analyses.all())
    return {
        "canary_rollouts": group(analyses),
        "canary_shown": bool(analyses) or deployment.canary_analysis,
    }


def chart_windows(analyses: Sequence[StageAnalysis]) -> str:
    """The analysis windows as JSON for static/web/charts.js, which shades each on the charts
    and labels it with its decision; empty when there are none."""
    if not analyses:
        return ""
    return json.dumps(
        [
            {
                "start": a.window_start.isoformat(),
                "end": a.window_end.isoformat(),
                "decision": a.decision,
                "label": f"stage {a.stage} ({a.percent}%) v{a.canary_version} vs "
                f"v{a.baseline_version}: {words(a.decision)}",
            }
            for a in analyses
        ]
    )
