"""The autoscaling rule on its own: recommendation, bounds, stabilization, its stored state."""

from __future__ import annotations

from portal.deployments.state.autoscaling import (
    InstanceLoad,
    ScalingPolicy,
    ScalingState,
    decide,
    recommend,
)


def policy(**changes) -> ScalingPolicy:
    fields = {
        "min_replicas": 1,
        "max_replicas": 4,
        "metric": "in_flight",
        "target": 4.0,
        "up_window_seconds": 0,
        "down_window_seconds": 0,
        "scale_to_zero_after_seconds": None,
    }
    return ScalingPolicy(**{**fields, **changes})


def loads(*in_flight: float) -> list[InstanceLoad]:
    return [InstanceLoad(running=n, waiting=0.0, kv_cache_usage=None) for n in in_flight]


def test_the_count_is_the_load_over_the_target_per_instance_within_the_bounds():
    assert recommend(policy(), 2, loads(6, 6)) == 3  # ceil(2 * 6 / 4)
    assert recommend(policy(), 2, loads(9.5, 9.5)) == 4  # 5, capped at max 4
    assert recommend(policy(), 2, loads(0, 0)) == 1  # 0, raised to min 1
    assert recommend(policy(), 2, []) is None  # no instance answered: no opinion


def test_a_load_within_the_tolerance_of_the_target_keeps_the_count():
    assert recommend(policy(), 3, loads(4.3, 4.3, 4.3)) == 3  # ratio 1.075
    assert recommend(policy(), 3, loads(4.5, 4.5, 4.5)) == 4  # ratio 1.125: ceil(3.375)


def test_each_signal_reads_its_own_part_of_the_instances_metrics():
    busy = [InstanceLoad(running=2, waiting=6, kv_cache_usage=0.9)]
    assert recommend(policy(metric="in_flight", target=4), 1, busy) == 2  # 8 in flight
    assert recommend(policy(metric="waiting", target=2), 1, busy) == 3  # 6 waiting
    assert recommend(policy(metric="kv_cache", target=0.45), 1, busy) == 2  # 0.9 used


def test_scaling_up_acts_on_the_lowest_recommendation_of_its_window():
    rule = policy(up_window_seconds=30, down_window_seconds=300, max_replicas=10)
    replicas, state, decision = decide(rule, ScalingState(), 2, loads(20, 20), now=1000)
    assert (replicas, decision.replicas_to) == (10, 10)  # nothing older in the window
    state = ScalingState(recommendations=((990.0, 3),))
    replicas, state, decision = decide(rule, state, 2, loads(20, 20), now=1000)
    assert replicas == 3  # a 3 ten seconds ago: the window's lowest
    assert decision is not None and "the lowest of the last 30 s is 3" in decision.reason
    # Once the 3 has left the window, the higher recommendation applies.
    replicas, _, _ = decide(rule, state, 3, loads(20, 20, 20), now=1031)
    assert replicas == 10


def test_scaling_down_waits_for_its_whole_window_of_lower_recommendations():
    rule = policy(up_window_seconds=0, down_window_seconds=300)
    state = ScalingState(recommendations=((800.0, 4),), recording_since=700.0)
    replicas, state, decision = decide(rule, state, 4, loads(0, 0, 0, 0), now=1000)
    assert (replicas, decision) == (4, None)  # a 4 within the last 300 s holds the count
    replicas, state, decision = decide(rule, state, 4, loads(0, 0, 0, 0), now=1101)
    assert replicas == 1
    assert decision.reason.startswith("in-flight requests per instance 0 against a target of 4")


def test_the_decision_carries_the_numbers_behind_it():
    _, state, decision = decide(policy(), ScalingState(), 2, loads(9.5, 9.5), now=50)
    assert decision.to_json() == {
        "at": 50,
        "replicas_from": 2,
        "replicas_to": 4,
        "metric": "in_flight",
        "observed": 9.5,
        "target": 4.0,
        "reporting": 2,
        "recommended": 4,
        "reason": "in-flight requests per instance 9.5 against a target of 4 "
        "(ceil(2 \u00d7 9.5 / 4) = 5, within 1-4: 4)",
    }
    assert state.decisions == (decision,)


def test_without_a_reading_the_count_stays_but_the_bounds_still_apply():
    assert decide(policy(), ScalingState(), 2, [], now=1)[:1] == (2,)
    replicas, _, decision = decide(policy(min_replicas=3), ScalingState(), 2, [], now=1)
    assert replicas == 3 and decision.reason == "the policy's bounds are 3 to 4"


def test_the_state_survives_its_json():
    _, state, _ = decide(policy(), ScalingState(woken_at=5.0), 2, loads(9.5, 9.5), now=50)
    again = ScalingState.from_json(state.to_json())
    assert again == state
    assert ScalingState.from_json(None) == ScalingState()
    assert not again.asleep and again.but(asleep_since=60.0).asleep


def test_only_the_newest_ten_decisions_are_kept():
    state = ScalingState()
    replicas = 1
    for second in range(12):
        load = 20 if replicas == 1 else 0
        replicas, state, _ = decide(policy(), state, replicas, loads(*[load] * replicas), second)
    assert len(state.decisions) == 10
    assert state.decisions[-1].at == 11


def test_a_first_look_does_not_scale_down_before_a_whole_down_window_was_watched():
    rule = policy(down_window_seconds=300)
    replicas, state, decision = decide(rule, ScalingState(), 3, loads(0, 0, 0), now=1000)
    assert (replicas, decision, state.recording_since) == (3, None, 1000)
    replicas, state, _ = decide(rule, state, 3, loads(0, 0, 0), now=1299)
    assert replicas == 3
    replicas, _, _ = decide(rule, state, 3, loads(0, 0, 0), now=1301)
    assert replicas == 1
