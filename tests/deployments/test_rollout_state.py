"""The rollout's typed state reads what the controller always stored, and the two plans answer the
controller's questions as the staged and the all-at-once rollouts require."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from django.db import connection

from portal.deployments.models import Deployment, Strategy
from portal.deployments.rollout.strategies import AllAtOnce, StagedShift, plan_for
from portal.deployments.state.rollout_state import Phase, RequestCounts, RolloutStep

# What the controller wrote before the step had a type (a bake in progress).
STORED_BAKE = {
    "phase": "bake",
    "generation": 7,
    "rollout_started_at": 1700000000.5,
    "bake_started_at": 1700000060.25,
    "baseline": {"inst-a": [10.0, 1.0], "inst-b": [4.0, 0.0]},
}


def test_a_stored_step_reads_typed_and_writes_back_unchanged():
    step = RolloutStep.from_json(STORED_BAKE)
    assert step.phase is Phase.BAKE and step.generation == 7
    assert step.baseline["inst-a"] == RequestCounts(10.0, 1.0)
    assert step.to_json() == STORED_BAKE
    assert RolloutStep.from_json({}) == RolloutStep() and RolloutStep().to_json() == {}
    restore = RolloutStep(phase=Phase.RESTORE, reason="v2 failed")
    assert RolloutStep.from_json(restore.to_json()) == restore


def test_the_bake_counts_requests_since_its_baseline_per_instance():
    step = RolloutStep.from_json(STORED_BAKE)
    now = {
        "inst-a": RequestCounts(30.0, 3.0),  # 20 ok, 2 failed since
        "inst-b": RequestCounts(4.0, 0.0),  # nothing since
        "inst-c": RequestCounts(5.0, 5.0),  # started during the bake: all of it counts
    }
    assert step.requests_since_baseline(now) == RequestCounts(25.0, 7.0)


def test_an_instance_unread_when_the_bake_began_is_counted_from_its_first_reading():
    """A busy machine: the baseline scrape of a ready instance timed out. Counting it from zero
    would dilute the bake's error rate with every request it answered before the bake."""
    step = RolloutStep.from_json({**STORED_BAKE, "unread": ["inst-late"]})
    assert step.unread == ("inst-late",)
    assert RolloutStep.from_json(step.to_json()) == step
    before = {"inst-a": RequestCounts(10.0, 1.0)}  # inst-late still does not answer
    assert step.with_late_baselines(before) is step
    assert step.requests_since_baseline(before) == RequestCounts()
    first = {**before, "inst-late": RequestCounts(200.0, 0.0)}  # 200 answered before the bake
    step = step.with_late_baselines(first)
    assert step.unread == () and step.baseline["inst-late"] == RequestCounts(200.0, 0.0)
    later = {**first, "inst-late": RequestCounts(201.0, 10.0)}
    assert step.requests_since_baseline(later) == RequestCounts(1.0, 10.0)  # 91% failed


def _version(number: int) -> SimpleNamespace:
    return SimpleNamespace(number=number)


def test_a_staged_shift_moves_instances_and_traffic_per_stage():
    plan = StagedShift(
        target=_version(2),  # type: ignore[arg-type]
        fallback=_version(1),  # type: ignore[arg-type]
        replicas=4,
        stages=[25, 50, 100],
        bake_seconds=30,
    )
    at = [(plan.new_instances(p), plan.old_instances(p), plan.traffic(p)) for p in plan.stages]
    assert at == [
        (1, 4, {2: 25, 1: 75}),
        (2, 4, {2: 50, 1: 50}),
        (4, 4, {2: 100}),  # the old set stays whole until the last bake has passed
    ]
    assert plan.stage_count == 3 and plan.bakes
    assert plan.percent(SimpleNamespace(stage_percent=None)) == 25  # type: ignore[arg-type]
    assert plan.percent(SimpleNamespace(stage_percent=50)) == 50  # type: ignore[arg-type]


def test_all_at_once_starts_everything_and_has_nothing_to_fall_back_to():
    plan = AllAtOnce(target=_version(3), replicas=2)  # type: ignore[arg-type]
    assert plan.percent(SimpleNamespace(stage_percent=10)) == 100  # type: ignore[arg-type]
    assert (plan.new_instances(100), plan.traffic(100), plan.fallback) == (2, {3: 100}, None)
    assert plan.stage_count == 1 and not plan.bakes


@pytest.mark.parametrize(
    ("strategy", "has_previous", "expected"),
    [
        (Strategy.RED_BLACK, True, StagedShift),
        (Strategy.RED_BLACK, False, AllAtOnce),
        (Strategy.VERSIONED, False, AllAtOnce),
    ],
)
def test_the_plan_follows_the_strategy_and_what_serves(strategy, has_previous, expected):
    deployment = SimpleNamespace(
        strategy=strategy,
        target_version=_version(2),
        previous_version=_version(1) if has_previous else None,
        replicas=2,
        stages=[50, 100],
        bake_seconds=10,
    )
    assert type(plan_for(deployment)) is expected  # type: ignore[arg-type]


def test_the_fields_store_the_same_json_and_load_typed(deployment):
    Deployment.objects.filter(pk=deployment.pk).update(
        traffic={2: 25, 1: 75}, step=RolloutStep.from_json(STORED_BAKE)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT traffic, step FROM deployments_deployment WHERE id = %s", [deployment.pk]
        )
        traffic, step = (json.loads(v) if isinstance(v, str) else v for v in cursor.fetchone())
    assert traffic == {"1": 75, "2": 25} and step == STORED_BAKE
    deployment.refresh_from_db()
    assert deployment.traffic == {1: 75, 2: 25}
    assert deployment.step == RolloutStep.from_json(STORED_BAKE)
