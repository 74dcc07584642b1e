"""How many replicas a deployment should run, from its instances' own load: the rule, no I/O.

The rollout controller owns a deployment's replica count (one writer: no HPA fights it). Each
step it reads the ready instances' unified ``/metrics`` (as the bake does) and asks
:func:`decide` for the count. The rule is Kubernetes' HPA's, on the signal the policy names:

- *recommend*: ``ceil(reporting · observed / target)`` where ``observed`` is the signal's mean
  over the instances that answered; within ``TOLERANCE`` of the target, the count stays;
  clamped to ``[min_replicas, max_replicas]``.
- *stabilize*: every recommendation is kept for its window. Scaling up applies the *lowest*
  recommendation of the up window (fast: a short window), scaling down the *highest* of the
  down window (slow: a spike in the last five minutes still holds the capacity), so a noisy
  signal never flaps the count.

During a Red-Black rollout the count is the deployment's ``N``, from which both sets' sizes
follow (``ceil(N·p)`` new, ``N - floor(N·p)`` old): both scale together, at the stage's split.

Scale to zero is separate (:func:`idle_for`): a policy with ``scale_to_zero_after_seconds``
lets a serving deployment with no request for that long sleep; the gateway then holds requests
and wakes it (:mod:`serving.gateway.activator`). Everything the rule remembers between steps is
:class:`ScalingState`, stored as JSON on the deployment, so a restarted worker decides the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from django.db import models

#: A signal within this fraction of the target leaves the count as it is (HPA's default).
TOLERANCE = 0.1
#: Decisions kept in the state for the page ("last scaling decisions").
KEPT_DECISIONS = 10


class ScaleMetric(models.TextChoices):
    """The signal a policy's target is per instance, from the instances' unified metrics."""

    IN_FLIGHT = "in_flight", "In-flight requests per instance (running + waiting)"
    WAITING = "waiting", "Waiting requests per instance"
    KV_CACHE = "kv_cache", "KV-cache usage per instance (0-1)"


#: How each signal is named in decisions and on the pages.
METRIC_WORDS: dict[str, str] = {
    ScaleMetric.IN_FLIGHT: "in-flight requests per instance",
    ScaleMetric.WAITING: "waiting requests per instance",
    ScaleMetric.KV_CACHE: "KV-cache usage per instance",
}


@dataclass(frozen=True)
class InstanceLoad:
    """What one ready instance's ``/metrics`` said this step."""

    running: float
    waiting: float
    kv_cache_usage: float | None

    def value(self, metric: str) -> float:
        if metric == ScaleMetric.WAITING:
            return self.waiting
        if metric == ScaleMetric.KV_CACHE:
            return self.kv_cache_usage or 0.0
        return self.running + self.waiting

    @property
    def in_flight(self) -> float:
        return self.running + self.waiting


@dataclass(frozen=True)
class ScalingPolicy:
    min_replicas: int
    max_replicas: int
    metric: str
    target: float
    up_window_seconds: int
    down_window_seconds: int
    #: None: never scales to zero.
    scale_to_zero_after_seconds: int | None

    @classmethod
    def of(cls, deployment: Any) -> ScalingPolicy:
        return cls(
            min_replicas=deployment.min_replicas,
            max_replicas=deployment.max_replicas,
            metric=deployment.scale_metric,
            target=deployment.scale_target,
            up_window_seconds=deployment.scale_up_window_seconds,
            down_window_seconds=deployment.scale_down_window_seconds,
            scale_to_zero_after_seconds=deployment.scale_to_zero_after_seconds,
        )

    @property
    def autoscales(self) -> bool:
        """Whether load changes the count (a fixed count is ``min == max``)."""
        return self.min_replicas < self.max_replicas

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class Decision:
    """One scaling decision: the count before and after, and the numbers behind it."""

    at: float
    replicas_from: int
    replicas_to: int
    metric: str
    observed: float
    target: float
    reporting: int
    recommended: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        return cls(**{f: data[f] for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class ScalingState:
    """What the rule keeps between steps (``Deployment.scaling``)."""

    #: ``[unix time, recommended count]``, oldest first, kept for the longer window.
    recommendations: tuple[tuple[float, int], ...] = ()
    #: Since when recommendations have been recorded: a down window not yet covered counts the
    #: time before as recommending the count that ran then (no scale-down on a first look).
    recording_since: float | None = None
    #: Set while scaled to zero: when it went to sleep.
    asleep_since: float | None = None
    #: Set by a wake until the first instance is ready (then a cold start is measured).
    woken_at: float | None = None
    #: The last cold start: seconds from the wake to the first instance ready.
    cold_start_seconds: float | None = None
    #: The newest decisions that changed the count, newest last.
    decisions: tuple[Decision, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "recommendations": [list(r) for r in self.recommendations],
            "recording_since": self.recording_since,
            "asleep_since": self.asleep_since,
            "woken_at": self.woken_at,
            "cold_start_seconds": self.cold_start_seconds,
            "decisions": [d.to_json() for d in self.decisions],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ScalingState:
        data = data or {}
        return cls(
            recommendations=tuple((float(t), int(n)) for t, n in data.get("recommendations", [])),
            recording_since=data.get("recording_since"),
            asleep_since=data.get("asleep_since"),
            woken_at=data.get("woken_at"),
            cold_start_seconds=data.get("cold_start_seconds"),
            decisions=tuple(Decision.from_json(d) for d in data.get("decisions", [])),
        )

    def but(self, **changes: Any) -> ScalingState:
        return replace(self, **changes)

    @property
    def asleep(self) -> bool:
        return self.asleep_since is not None


def observed(policy: ScalingPolicy, loads: Sequence[InstanceLoad]) -> float | None:
    """The signal's mean over the instances that answered; None when none did."""
    if not loads:
        return None
    return sum(load.value(policy.metric) for load in loads) / len(loads)


def recommend(policy: ScalingPolicy, current: int, loads: Sequence[InstanceLoad]) -> int | None:
    """The count the signal asks for now, within the bounds; None without a reading."""
    mean = observed(policy, loads)
    if mean is None:
        return None
    ratio = mean / policy.target
    if abs(ratio - 1.0) <= TOLERANCE:
        return policy.clamp(current)
    return policy.clamp(math.ceil(len(loads) * ratio - 1e-9))


def decide(
    policy: ScalingPolicy,
    state: ScalingState,
    current: int,
    loads: Sequence[InstanceLoad],
    now: float,
) -> tuple[int, ScalingState, Decision | None]:
    """The count to run, the state to keep, and the decision when the count changes.

    Without a reading the count stays (a deployment whose metrics cannot be read is not scaled
    on a guess), but the bounds still apply (a policy changed to ``min 3`` raises it at once)."""
    recommended = recommend(policy, current, loads)
    if recommended is None:
        wanted = policy.clamp(current)
        if wanted == current:
            return current, state, None
        decision = Decision(
            at=now,
            replicas_from=current,
            replicas_to=wanted,
            metric=policy.metric,
            observed=0.0,
            target=policy.target,
            reporting=0,
            recommended=wanted,
            reason=f"the policy's bounds are {policy.min_replicas} to {policy.max_replicas}",
        )
        return wanted, _remember(state, decision), decision
    horizon = now - max(policy.up_window_seconds, policy.down_window_seconds)
    kept = (*(r for r in state.recommendations if r[0] > horizon), (now, recommended))
    since = now if state.recording_since is None else state.recording_since
    up = min(n for t, n in kept if t >= now - policy.up_window_seconds)
    down = max(n for t, n in kept if t >= now - policy.down_window_seconds)
    if since > now - policy.down_window_seconds:
        down = max(down, current)  # the window reaches back before the first look
    wanted = policy.clamp(current)
    if wanted < up:
        wanted = up
    if wanted > down:
        wanted = down
    state = state.but(recommendations=kept, recording_since=since)
    if wanted == current:
        return current, state, None
    mean = observed(policy, loads) or 0.0
    decision = Decision(
        at=now,
        replicas_from=current,
        replicas_to=wanted,
        metric=policy.metric,
        observed=round(mean, 4),
        target=policy.target,
        reporting=len(loads),
        recommended=recommended,
        reason=_reason(policy, current, wanted, mean, len(loads), recommended),
    )
    return wanted, _remember(state, decision), decision


def _reason(
    policy: ScalingPolicy, current: int, wanted: int, mean: float, reporting: int, recommended: int
) -> str:
    words = METRIC_WORDS.get(policy.metric, policy.metric)
    raw = math.ceil(reporting * mean / policy.target - 1e-9)
    why = (
        f"{words} {mean:.3g} against a target of {policy.target:g} "
        f"(ceil({reporting} \u00d7 {mean:.3g} / {policy.target:g}) = {raw}"
    )
    if raw != recommended:
        why += f", within {policy.min_replicas}-{policy.max_replicas}: {recommended}"
    why += ")"
    if wanted > current and wanted != recommended:
        why += f"; the lowest of the last {policy.up_window_seconds} s is {wanted}"
    if wanted < current and wanted != recommended:
        why += f"; the highest of the last {policy.down_window_seconds} s is {wanted}"
    return why


def _remember(state: ScalingState, decision: Decision) -> ScalingState:
    return state.but(decisions=(*state.decisions, decision)[-KEPT_DECISIONS:])


def idle_for(last_activity: float | None, now: float) -> float:
    """Seconds since ``last_activity`` (a request, a wake, an instance becoming ready)."""
    return 0.0 if last_activity is None else max(0.0, now - last_activity)
