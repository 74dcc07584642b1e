"""The rollout's typed state: the traffic split and the controller's notes on the step in progress.

Both are stored as JSON on the deployment (``Deployment.traffic`` and ``Deployment.step``), whose
model fields turn them into these types on load and back on save, so nothing else parses them:
no ``int(...)`` of a version-number key, no ``.get("phase")`` with a guessed default. The JSON
they are stored as is unchanged, so rows written before these types exist read the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: Percent of an endpoint's requests per version number: ``{1: 75, 2: 25}``. Stored with the
#: numbers as JSON object keys (text).
Traffic = dict[int, int]


def traffic_from_json(data: Any) -> Traffic:
    return {int(number): int(percent) for number, percent in (data or {}).items()}


def traffic_to_json(traffic: Traffic) -> dict[str, int]:
    return {str(number): int(percent) for number, percent in sorted(traffic.items())}


@dataclass(frozen=True)
class RequestCounts:
    """Cumulative inference requests of an instance, as its ``/metrics`` count them."""

    success: float = 0.0
    failure: float = 0.0

    def __add__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(self.success + other.success, self.failure + other.failure)

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(self.success - other.success, self.failure - other.failure)

    @property
    def total(self) -> float:
        return self.success + self.failure

    def as_list(self) -> list[float]:
        return [self.success, self.failure]


class Phase(StrEnum):
    """Where a stage is. Rolling out: *scale* the new set, *shift* traffic to it, *bake* it.
    Rolling back: *restore* the previous set, then *drain* the new one."""

    SCALE = "scale"
    SHIFT = "shift"
    BAKE = "bake"
    RESTORE = "restore"
    DRAIN = "drain"


@dataclass(frozen=True)
class RolloutStep:
    """What the controller must remember between two steps of a rollout, and nothing else: a
    worker killed between steps leaves these facts for the next one. Empty (``phase`` None)
    when no rollout is in progress."""

    phase: Phase | None = None
    #: When the rollout began (Unix time): a new instance that failed before it is not this
    #: rollout's failure.
    rollout_started_at: float = 0.0
    #: The routing-table generation the shift waits for the gateways to apply.
    generation: int = 0
    #: When the bake began, and each new instance's counts then (by instance name): the bake's
    #: error rate is over the requests since.
    bake_started_at: float = 0.0
    baseline: dict[str, RequestCounts] = field(default_factory=dict)
    #: Instances that were ready when the bake began but whose counts could not be read then
    #: (a scrape timed out on a busy machine): their first reading becomes their baseline.
    #: Counting them from zero instead would dilute the bake's error rate with every request
    #: they answered before it.
    unread: tuple[str, ...] = ()
    #: Why a rollback began, for the event that ends it.
    reason: str = ""
    #: A person promoted the rollout: no stage bakes any more, the last one ends at once.
    promoted: bool = False
    #: How many times the canary analysis found too few requests and lengthened the bake by
    #: another ``bake_seconds`` (up to ``CANARY_MAX_BAKE_EXTENSIONS``, then it holds).
    extensions: int = 0

    def but(self, **changes: Any) -> RolloutStep:
        """A copy with ``changes`` (the dataclass is frozen: a step is written whole)."""
        return dataclasses.replace(self, **changes)

    def requests_since_baseline(self, now: dict[str, RequestCounts]) -> RequestCounts:
        """The requests the instances counted since the bake began (an instance with no
        baseline, e.g. one started during the bake, counts from zero; one still ``unread``
        has no baseline yet and is left out)."""
        total = RequestCounts()
        for name, counts in now.items():
            if name not in self.unread:
                total += counts - self.baseline.get(name, RequestCounts())
        return total

    def with_late_baselines(self, now: dict[str, RequestCounts]) -> RolloutStep:
        """This step with the ``unread`` instances read in ``now`` given their baseline; the
        same step when ``now`` reads none of them."""
        late = {name: now[name] for name in self.unread if name in now}
        if not late:
            return self
        return self.but(
            baseline={**self.baseline, **late},
            unread=tuple(name for name in self.unread if name not in late),
        )

    @classmethod
    def from_json(cls, data: Any) -> RolloutStep:
        data = data or {}
        phase = data.get("phase")
        return cls(
            phase=Phase(phase) if phase else None,
            rollout_started_at=float(data.get("rollout_started_at", 0.0)),
            generation=int(data.get("generation", 0)),
            bake_started_at=float(data.get("bake_started_at", 0.0)),
            baseline={
                name: RequestCounts(float(success), float(failure))
                for name, (success, failure) in data.get("baseline", {}).items()
            },
            unread=tuple(str(name) for name in data.get("unread", ())),
            reason=str(data.get("reason", "")),
            promoted=bool(data.get("promoted", False)),
            extensions=int(data.get("extensions", 0)),
        )

    def to_json(self) -> dict[str, Any]:
        """The stored form: only what is set, as the controller always wrote it."""
        if self.phase is None:
            return {}
        data: dict[str, Any] = {"phase": str(self.phase)}
        if self.rollout_started_at:
            data["rollout_started_at"] = self.rollout_started_at
        if self.generation:
            data["generation"] = self.generation
        if self.bake_started_at:
            data["bake_started_at"] = self.bake_started_at
            data["baseline"] = {name: c.as_list() for name, c in self.baseline.items()}
        if self.unread:
            data["unread"] = list(self.unread)
        if self.reason:
            data["reason"] = self.reason
        if self.promoted:
            data["promoted"] = True
        if self.extensions:
            data["extensions"] = self.extensions
        return data
