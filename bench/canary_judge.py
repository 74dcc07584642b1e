"""Canary judge benchmark: how often the default policy rolls back equal versions, and how often
it catches a real regression, on simulated bakes.

Run from the repository root (no database, no services)::

    python bench/canary_judge.py                 # 1,000 trials per row: about 2 minutes
    python bench/canary_judge.py --trials 200    # a quick look

A bake is simulated as per-request observations of both versions, each metric at its own
``min_samples`` of the default policy (the smallest bake the judge decides on, so the rates are
the worst the policy allows): latencies lognormal with the spreads below (sigma 0.6 for the
end-to-end latency is a p99/p50 of 4, usual for mixed prompt and output lengths), events
Bernoulli. Rows:

- **equal versions**: both sides from the same distributions; the goal is a rollback rate of 1%
  or less (and the promote rate shows how often the judge is simply right);
- **equal versions, 2,000 requests for every metric**: the same, as a real bake that is judged
  when the rates have their 2,000 requests has as many latency samples (no goal: it shows how
  much of the first row's "hold" is owed to the latency metrics' smaller minimum);
- **latency +20%**: the canary's ``latency_s`` scaled by 1.2, so its p99 (and every other
  quantile) is 20% worse, as a slower kernel or engine makes it; goal: rollback 95% or more;
- **error rate 1% -> 3%**: goal: rollback 95% or more;
- **latency tail +20%** (informative, no goal): only requests above the baseline's p90 are 20%
  slower, so the p99 is 20% worse and the median unchanged. The default judges the median, so
  this is what it is not built to catch (see ``MetricPolicy``'s docstring).

Then, for the two regressions, the per-side sample size at which the critical metric fails
(which alone rolls back) in 95% of bakes, with its false-fail rate on equal versions beside it.

It prints a Markdown summary; ``--out FILE.json`` also writes the results there (and the summary
beside it, as ``FILE.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import norm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from portal.deployments.rollout.judge import (  # noqa: E402
    CanaryPolicy,
    MetricPolicy,
    Observations,
    judge,
    judge_latency,
    judge_rate,
)

#: Latency-type metrics: (median, lognormal sigma).
LATENCY_SHAPES: dict[str, tuple[float, float]] = {
    "ttft_s": (0.25, 0.8),  # queueing and prompt length: the widest
    "latency_s": (2.0, 0.6),
    "tpot_s": (0.03, 0.25),  # per token, steady once decoding runs
    "completion_tokens": (150.0, 0.7),
}
#: Rate-type metrics: the baseline's probability per request.
BASE_RATES: dict[str, float] = {
    "error_rate": 0.01,
    "empty_rate": 0.005,
    "length_stop_rate": 0.08,
    "schema_invalid_rate": 0.01,
}
GRID = (100, 200, 300, 400, 500, 600, 800, 1000, 1500, 2000, 3000, 4000)
DETECTION_GOAL = 0.95
FALSE_ROLLBACK_GOAL = 0.01

Change = Callable[[str, np.ndarray], np.ndarray]


def latency_samples(rng: np.random.Generator, name: str, n: int) -> np.ndarray:
    median, sigma = LATENCY_SHAPES[name]
    values = median * rng.lognormal(0.0, sigma, n)
    return np.maximum(np.round(values), 1.0) if name == "completion_tokens" else values


def scale(factor: float) -> Change:
    return lambda name, values: values * factor


def tail(factor: float, quantile: float) -> Change:
    """Requests above the baseline distribution's ``quantile`` take ``factor`` times longer."""

    def change(name: str, values: np.ndarray) -> np.ndarray:
        median, sigma = LATENCY_SHAPES[name]
        cut = median * float(np.exp(sigma * norm.ppf(quantile)))
        return np.where(values > cut, values * factor, values)

    return change


def observations(
    rng: np.random.Generator,
    policy: CanaryPolicy,
    latency_change: dict[str, Change] | None = None,
    rates: dict[str, float] | None = None,
    requests: int | None = None,
) -> Observations:
    obs = Observations()
    for metric in policy.metrics:
        n = requests or metric.min_samples
        if metric.kind == "latency":
            values = latency_samples(rng, metric.name, n)
            change = (latency_change or {}).get(metric.name)
            obs.samples[metric.name] = list(change(metric.name, values) if change else values)
        else:
            p = (rates or {}).get(metric.name, BASE_RATES[metric.name])
            obs.counts[metric.name] = (int(rng.binomial(n, p)), n)
    return obs


def decisions(
    trials: int,
    seed: int,
    latency_change: dict[str, Change] | None = None,
    rates: dict[str, float] | None = None,
    requests: int | None = None,
) -> dict[str, Any]:
    """The share of each decision over ``trials`` simulated bakes of the default policy, each
    metric at its ``min_samples`` or, given ``requests``, every metric at that many; and the
    share of bakes in which each metric was not a pass (what a hold or a rollback came from)."""
    policy = CanaryPolicy.default()
    rng = np.random.default_rng(seed)
    counts: Counter[str] = Counter()
    flagged: Counter[str] = Counter()
    for _ in range(trials):
        baseline = observations(rng, policy, requests=requests)
        canary = observations(rng, policy, latency_change, rates, requests)
        analysis = judge(policy, baseline, canary)
        counts[analysis.decision] += 1
        flagged.update(v.name for v in analysis.verdicts if v.verdict != "pass")
    shares: dict[str, Any] = {
        d: counts[d] / trials for d in ("promote", "hold", "rollback", "not_enough_data")
    }
    shares["flagged"] = {m.name: flagged[m.name] / trials for m in policy.metrics}
    return shares


def fail_rate(
    trials: int, seed: int, metric: MetricPolicy, n: int, change: Change | None, rate: float
) -> float:
    """The share of bakes of ``n`` requests per side in which ``metric`` alone fails."""
    metric = replace(metric, min_samples=min(metric.min_samples, n))
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(trials):
        if metric.kind == "latency":
            base = latency_samples(rng, metric.name, n)
            can = latency_samples(rng, metric.name, n)
            verdict = judge_latency(metric, base, change(metric.name, can) if change else can)
        else:
            base_p = BASE_RATES[metric.name]
            verdict = judge_rate(
                metric, int(rng.binomial(n, base_p)), n, int(rng.binomial(n, rate)), n
            )
        fails += verdict.verdict == "fail"
    return fails / trials


def sample_size(
    trials: int, seed: int, metric: MetricPolicy, change: Change | None, rate: float
) -> dict[str, Any]:
    """Detection and false-fail rates along :data:`GRID`, up to the first size at which
    detection reaches the goal or, if larger, the metric's default ``min_samples``."""
    rows = []
    needed = None
    for n in GRID:
        detected = fail_rate(trials, seed, metric, n, change, rate)
        equal = fail_rate(trials, seed + 1, metric, n, None, BASE_RATES.get(metric.name, 0.0))
        rows.append({"n": n, "detection": detected, "false_fail": equal})
        if needed is None and detected >= DETECTION_GOAL:
            needed = n
        if needed is not None and n >= metric.min_samples:
            break
    return {"metric": metric.name, "default": metric.min_samples, "needed": needed, "grid": rows}


def run(trials: int) -> dict[str, Any]:
    started = time.perf_counter()
    policy = CanaryPolicy.default()
    scenarios = {
        "equal versions": decisions(trials, 1),
        "equal versions, 2,000 requests for every metric": decisions(trials, 6, requests=2000),
        "latency +20%": decisions(trials, 2, latency_change={"latency_s": scale(1.2)}),
        "error rate 1% -> 3%": decisions(trials, 3, rates={"error_rate": 0.03}),
        "latency tail +20% (p90 and above)": decisions(
            trials, 4, latency_change={"latency_s": tail(1.2, 0.90)}
        ),
    }
    sizes = [
        sample_size(trials, 5, policy.metric("latency_s"), scale(1.2), 0.0),
        sample_size(trials, 7, policy.metric("error_rate"), None, 0.03),
    ]
    return {
        "trials": trials,
        "policy": policy.to_dict(),
        "latency_shapes": LATENCY_SHAPES,
        "base_rates": BASE_RATES,
        "scenarios": scenarios,
        "sample_sizes": sizes,
        "seconds": round(time.perf_counter() - started, 1),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Canary judge ({result['trials']} trials per row, default policy, "
        "each metric at its min_samples)",
        "",
        "| scenario | promote | hold | rollback | not enough data |",
        "|---|---|---|---|---|",
    ]
    for name, shares in result["scenarios"].items():
        cells = " | ".join(f"{shares[d]:.1%}" for d in ("promote", "hold", "rollback"))
        lines.append(f"| {name} | {cells} | {shares['not_enough_data']:.1%} |")
    goals = result["scenarios"]
    flagged = goals["equal versions"]["flagged"]
    lines += [
        "",
        "Equal versions, share of bakes in which each metric was marginal or failed: "
        + ", ".join(f"{name} {share:.1%}" for name, share in flagged.items()),
    ]
    lines += [
        "",
        f"- false rollback, equal versions: {goals['equal versions']['rollback']:.1%} "
        f"(goal <= {FALSE_ROLLBACK_GOAL:.0%})",
        f"- detection, latency +20%: {goals['latency +20%']['rollback']:.1%} "
        f"(goal >= {DETECTION_GOAL:.0%})",
        f"- detection, error rate 1% -> 3%: {goals['error rate 1% -> 3%']['rollback']:.1%} "
        f"(goal >= {DETECTION_GOAL:.0%})",
    ]
    for size in result["sample_sizes"]:
        needed = size["needed"] or f"more than {GRID[-1]}"
        lines += [
            "",
            f"## {size['metric']}: {needed} per side for {DETECTION_GOAL:.0%} detection "
            f"(default min_samples {size['default']})",
            "",
            "| n per side | fails (regression) | fails (equal versions) |",
            "|---|---|---|",
        ]
        lines += [
            f"| {row['n']} | {row['detection']:.1%} | {row['false_fail']:.1%} |"
            for row in size["grid"]
        ]
    lines += ["", f"{result['seconds']} s"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="simulated bakes per row")
    parser.add_argument("--out", type=Path, help="write the results here (JSON) and beside it")
    args = parser.parse_args(argv)
    result = run(args.trials)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
