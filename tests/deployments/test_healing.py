"""The restart policy alone: back-off that doubles, and a crash loop that ends with its window."""

from __future__ import annotations

from portal.deployments.state.healing import RestartPolicy

POLICY = RestartPolicy(
    backoff_seconds=2, backoff_max_seconds=10, loop_failures=4, window_seconds=100
)
NOW = 10_000.0


def test_no_recent_failure_starts_at_once():
    decision = POLICY.decide([NOW - 500], NOW)  # outside the window
    assert (decision.not_before, decision.recent_failures, decision.crash_loop) == (0.0, 0, False)


def test_the_back_off_doubles_from_the_last_failure_up_to_its_cap():
    assert POLICY.decide([NOW - 1], NOW).not_before == NOW - 1 + 2
    assert POLICY.decide([NOW - 9, NOW - 1], NOW).not_before == NOW - 1 + 4
    assert POLICY.decide([NOW - 9, NOW - 5, NOW - 1], NOW).not_before == NOW - 1 + 8


def test_a_crash_loop_waits_until_fewer_failures_than_its_bound_remain_in_the_window():
    failures = [NOW - 90, NOW - 60, NOW - 30, NOW - 1, NOW - 95]
    decision = POLICY.decide(failures, NOW)
    assert decision.crash_loop and decision.recent_failures == 5
    # Of the last four (NOW-90, NOW-60, NOW-30, NOW-1) the oldest leaves the window at NOW+10.
    assert decision.not_before == NOW - 90 + 100
