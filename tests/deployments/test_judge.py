"""The canary judge: each metric's verdict rule and its boundaries, the score and the decision,
and the policy's validation by field. Plain functions on seeded samples: no database."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from portal.deployments.rollout.judge import (
    KNOWN_METRICS,
    MAX_HL_PAIRS,
    CanaryPolicy,
    MetricPolicy,
    Observations,
    PolicyError,
    hodges_lehmann,
    judge,
    judge_latency,
    judge_rate,
)

LATENCY = MetricPolicy("latency_s", min_samples=20)
ERRORS = MetricPolicy("error_rate", kind="rate", max_change=0.02, min_samples=100)


def lognormal(seed: int, n: int, median: float = 0.2, sigma: float = 0.5) -> np.ndarray:
    return median * np.random.default_rng(seed).lognormal(0.0, sigma, n)


# --- latency ----------------------------------------------------------------------------------


def test_latency_below_min_samples_on_either_side_is_nodata():
    for base_n, canary_n in ((19, 20), (20, 19), (0, 0)):
        verdict = judge_latency(LATENCY, lognormal(1, base_n), lognormal(2, canary_n))
        assert verdict.verdict == "nodata"
        assert verdict.p_value is None
        assert "20 needed on each side" in verdict.reason


def test_latency_with_min_samples_exactly_met_is_judged():
    verdict = judge_latency(LATENCY, lognormal(1, 20), lognormal(2, 20))
    assert verdict.verdict == "pass"
    assert verdict.baseline_count == verdict.canary_count == 20


def test_identical_samples_pass():
    sample = lognormal(3, 200)
    verdict = judge_latency(LATENCY, sample, sample.copy())
    assert verdict.verdict == "pass"
    assert verdict.ratio == 1.0
    assert verdict.hodges_lehmann == 0.0


def test_identical_constant_samples_pass():
    verdict = judge_latency(LATENCY, [0.5] * 30, [0.5] * 30)
    assert verdict.verdict == "pass"
    assert verdict.p_value == 1.0


def test_huge_regression_fails_with_a_reason_naming_the_numbers():
    baseline = lognormal(4, 300, median=0.19)
    canary = lognormal(5, 300, median=0.91)
    verdict = judge_latency(LATENCY, baseline, canary)
    assert verdict.verdict == "fail"
    assert verdict.p_value < 1e-10
    assert verdict.ratio == pytest.approx(verdict.canary_p50 / verdict.baseline_p50)
    assert verdict.ratio > 3
    assert verdict.reason.startswith(
        f"p50 {verdict.canary_p50:.3g} s vs {verdict.baseline_p50:.3g} s (+"
    )
    assert "%, p < 0.001): worse than the 20% allowed" in verdict.reason


def test_twice_as_fast_canary_passes_when_only_increase_is_bad():
    verdict = judge_latency(LATENCY, lognormal(6, 200), lognormal(7, 200) / 2)
    assert verdict.verdict == "pass"
    assert verdict.ratio < 0.6
    assert verdict.p_value > 0.99


def test_decrease_direction_fails_a_drop():
    policy = replace(LATENCY, direction="decrease")
    assert judge_latency(policy, lognormal(6, 200), lognormal(7, 200) / 2).verdict == "fail"
    assert judge_latency(policy, lognormal(6, 200), lognormal(7, 200) * 2).verdict == "pass"


def test_either_direction_catches_both():
    policy = MetricPolicy("completion_tokens", direction="either", min_samples=20)
    baseline = lognormal(8, 200, median=150)
    for factor in (2.0, 0.5):
        verdict = judge_latency(policy, baseline, lognormal(9, 200, median=150) * factor)
        assert verdict.verdict == "fail", verdict.reason
        assert verdict.reason.endswith("changed more than the 20% allowed")
    assert judge_latency(policy, baseline, lognormal(9, 200, median=150)).verdict == "pass"


def test_significant_but_small_change_is_marginal():
    baseline = lognormal(10, 5000)
    verdict = judge_latency(LATENCY, baseline, lognormal(11, 5000) * 1.05)
    assert verdict.p_value < 0.01
    assert verdict.ratio < 1.2
    assert verdict.verdict == "marginal"
    assert "significantly worse, but within the 20% allowed" in verdict.reason


def test_large_but_insignificant_change_is_marginal():
    policy = replace(LATENCY, min_samples=5)
    verdict = judge_latency(policy, [1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 4.0, 4.5, 5.0])
    assert verdict.ratio == pytest.approx(4 / 3)
    assert verdict.p_value > 0.1
    assert verdict.verdict == "marginal"
    assert "beyond the 20% allowed, but not significant at alpha 0.01" in verdict.reason


def test_p99_statistic_bounds_the_tail():
    policy = replace(LATENCY, statistic="p99")
    baseline = lognormal(12, 2000)
    canary = np.where(baseline > np.percentile(baseline, 95), baseline * 2, baseline)
    verdict = judge_latency(policy, baseline, canary)
    assert verdict.ratio == pytest.approx(verdict.canary_p99 / verdict.baseline_p99)
    assert verdict.reason.startswith("p99 ")
    assert judge_latency(LATENCY, baseline, canary).ratio == 1.0


def test_latency_p_values_match_scipy():
    baseline, canary = lognormal(13, 120), lognormal(14, 130, median=0.22)
    for direction, alternative in (
        ("increase", "greater"),
        ("decrease", "less"),
        ("either", "two-sided"),
    ):
        verdict = judge_latency(replace(LATENCY, direction=direction), baseline, canary)
        expected = stats.mannwhitneyu(canary, baseline, alternative=alternative).pvalue
        assert verdict.p_value == pytest.approx(expected, rel=1e-12)


def test_latency_numbers_are_reported():
    baseline, canary = lognormal(15, 100), lognormal(16, 100)
    verdict = judge_latency(LATENCY, baseline, canary)
    assert verdict.baseline_p50 == pytest.approx(np.median(baseline))
    assert verdict.canary_p99 == pytest.approx(np.percentile(canary, 99))
    assert verdict.canary_mean == pytest.approx(canary.mean())
    assert verdict.hodges_lehmann == pytest.approx(np.median(np.subtract.outer(canary, baseline)))


def test_hodges_lehmann_subsamples_large_inputs_deterministically():
    baseline, canary = lognormal(17, 2000), lognormal(18, 2000) + 0.05
    assert len(baseline) * len(canary) > MAX_HL_PAIRS
    estimate = hodges_lehmann(baseline, canary)
    assert estimate == hodges_lehmann(baseline, canary)
    assert estimate == pytest.approx(0.05, abs=0.01)


def test_zero_baseline_statistic_gives_an_infinite_ratio_and_json_null():
    policy = replace(LATENCY, min_samples=3)
    verdict = judge_latency(policy, [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0])
    assert math.isinf(verdict.ratio)
    assert "+inf%" in verdict.reason
    assert json.loads(json.dumps(verdict.to_dict()))["ratio"] is None


# --- rates ------------------------------------------------------------------------------------


def test_rate_below_min_samples_is_nodata():
    assert judge_rate(ERRORS, 0, 99, 0, 100).verdict == "nodata"
    assert judge_rate(ERRORS, 0, 100, 0, 99).verdict == "nodata"
    assert judge_rate(ERRORS, 0, 100, 0, 100).verdict == "pass"


def test_equal_rates_pass():
    verdict = judge_rate(ERRORS, 20, 2000, 20, 2000)
    assert verdict.verdict == "pass"
    assert verdict.difference == 0
    assert "within the 2 points allowed" in verdict.reason


def test_rate_rise_fails_with_a_reason_naming_the_numbers():
    verdict = judge_rate(ERRORS, 20, 2000, 120, 2000)
    assert verdict.verdict == "fail"
    assert verdict.baseline_rate == 0.01
    assert verdict.canary_rate == 0.06
    assert verdict.difference == pytest.approx(0.05)
    assert verdict.reason == (
        "6.00% vs 1.00% (+5.00 points, p < 0.001): worse than the 2 points allowed"
    )


def test_rate_marginal_both_ways():
    significant = judge_rate(ERRORS, 1000, 100_000, 1200, 100_000)
    assert significant.p_value < 0.01
    assert significant.verdict == "marginal"
    noisy = judge_rate(replace(ERRORS, min_samples=20), 0, 20, 2, 20)
    assert noisy.p_value > 0.1
    assert noisy.verdict == "marginal"


def test_a_one_point_bound_reads_in_the_singular():
    verdict = judge_rate(replace(ERRORS, max_change=0.01), 20, 2000, 20, 2000)
    assert verdict.reason.endswith("within the 1 point allowed")


def test_rate_fall_passes_unless_direction_says_otherwise():
    assert judge_rate(ERRORS, 120, 2000, 20, 2000).verdict == "pass"
    either = replace(ERRORS, direction="either")
    assert judge_rate(either, 120, 2000, 20, 2000).verdict == "fail"


def test_rate_p_values_match_scipy():
    rng = np.random.default_rng(19)
    base, canary = int(rng.binomial(3000, 0.01)), int(rng.binomial(3000, 0.015))
    table = [[canary, 3000 - canary], [base, 3000 - base]]
    for direction, alternative in (("increase", "greater"), ("either", "two-sided")):
        verdict = judge_rate(replace(ERRORS, direction=direction), base, 3000, canary, 3000)
        expected = stats.fisher_exact(table, alternative=alternative).pvalue
        assert verdict.p_value == pytest.approx(expected, rel=1e-12)


def test_impossible_counts_are_refused():
    with pytest.raises(ValueError, match="canary"):
        judge_rate(ERRORS, 0, 100, 101, 100)


# --- the decision -----------------------------------------------------------------------------


def small_policy(**changes) -> CanaryPolicy:
    metrics = (
        MetricPolicy("latency_s", min_samples=20, critical=True),
        MetricPolicy("ttft_s", min_samples=20),
        MetricPolicy("tpot_s", min_samples=20),
        MetricPolicy("error_rate", kind="rate", max_change=0.02, min_samples=100),
    )
    return replace(CanaryPolicy(metrics=metrics), **changes)


def sides(**canary_factors: float) -> tuple[Observations, Observations]:
    """Baseline and canary with the same seeded samples, the canary's scaled per metric; error
    counts equal unless ``error_rate`` is given (the canary's rate)."""
    names = ("latency_s", "ttft_s", "tpot_s")
    baseline = Observations(samples={n: list(lognormal(i, 200)) for i, n in enumerate(names)})
    canary = Observations(
        samples={
            n: list(lognormal(i, 200) * canary_factors.get(n, 1.0)) for i, n in enumerate(names)
        }
    )
    baseline.counts["error_rate"] = (10, 1000)
    canary.counts["error_rate"] = (int(1000 * canary_factors.get("error_rate", 0.01)), 1000)
    return baseline, canary


def test_all_pass_promotes():
    analysis = judge(small_policy(), *sides())
    assert analysis.decision == "promote"
    assert analysis.score == 100
    assert analysis.reason == "score 100 >= 95"


def test_critical_failure_rolls_back_whatever_the_score():
    baseline, canary = sides(latency_s=3.0)
    del canary.samples["ttft_s"]  # nodata elsewhere does not delay a rollback
    analysis = judge(small_policy(pass_score=0, marginal_score=0), baseline, canary)
    assert analysis.decision == "rollback"
    assert analysis.reason.startswith("critical metric failed: latency_s fail: p50 ")


def test_nodata_on_a_scored_metric_is_not_enough_data():
    baseline, canary = sides()
    canary.counts["error_rate"] = (0, 99)
    analysis = judge(small_policy(), baseline, canary)
    assert analysis.decision == "not_enough_data"
    assert analysis.score == 100  # over the metrics that have data
    assert analysis.reason.startswith("not enough data: error_rate nodata: 1000 baseline")


def test_one_noncritical_failure_holds():
    analysis = judge(small_policy(), *sides(ttft_s=3.0))
    assert analysis.score == 75
    assert analysis.decision == "hold"
    assert analysis.reason.startswith("score 75 between 75 and 95: ttft_s fail: p50 ")


def test_score_under_marginal_score_rolls_back():
    analysis = judge(small_policy(), *sides(ttft_s=3.0, tpot_s=3.0))
    assert analysis.score == 50
    assert analysis.decision == "rollback"
    assert "ttft_s fail" in analysis.reason and "tpot_s fail" in analysis.reason


def test_marginal_counts_as_three_quarters_of_a_pass():
    baseline, canary = sides()
    base_samples = lognormal(20, 5000)
    baseline.samples["ttft_s"] = list(base_samples)
    canary.samples["ttft_s"] = list(lognormal(21, 5000) * 1.05)  # significant, small
    analysis = judge(small_policy(), baseline, canary)
    assert analysis.verdict("ttft_s").verdict == "marginal"
    assert analysis.score == pytest.approx(100 * 3.75 / 4)
    assert analysis.decision == "hold"  # 93.75 < 95 with four metrics


def test_report_only_metrics_are_shown_but_not_scored():
    policy = small_policy()
    metrics = tuple(replace(m, report_only=m.name == "ttft_s") for m in policy.metrics)
    baseline, canary = sides(ttft_s=3.0)
    del baseline.samples["tpot_s"], canary.samples["tpot_s"]
    metrics = tuple(replace(m, report_only=m.name in ("ttft_s", "tpot_s")) for m in metrics)
    analysis = judge(replace(policy, metrics=metrics), baseline, canary)
    assert analysis.verdict("ttft_s").verdict == "fail"
    assert analysis.verdict("tpot_s").verdict == "nodata"
    assert analysis.decision == "promote"
    assert analysis.score == 100


def test_default_policy_judges_equal_bakes_as_promote():
    policy = CanaryPolicy.default()
    rng = np.random.default_rng(22)

    def side() -> Observations:
        obs = Observations()
        for m in policy.metrics:
            if m.kind == "latency":
                obs.samples[m.name] = list(rng.lognormal(0.0, 0.5, m.min_samples))
            else:
                obs.counts[m.name] = (int(rng.binomial(m.min_samples, 0.01)), m.min_samples)
        return obs

    analysis = judge(policy, side(), side())
    assert analysis.decision == "promote", analysis.reason
    data = json.loads(json.dumps(analysis.to_dict()))
    assert [v["name"] for v in data["verdicts"]] == list(KNOWN_METRICS)


# --- the policy -------------------------------------------------------------------------------


def test_default_policy_is_valid_and_names_every_metric():
    policy = CanaryPolicy.default()
    policy.validate()
    assert [m.name for m in policy.metrics] == list(KNOWN_METRICS)
    assert {m.name for m in policy.metrics if m.critical} == {"latency_s", "error_rate"}
    assert policy.metric("completion_tokens").direction == "either"
    assert (policy.pass_score, policy.marginal_score) == (95, 75)


def test_policy_round_trips_through_json():
    policy = CanaryPolicy.default()
    assert CanaryPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    custom = small_policy(pass_score=90, marginal_score=60)
    assert CanaryPolicy.from_dict(custom.to_dict()) == custom


def test_from_dict_fills_left_out_fields_from_the_platform_default():
    policy = CanaryPolicy.from_dict({"metrics": [{"name": "error_rate", "max_change": 0.05}]})
    (metric,) = policy.metrics
    assert metric == replace(CanaryPolicy.default().metric("error_rate"), max_change=0.05)
    assert CanaryPolicy.from_dict({}) == CanaryPolicy.default()


def default_dict() -> dict:
    return CanaryPolicy.default().to_dict()


def with_metric(index: int, **changes) -> dict:
    data = default_dict()
    data["metrics"][index].update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (with_metric(0, name="gpu_temp"), "metrics[0].name"),
        (with_metric(1, kind="histogram"), "metrics[1].kind"),
        (with_metric(4, kind="latency"), "metrics[4].kind"),
        (with_metric(2, direction="up"), "metrics[2].direction"),
        (with_metric(0, statistic="p95"), "metrics[0].statistic"),
        (with_metric(3, max_change=-0.1), "metrics[3].max_change"),
        (with_metric(3, max_change="big"), "metrics[3].max_change"),
        (with_metric(5, max_change=1.5), "metrics[5].max_change"),
        (with_metric(1, alpha=0), "metrics[1].alpha"),
        (with_metric(1, alpha=0.5), "metrics[1].alpha"),
        (with_metric(6, min_samples=1), "metrics[6].min_samples"),
        (with_metric(6, min_samples=2.5), "metrics[6].min_samples"),
        (with_metric(7, critical="yes"), "metrics[7].critical"),
        (with_metric(1, critical=True, report_only=True), "metrics[1].critical"),
        (with_metric(2, colour="red"), "metrics[2].colour"),
        (with_metric(2, name="ttft_s"), "metrics[2].name"),  # a duplicate
        ({"metrics": [{"kind": "rate"}]}, "metrics[0].name"),
        ({"metrics": ["error_rate"]}, "metrics[0]"),
        ({"metrics": "error_rate"}, "metrics"),
        ({"metrics": []}, "metrics"),
        ({"metrics": [{"name": "ttft_s", "report_only": True}]}, "metrics"),
        ({"pass_score": 101}, "pass_score"),
        ({"marginal_score": -1}, "marginal_score"),
        ({"pass_score": 70, "marginal_score": 80}, "marginal_score"),
        ({"pass_score": "high"}, "pass_score"),
        ({"threshold": 3}, "threshold"),
    ],
)
def test_bad_policy_values_are_named_by_field(data, field):
    with pytest.raises(PolicyError) as raised:
        CanaryPolicy.from_dict(data)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_a_policy_scoring_nothing_decides_nothing():
    metrics = tuple(replace(m, report_only=True) for m in small_policy().metrics)
    analysis = judge(CanaryPolicy(metrics=metrics), *sides())
    assert (analysis.decision, analysis.score) == ("not_enough_data", None)


def test_validate_checks_a_policy_built_in_code():
    policy = small_policy(marginal_score=96)
    with pytest.raises(PolicyError, match="marginal_score"):
        policy.validate()


def test_observations_are_read_from_the_front_ends_records():
    def record(status=200, **fields):
        base = {
            "status": status,
            "latency_s": 1.0,
            "ttft_s": 0.1,
            "tpot_s": 0.01,
            "completion_tokens": 10,
            "finish_reason": "stop",
            "empty": False,
            "structured_valid": None,
        }
        return {**base, **fields}

    records = [
        record(),
        record(ttft_s=None, tpot_s=None),  # a whole response: no time to first token
        record(finish_reason="length", structured_valid=False),
        record(empty=True, structured_valid=True),
        record(status=503, latency_s=0.0, completion_tokens=None),
        record(status=400),  # the caller's mistake: in no rate
        record(status=499),  # the caller left: in no rate
    ]
    side = Observations.from_records(records)
    assert side.samples["latency_s"] == [1.0, 1.0, 1.0, 1.0]
    assert side.samples["ttft_s"] == [0.1, 0.1, 0.1]
    assert side.counts == {
        "error_rate": (1, 5),
        "empty_rate": (1, 4),
        "length_stop_rate": (1, 4),
        "schema_invalid_rate": (1, 2),
    }
