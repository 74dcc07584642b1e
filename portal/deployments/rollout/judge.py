"""The canary judge: is the new version ("canary") worse than the old one ("baseline") over the
same minutes of a bake, metric by metric, and what should the rollout do about it?

The design follows Netflix Kayenta's judge: each metric is classified on its own by a
nonparametric test (Mann-Whitney for latency-type samples, Fisher's exact test for rate-type
counts), then the verdicts are combined into a weighted score and a decision. Two conditions
make a metric fail, both needed: the difference is *significant* in the bad direction
(``p < alpha``), and it is *large* (the effect is beyond the metric's ``max_change``). Either
alone is "marginal": a significant but small change is what a big enough bake always finds,
and a large but noisy change is what a small bake often shows by chance; neither should roll a
version back on its own, and neither should be waved through as a plain pass.

**Bound versus what a bake catches.** A change exactly at the bound is, by construction, judged
"beyond the bound" about half the time whatever the sample size, since the estimate scatters
around the truth. A change a bake must *reliably* catch has to sit above the bound by about
1.65 standard errors of the estimate. The platform default policy therefore sets each bound at
about half of the regression it is meant to catch (10% for a 20% latency regression, one
percentage point for a two-point error-rate rise) and sets ``min_samples`` so that the
standard error is small enough (see ``bench/canary_judge.py`` for the measured rates).

Plain Python with numpy and scipy, and no Django, so the judge can be tested and benchmarked on
its own and called from the controller, a management command or a notebook alike. scipy.stats
is imported where a test runs: it takes a second and a half to import,
and the pages and the API import this module only to check a policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np

Kind = Literal["latency", "rate"]
Direction = Literal["increase", "decrease", "either"]
Statistic = Literal["p50", "p99"]
Verdict = Literal["pass", "marginal", "fail", "nodata"]
Decision = Literal["promote", "hold", "rollback", "not_enough_data"]
#: Per-request values of a latency-type metric: a list, or a numpy array as the bench passes.
Samples = Sequence[float] | np.ndarray

KINDS: tuple[str, ...] = ("latency", "rate")
DIRECTIONS: tuple[str, ...] = ("increase", "decrease", "either")
STATISTICS: tuple[str, ...] = ("p50", "p99")

#: The metrics the platform records per request, with the kind of data each comes as. A policy
#: may only name these: the name says where the observations come from.
KNOWN_METRICS: dict[str, Kind] = {
    "ttft_s": "latency",
    "latency_s": "latency",
    "tpot_s": "latency",
    "completion_tokens": "latency",
    "error_rate": "rate",
    "empty_rate": "rate",
    "length_stop_rate": "rate",
    "schema_invalid_rate": "rate",
}

#: How a value of each latency-kind metric reads in a reason.
UNITS: dict[str, str] = {
    "ttft_s": " s",
    "latency_s": " s",
    "tpot_s": " s",
    "completion_tokens": " tokens",
}

#: Above this many baseline x canary pairs the Hodges-Lehmann estimate is taken over a random
#: subset of pairs: its error from subsampling (about 1/sqrt(pairs) of the spread) is then far
#: below the sampling error of the data itself, and the judge stays within milliseconds.
MAX_HL_PAIRS = 50_000


class PolicyError(ValueError):
    """A bad policy value, naming its field (``metrics[2].alpha``) so an API can answer 400 by
    field rather than with one opaque message."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class MetricPolicy:
    """How one metric is judged.

    ``max_change`` is the effect bound: for latency a relative change of ``statistic`` (0.20 =
    20% worse), for a rate an absolute change in proportion (0.02 = two percentage points).

    ``statistic`` defaults to ``p50`` although users feel the tail: the Mann-Whitney test is a
    test of a location shift, which the median measures with it, while a p99 from a few hundred
    samples is decided by its three or four largest values and scatters so widely that a bound
    on it either passes real regressions or fails equal versions: for a 20% slowdown at a
    lognormal spread of sigma 0.6, 95% detection takes about 4,000 samples per side on the p99
    and about 500 on the median (``bench/canary_judge.py`` and a run of the same with p99). A slower engine or kernel moves
    every quantile by the same factor, so the median catches it with far fewer samples. ``p99``
    is there for tail-only changes (queueing, a slow path hit by few requests), with a
    ``min_samples`` in the thousands; the p99s of both sides are reported either way.
    """

    name: str
    kind: Kind = "latency"
    direction: Direction = "increase"
    max_change: float = 0.20
    statistic: Statistic = "p50"
    alpha: float = 0.01
    min_samples: int = 50
    critical: bool = False
    report_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field_prefix: str = "metric") -> MetricPolicy:
        """Fields left out take the platform default of the metric of that name (so
        ``{"name": "error_rate", "max_change": 0.05}`` keeps its kind and sample size), or the
        class defaults for a name the platform policy does not list (which ``validate`` then
        rejects with the name's field)."""
        if not isinstance(data, Mapping):
            raise PolicyError(field_prefix, "must be an object")
        allowed = {f.name for f in fields(cls)}
        for key in data:
            if key not in allowed:
                raise PolicyError(f"{field_prefix}.{key}", "unknown field")
        name = data.get("name")
        if not isinstance(name, str):
            raise PolicyError(f"{field_prefix}.name", "must be a string")
        base = _DEFAULT_METRICS.get(name) or cls(name=name, kind=KNOWN_METRICS.get(name, "latency"))
        metric = replace(base, **{k: v for k, v in data.items() if k != "name"})
        metric.validate(field_prefix)
        return metric

    def validate(self, field_prefix: str = "metric") -> None:
        """Raise :class:`PolicyError` naming the first bad field."""

        def bad(name: str, message: str) -> PolicyError:
            return PolicyError(f"{field_prefix}.{name}", message)

        if self.name not in KNOWN_METRICS:
            raise bad("name", f"unknown metric {self.name!r}; known: {', '.join(KNOWN_METRICS)}")
        if self.kind not in KINDS:
            raise bad("kind", f"must be one of {', '.join(KINDS)}")
        if self.kind != KNOWN_METRICS[self.name]:
            raise bad("kind", f"{self.name} is a {KNOWN_METRICS[self.name]} metric")
        if self.direction not in DIRECTIONS:
            raise bad("direction", f"must be one of {', '.join(DIRECTIONS)}")
        if self.statistic not in STATISTICS:
            raise bad("statistic", f"must be one of {', '.join(STATISTICS)}")
        if not _is_number(self.max_change) or not math.isfinite(self.max_change):
            raise bad("max_change", "must be a number")
        if self.max_change < 0:
            raise bad("max_change", "must not be negative")
        if self.kind == "rate" and self.max_change > 1:
            raise bad("max_change", "a rate's bound is a proportion, at most 1")
        if not _is_number(self.alpha) or not 0 < self.alpha < 0.5:
            raise bad("alpha", "must be a number in (0, 0.5)")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int):
            raise bad("min_samples", "must be an integer")
        if self.min_samples < 2:
            raise bad("min_samples", "must be at least 2")
        for flag in ("critical", "report_only"):
            if not isinstance(getattr(self, flag), bool):
                raise bad(flag, "must be true or false")
        if self.critical and self.report_only:
            raise bad("critical", "a report-only metric cannot be critical")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


#: The platform default, metric by metric; see :meth:`CanaryPolicy.default` for why.
_DEFAULT_METRICS: dict[str, MetricPolicy] = {
    m.name: m
    for m in (
        MetricPolicy("ttft_s", max_change=0.10, min_samples=1000),
        MetricPolicy("latency_s", max_change=0.10, min_samples=1000, critical=True),
        MetricPolicy("tpot_s", max_change=0.10, min_samples=1000),
        MetricPolicy("completion_tokens", direction="either", max_change=0.20, min_samples=1000),
        MetricPolicy("error_rate", kind="rate", max_change=0.01, min_samples=2000, critical=True),
        MetricPolicy("empty_rate", kind="rate", max_change=0.01, min_samples=2000),
        MetricPolicy("length_stop_rate", kind="rate", max_change=0.05, min_samples=2000),
        MetricPolicy("schema_invalid_rate", kind="rate", max_change=0.01, min_samples=2000),
    )
}


@dataclass(frozen=True)
class CanaryPolicy:
    """Which metrics a bake is judged by, and the score thresholds of the decision."""

    metrics: tuple[MetricPolicy, ...]
    pass_score: float = 95.0
    marginal_score: float = 75.0

    @classmethod
    def default(cls) -> CanaryPolicy:
        """The platform default.

        - Latency metrics (``ttft_s``, ``latency_s``, ``tpot_s``): bound 10% on the median, so
          that a 20% regression is caught 95% of the time or more; ``latency_s`` is critical
          (it is what a caller waits for; ``ttft_s`` and ``tpot_s`` are its parts and are
          scored, so a regression in one alone holds rather than rolls back). The benchmark
          finds 500 samples per side enough for 95% detection of a 20% shift at a lognormal
          spread of sigma 0.6 (a p99/p50 of 4); the default asks 1,000, which keeps detection
          above 95% for wider spreads and takes equal versions' false fails from about alpha
          (0.8%) down to about 0.2%, as the bound then decides rather than the test. It costs
          no bake time: the rates need 2,000 requests anyway.
        - ``completion_tokens``: direction "either", bound 20%: a new version that answers much
          longer or much shorter is suspect both ways, but output length varies with prompts
          more than latency does, so the bound is looser.
        - Rates: ``error_rate`` critical, bound one percentage point, so that a rise of two
          points from 1% is caught 95% of the time; a two-point difference between small rates
          needs about 2,000 requests per side to be significant at alpha 0.01 with that power,
          which is why the rates' ``min_samples`` is 2,000. ``length_stop_rate`` has a five
          point bound, as its baseline (often 5-20%) varies with traffic far more.
        - ``alpha`` 0.01 everywhere: with eight metrics tested per bake, 0.05 would flag one
          metric in three bakes of equal versions.
        """
        return cls(metrics=tuple(_DEFAULT_METRICS.values()))

    def metric(self, name: str) -> MetricPolicy:
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "metrics": [m.to_dict() for m in self.metrics],
            "pass_score": self.pass_score,
            "marginal_score": self.marginal_score,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CanaryPolicy:
        """Parse and validate stored or submitted JSON; every error is a :class:`PolicyError`
        naming its field. ``metrics`` left out means the platform default's."""
        if not isinstance(data, Mapping):
            raise PolicyError("policy", "must be an object")
        for key in data:
            if key not in ("metrics", "pass_score", "marginal_score"):
                raise PolicyError(key, "unknown field")
        default = cls.default()
        raw_metrics = data.get("metrics")
        if raw_metrics is None:
            metrics = default.metrics
        elif isinstance(raw_metrics, list | tuple):
            metrics = tuple(
                MetricPolicy.from_dict(m, f"metrics[{i}]") for i, m in enumerate(raw_metrics)
            )
        else:
            raise PolicyError("metrics", "must be a list")
        policy = cls(
            metrics=metrics,
            pass_score=data.get("pass_score", default.pass_score),
            marginal_score=data.get("marginal_score", default.marginal_score),
        )
        policy.validate()
        return policy

    def validate(self) -> None:
        """Raise :class:`PolicyError` naming the first bad field."""
        if not self.metrics:
            raise PolicyError("metrics", "at least one metric is needed")
        seen: set[str] = set()
        for i, metric in enumerate(self.metrics):
            metric.validate(f"metrics[{i}]")
            if metric.name in seen:
                raise PolicyError(f"metrics[{i}].name", f"{metric.name} is listed twice")
            seen.add(metric.name)
        if all(m.report_only for m in self.metrics):
            raise PolicyError("metrics", "at least one metric must be scored (not report_only)")
        for name in ("pass_score", "marginal_score"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value <= 100:
                raise PolicyError(name, "must be a number from 0 to 100")
        if self.marginal_score > self.pass_score:
            raise PolicyError("marginal_score", "must not be above pass_score")


@dataclass(frozen=True)
class MetricVerdict:
    """One metric's verdict and the numbers behind it. Latency fields are None for a rate
    metric and the other way round; ``p_value`` is the one-sided p-value in the bad direction
    (two-sided for direction "either")."""

    name: str
    kind: Kind
    verdict: Verdict
    reason: str
    baseline_count: int
    canary_count: int
    p_value: float | None = None
    # latency
    baseline_p50: float | None = None
    canary_p50: float | None = None
    baseline_p99: float | None = None
    canary_p99: float | None = None
    baseline_mean: float | None = None
    canary_mean: float | None = None
    ratio: float | None = None
    hodges_lehmann: float | None = None
    # rate
    baseline_events: int | None = None
    canary_events: int | None = None
    baseline_rate: float | None = None
    canary_rate: float | None = None
    difference: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: an infinite ratio (a baseline statistic of zero) becomes None."""
        return {k: _json_number(v) for k, v in asdict(self).items()}


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _classify(significant: bool, beyond: bool) -> Verdict:
    if significant and beyond:
        return "fail"
    if significant or beyond:
        return "marginal"
    return "pass"


def _nodata_reason(policy: MetricPolicy, baseline: int, canary: int, what: str) -> str:
    return (
        f"{baseline} baseline and {canary} canary {what}; {policy.min_samples} needed on each side"
    )


def _format_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _format_value(value: float, unit: str) -> str:
    return f"{value:.3g}{unit}"


def _alternative(direction: Direction) -> Literal["greater", "less", "two-sided"]:
    """The alternative hypothesis of canary against baseline that is bad news."""
    if direction == "increase":
        return "greater"
    if direction == "decrease":
        return "less"
    return "two-sided"


def _beyond(change: float, bound: float, direction: Direction) -> bool:
    """Whether a change (canary minus baseline, relative or absolute) passes the bound in the
    bad direction."""
    if direction == "increase":
        return change > bound
    if direction == "decrease":
        return -change > bound
    return abs(change) > bound


def hodges_lehmann(baseline: np.ndarray, canary: np.ndarray) -> float:
    """The median of all pairwise differences canary - baseline: the shift estimate that goes
    with the Mann-Whitney test (robust to the outliers latency samples always have). Over a
    seeded random subset of pairs when there are more than :data:`MAX_HL_PAIRS`, so the same
    data always give the same estimate."""
    n, m = len(baseline), len(canary)
    if n * m <= MAX_HL_PAIRS:
        return float(np.median(np.subtract.outer(canary, baseline)))
    rng = np.random.default_rng(0)
    i = rng.integers(0, n, MAX_HL_PAIRS)
    j = rng.integers(0, m, MAX_HL_PAIRS)
    return float(np.median(canary[j] - baseline[i]))


def _statistic(values: np.ndarray, statistic: Statistic) -> float:
    return float(np.percentile(values, 50 if statistic == "p50" else 99))


def _ratio(canary: float, baseline: float) -> float:
    if baseline == 0:
        return 1.0 if canary == 0 else math.inf
    return canary / baseline


def _mann_whitney_p(baseline: np.ndarray, canary: np.ndarray, direction: Direction) -> float:
    """scipy's p-value; 1.0 when every value on both sides is the same (the test statistic's
    variance is then zero and scipy answers NaN), since no difference is no evidence."""
    if np.all(baseline == baseline[0]) and np.all(canary == baseline[0]):
        return 1.0
    from scipy import stats  # here, not at the top: see the module docstring

    result = stats.mannwhitneyu(canary, baseline, alternative=_alternative(direction))
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else p


def judge_latency(policy: MetricPolicy, baseline: Samples, canary: Samples) -> MetricVerdict:
    """Judge a latency-type metric: Mann-Whitney on the samples for significance, the ratio of
    ``policy.statistic`` (canary / baseline) against ``max_change`` for the effect."""
    base = np.asarray(baseline, dtype=float)
    can = np.asarray(canary, dtype=float)
    if len(base) < policy.min_samples or len(can) < policy.min_samples:
        reason = _nodata_reason(policy, len(base), len(can), "samples")
        return MetricVerdict(policy.name, "latency", "nodata", reason, len(base), len(can))
    p = _mann_whitney_p(base, can, policy.direction)
    ratio = _ratio(_statistic(can, policy.statistic), _statistic(base, policy.statistic))
    verdict = _classify(p < policy.alpha, _beyond(ratio - 1, policy.max_change, policy.direction))
    numbers = {
        "baseline_p50": float(np.median(base)),
        "canary_p50": float(np.median(can)),
        "baseline_p99": _statistic(base, "p99"),
        "canary_p99": _statistic(can, "p99"),
        "baseline_mean": float(base.mean()),
        "canary_mean": float(can.mean()),
    }
    reason = _latency_reason(policy, verdict, ratio, p, numbers)
    return MetricVerdict(
        policy.name,
        "latency",
        verdict,
        reason,
        len(base),
        len(can),
        p_value=p,
        baseline_p50=numbers["baseline_p50"],
        canary_p50=numbers["canary_p50"],
        baseline_p99=numbers["baseline_p99"],
        canary_p99=numbers["canary_p99"],
        baseline_mean=numbers["baseline_mean"],
        canary_mean=numbers["canary_mean"],
        ratio=ratio,
        hodges_lehmann=hodges_lehmann(base, can),
    )


def _latency_reason(
    policy: MetricPolicy, verdict: Verdict, ratio: float, p: float, numbers: dict[str, float]
) -> str:
    unit = UNITS.get(policy.name, "")
    stat = policy.statistic
    canary = _format_value(numbers[f"canary_{stat}"], unit)
    baseline = _format_value(numbers[f"baseline_{stat}"], unit)
    change = "+inf%" if math.isinf(ratio) else f"{(ratio - 1) * 100:+.0f}%"
    head = f"{stat} {canary} vs {baseline} ({change}, {_format_p(p)})"
    bound = f"{policy.max_change * 100:.0f}%"
    return f"{head}: {_conclusion(verdict, p, policy, bound)}"


def _conclusion(verdict: Verdict, p: float, policy: MetricPolicy, bound: str) -> str:
    """Which of the two conditions held; for direction "either" a change is not "worse", it is
    a change."""
    worse = "changed more" if policy.direction == "either" else "worse"
    if verdict == "fail":
        return f"{worse} than the {bound} allowed"
    if verdict == "pass":
        return f"within the {bound} allowed"
    if p < policy.alpha:
        significantly = (
            "significantly changed" if policy.direction == "either" else "significantly worse"
        )
        return f"{significantly}, but within the {bound} allowed"
    return f"beyond the {bound} allowed, but not significant at alpha {policy.alpha:g}"


def judge_rate(
    policy: MetricPolicy,
    baseline_events: int,
    baseline_total: int,
    canary_events: int,
    canary_total: int,
) -> MetricVerdict:
    """Judge a rate-type metric: Fisher's exact test on the 2x2 table for significance (exact,
    so it holds for the small counts of rare events where the normal approximation of a
    two-proportion z-test does not), the difference of rates against ``max_change`` for the
    effect."""
    for label, events, total in (
        ("baseline", baseline_events, baseline_total),
        ("canary", canary_events, canary_total),
    ):
        if total < 0 or not 0 <= events <= total:
            raise ValueError(f"{label}: {events} events out of {total} is not a count")
    counts = {
        "baseline_count": int(baseline_total),
        "canary_count": int(canary_total),
        "baseline_events": int(baseline_events),
        "canary_events": int(canary_events),
    }
    if baseline_total < policy.min_samples or canary_total < policy.min_samples:
        reason = _nodata_reason(policy, baseline_total, canary_total, "requests")
        return MetricVerdict(policy.name, "rate", "nodata", reason, **counts)
    table = [
        [canary_events, canary_total - canary_events],
        [baseline_events, baseline_total - baseline_events],
    ]
    from scipy import stats  # here, not at the top: see the module docstring

    p = float(stats.fisher_exact(table, alternative=_alternative(policy.direction)).pvalue)
    base_rate = baseline_events / baseline_total
    can_rate = canary_events / canary_total
    diff = can_rate - base_rate
    verdict = _classify(p < policy.alpha, _beyond(diff, policy.max_change, policy.direction))
    points = policy.max_change * 100
    bound = f"{points:g} point" if points == 1 else f"{points:g} points"
    reason = (
        f"{can_rate:.2%} vs {base_rate:.2%} ({diff * 100:+.2f} points, {_format_p(p)}): "
        f"{_conclusion(verdict, p, policy, bound)}"
    )
    return MetricVerdict(
        policy.name,
        "rate",
        verdict,
        reason,
        p_value=p,
        baseline_rate=base_rate,
        canary_rate=can_rate,
        difference=diff,
        **counts,
    )


@dataclass
class Observations:
    """One side's observations over a bake: per-request samples of the latency-type metrics
    (name -> values) and (events, total requests) of the rate-type ones. A metric missing is
    judged as having no data."""

    samples: dict[str, Samples] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> Observations:
        """One side's observations from the serving front end's per-request records
        (``serving.frontend.observations.Observation`` as its ``/observations`` serves them).

        Latency-type samples come from answered requests (status 200) only: a refused request's
        time says nothing of the model's speed. ``error_rate`` counts server-side failures
        (5xx) of all requests; a caller's bad request (4xx) or one the caller left (499) is
        not the version's fault. The other rates are over answered requests;
        ``schema_invalid_rate`` over those that asked for structured output."""
        answered = [r for r in records if r.get("status") == 200]
        samples: dict[str, Samples] = {
            name: [float(r[name]) for r in answered if r.get(name) is not None]
            for name in ("ttft_s", "latency_s", "tpot_s", "completion_tokens")
        }
        failed = sum(1 for r in records if int(r.get("status", 0)) >= 500)
        judged = [r for r in records if r.get("status") == 200 or int(r.get("status", 0)) >= 500]
        structured = [r for r in answered if r.get("structured_valid") is not None]
        counts = {
            "error_rate": (failed, len(judged)),
            "empty_rate": (sum(1 for r in answered if r.get("empty")), len(answered)),
            "length_stop_rate": (
                sum(1 for r in answered if r.get("finish_reason") == "length"),
                len(answered),
            ),
            "schema_invalid_rate": (
                sum(1 for r in structured if r["structured_valid"] is False),
                len(structured),
            ),
        }
        return cls(samples=samples, counts=counts)


@dataclass(frozen=True)
class Analysis:
    """A bake's judgement.

    ``score`` is Kayenta-style: the share of scored metrics that passed, in percent. Unlike
    Kayenta, which has no "marginal", a marginal metric counts as three quarters of a pass
    (``_POINTS``): it met one of the two conditions of a fail, so it is neither clean nor
    proven bad. Report-only and nodata metrics are left out of it; it is
    None when no scored metric has data.
    """

    verdicts: tuple[MetricVerdict, ...]
    score: float | None
    decision: Decision
    reason: str

    def verdict(self, name: str) -> MetricVerdict:
        for verdict in self.verdicts:
            if verdict.name == name:
                return verdict
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdicts": [v.to_dict() for v in self.verdicts],
            "score": self.score,
            "decision": self.decision,
            "reason": self.reason,
        }


#: A marginal metric counts three quarters of a pass: with the default eight metrics and
#: ``pass_score`` 95, one marginal alone still promotes (96.9) and two hold (93.8). Half a
#: pass held equal versions in about 7% of bakes (one of eight metrics at alpha 0.01 is
#: marginal that often by chance), which would make every fourteenth rollout wait for a person.
_POINTS: dict[str, float] = {"pass": 1.0, "marginal": 0.75, "fail": 0.0}


def _judge_metric(
    metric: MetricPolicy, baseline: Observations, canary: Observations
) -> MetricVerdict:
    if metric.kind == "latency":
        return judge_latency(
            metric, baseline.samples.get(metric.name, ()), canary.samples.get(metric.name, ())
        )
    base_events, base_total = baseline.counts.get(metric.name, (0, 0))
    can_events, can_total = canary.counts.get(metric.name, (0, 0))
    return judge_rate(metric, base_events, base_total, can_events, can_total)


def score(verdicts: Sequence[MetricVerdict]) -> float | None:
    """Kayenta's score over the given (scored) verdicts; nodata ones are left out."""
    judged = [v for v in verdicts if v.verdict != "nodata"]
    if not judged:
        return None
    return 100.0 * sum(_POINTS[v.verdict] for v in judged) / len(judged)


def judge(policy: CanaryPolicy, baseline: Observations, canary: Observations) -> Analysis:
    """Judge a bake and decide.

    In order: a critical metric that fails rolls back, whatever the others say (enough
    evidence of harm needs no more data); any scored metric without enough data gives
    ``not_enough_data``, never a pass on what was measured so far; the caller then extends the
    bake, up to its cap, and holds (a person decides) if the data still do not come. Otherwise
    the score decides: at least ``pass_score`` promotes, under ``marginal_score`` rolls back,
    and in between holds.
    """
    verdicts = tuple(_judge_metric(m, baseline, canary) for m in policy.metrics)
    scored = [v for m, v in zip(policy.metrics, verdicts, strict=True) if not m.report_only]
    critical = [
        v
        for m, v in zip(policy.metrics, verdicts, strict=True)
        if m.critical and v.verdict == "fail"
    ]
    value = score(scored)
    if critical:
        return Analysis(verdicts, value, "rollback", _reason("critical metric failed", critical))
    missing = [v for v in scored if v.verdict == "nodata"]
    if missing:
        return Analysis(verdicts, value, "not_enough_data", _reason("not enough data", missing))
    if value is None:  # a policy that skipped validate() and scores nothing
        return Analysis(verdicts, None, "not_enough_data", "no scored metric")
    bad = [v for v in scored if v.verdict in ("fail", "marginal")]
    if value >= policy.pass_score:
        decision: Decision = "promote"
        head = f"score {value:.0f} >= {policy.pass_score:g}"
    elif value < policy.marginal_score:
        decision = "rollback"
        head = f"score {value:.0f} < {policy.marginal_score:g}"
    else:
        decision = "hold"
        head = f"score {value:.0f} between {policy.marginal_score:g} and {policy.pass_score:g}"
    return Analysis(verdicts, value, decision, _reason(head, bad) if bad else head)


def _reason(head: str, verdicts: Sequence[MetricVerdict]) -> str:
    named = "; ".join(f"{v.name} {v.verdict}: {v.reason}" for v in verdicts)
    return f"{head}: {named}" if named else head
