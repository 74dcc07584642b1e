"""Cumulative histogram buckets (upper bound → observations at or below it) as plain dicts.

They are kept as dicts rather than Prometheus objects so that the same few rules serve the
scraper (one instance), a scrape pass (an interval's deltas merged over instances) and the
charts (several deployments merged): subtracting and summing cumulative counts per bound is
exact, and a quantile is computed only at the very end, from the merged counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

Buckets = dict[float, float]


def le_key(bound: float) -> str:
    """How a bound is written in JSON (which has no infinity): Prometheus' own ``+Inf``."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def to_json(buckets: Mapping[float, float]) -> dict[str, float]:
    return {le_key(bound): float(count) for bound, count in sorted(buckets.items())}


def from_json(data: Mapping[str, float] | None) -> Buckets:
    return {float(bound): float(count) for bound, count in (data or {}).items()}


def count_at(buckets: Mapping[float, float], bound: float) -> float:
    """Observations at or below ``bound``, as far as these buckets can tell (the count at the
    largest bound not above it): exact when both sides use the same bounds, which every
    instance of one engine does, and never more than the truth when they do not."""
    best: float | None = None
    count = 0.0
    for upper, value in buckets.items():
        if upper <= bound and (best is None or upper > best):
            best, count = upper, value
    return count


def merge(many: Iterable[Mapping[float, float]]) -> Buckets:
    """The sum of several cumulative histograms, over the union of their bounds."""
    parts = [b for b in many if b]
    bounds = sorted({bound for b in parts for bound in b})
    return {bound: sum(count_at(b, bound) for b in parts) for bound in bounds}


def subtract(new: Mapping[float, float], old: Mapping[float, float]) -> Buckets:
    """What was observed between two readings of one histogram (never negative)."""
    return {bound: max(0.0, count - count_at(old, bound)) for bound, count in sorted(new.items())}


def total(buckets: Mapping[float, float]) -> float:
    """All observations: the count of the largest (``+Inf``) bucket."""
    return buckets[max(buckets)] if buckets else 0.0


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """The ``q``-quantile by linear interpolation inside the bucket that holds it, the way
    Prometheus' ``histogram_quantile`` does (the lowest bucket starts at 0; a quantile that
    falls in the ``+Inf`` bucket is the largest finite bound). None without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within 0..1, got {q}")
    observed = total(buckets)
    if observed <= 0:
        return None
    rank = q * observed
    lower, below = 0.0, 0.0
    for bound in sorted(buckets):
        count = buckets[bound]
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            if bound <= lower:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower
