"""The two shapes a rollout takes, so the controller asks a plan instead of checking strategies.

*Staged shift* is Red-Black replacing a version that serves: per stage, the new version gets
``ceil(N·p/100)`` instances and ``p``% of the traffic, the old one keeps all ``N`` and the rest
of the traffic; each stage bakes; a failure gives the old version its traffic back at once. *All at once* is everything
with nothing to replace, a Versioned deployment (one version on its own endpoint) or the first
version of a Red-Black one: ``N`` instances, 100% as soon as they are ready, no bake, and a
failure takes the new instances down since nothing else could serve.

:func:`plan_for` picks the plan from the deployment; the controller's steps are the same for
both and differ only in what the plan answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from portal.deployments.models import Deployment, Strategy
from portal.deployments.state.rollout_state import Traffic
from portal.registry.models import ModelVersion


@dataclass(frozen=True)
class StagedShift:
    target: ModelVersion
    #: The serving version the rollout replaces, and what a rollback restores.
    fallback: ModelVersion
    replicas: int
    stages: list[int]
    bake_seconds: int
    #: Whether each stage bakes (health and error rate watched) before the next.
    bakes = True

    @property
    def stage_count(self) -> int:
        return len(self.stages)

    def percent(self, deployment: Deployment) -> int:
        """Traffic on the new version at the deployment's current stage (entering a rollout
        sets stage 1, so there is always one)."""
        return deployment.stage_percent or int(self.stages[0])

    # A worked example, N = 3 replicas, stages 25/50/100:
    #   25%: new ceil(3·25/100) = ceil(0.75) = 1, old 3 (4 in all);
    #   50%: new ceil(1.5) = 2, old 3 (5 in all);
    #  100%: new 3, old 3 (6 in all) until the last bake has passed; then the old set drains.
    # Rounding the new set up gives it at least its share of the capacity for its share of the
    # traffic. The old set stays whole so that a rollback, decided at any stage (the last
    # bake's included), only moves traffic back: no instance has to start first. The price is
    # up to N instances more than N while the rollout runs (maxSurge 100% in Kubernetes'
    # terms), paid for the length of the rollout only.
    def new_instances(self, percent: int) -> int:
        if percent >= 100:
            return self.replicas
        return max(1, math.ceil(self.replicas * percent / 100))

    def old_instances(self, percent: int) -> int:
        return self.replicas

    def traffic(self, percent: int) -> Traffic:
        split = {self.target.number: percent}
        if percent < 100:
            split[self.fallback.number] = 100 - percent
        return split

    def describe(self) -> str:
        return f"stages {self.stages} % with {self.bake_seconds} s bake each"


@dataclass(frozen=True)
class AllAtOnce:
    target: ModelVersion
    replicas: int
    fallback: None = None
    bakes = False
    stage_count = 1

    def percent(self, deployment: Deployment) -> int:
        return 100

    def new_instances(self, percent: int) -> int:
        return self.replicas

    def old_instances(self, percent: int) -> int:
        return 0

    def traffic(self, percent: int) -> Traffic:
        return {self.target.number: 100}

    def describe(self) -> str:
        return "all at once (nothing serves yet)"


RolloutPlan = StagedShift | AllAtOnce


def plan_for(deployment: Deployment) -> RolloutPlan:
    previous = deployment.previous_version
    if deployment.strategy == Strategy.RED_BLACK and previous is not None:
        return StagedShift(
            target=deployment.target_version,
            fallback=previous,
            replicas=deployment.replicas,
            stages=list(deployment.stages),
            bake_seconds=deployment.bake_seconds,
        )
    return AllAtOnce(target=deployment.target_version, replicas=deployment.replicas)
