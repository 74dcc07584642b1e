"""Reading one serving instance's unified ``/metrics`` into the few numbers the portal charts
and judges rollouts by.

Everything is summed over label sets (models, engines, failure reasons), because the portal
looks at an instance as a whole. Counters and histograms stay cumulative here: what happened
*between* two readings is :meth:`Snapshot.since`, so a reading can be stored and compared with
the next one, in another process, minutes later. No Django: the rollout controller, the
metrics task and tests all use it as plain Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from portal.metrics import buckets as bk

DEFAULT_TIMEOUT_SECONDS = 2.0

#: Counter families → Snapshot field. Names as the instance exposes them, without ``_total``.
COUNTERS = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "nv_inference_request_success": "request_success",
    "nv_inference_request_failure": "request_failure",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}
#: Gauge families → Snapshot field. KV-cache usage is the highest over label sets (engines);
#: requests running and waiting add up.
GAUGES = {
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
}
_SUMMED_GAUGES = ("requests_running", "requests_waiting")
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:e2e_request_latency_seconds": "e2e",
}


class ScrapeError(Exception):
    """An instance's metrics could not be read; the message says why, for the page and logs."""


@dataclass(frozen=True)
class Histogram:
    """A latency histogram: cumulative counts per upper bound (``+Inf`` included)."""

    buckets: Mapping[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def since(self, earlier: Histogram) -> Histogram:
        return Histogram(
            bk.subtract(self.buckets, earlier.buckets),
            max(0.0, self.count - earlier.count),
            max(0.0, self.sum - earlier.sum),
        )

    def quantile(self, q: float) -> float | None:
        return bk.quantile(self.buckets, q)

    def to_json(self) -> dict[str, Any]:
        return {"buckets": bk.to_json(self.buckets), "count": self.count, "sum": self.sum}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Histogram:
        data = data or {}
        return cls(
            bk.from_json(data.get("buckets")),
            float(data.get("count", 0.0)),
            float(data.get("sum", 0.0)),
        )


_COUNTER_FIELDS = tuple(COUNTERS.values())
_HISTOGRAM_FIELDS = tuple(HISTOGRAMS.values())


@dataclass(frozen=True)
class Snapshot:
    """One reading of an instance (cumulative), or what happened between two (see
    :meth:`since`). ``kv_cache_usage`` is a gauge: the reading's own value either way."""

    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    request_success: float = 0.0
    request_failure: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    kv_cache_usage: float | None = None
    #: Requests in the engine now (gauges: the reading's own values, as ``kv_cache_usage``);
    #: what the autoscaler reads (:mod:`portal.deployments.state.autoscaling`).
    requests_running: float = 0.0
    requests_waiting: float = 0.0
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)

    @property
    def requests(self) -> float:
        return self.request_success + self.request_failure

    def restarted_since(self, earlier: Snapshot) -> bool:
        """Whether the counters went back: the instance's process started over in between. One
        process writes all of them, so one counter going back means they all did."""
        if any(getattr(self, name) < getattr(earlier, name) for name in _COUNTER_FIELDS):
            return True
        return any(getattr(self, h).count < getattr(earlier, h).count for h in _HISTOGRAM_FIELDS)

    def since(self, earlier: Snapshot) -> Snapshot:
        """What happened between ``earlier`` and this reading. After a restart the counters
        began again from zero, so everything they hold now happened since."""
        if self.restarted_since(earlier):
            return self
        changes: dict[str, Any] = {
            name: getattr(self, name) - getattr(earlier, name) for name in _COUNTER_FIELDS
        }
        for name in _HISTOGRAM_FIELDS:
            changes[name] = getattr(self, name).since(getattr(earlier, name))
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _HISTOGRAM_FIELDS:
            data[name] = getattr(self, name).to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        values: dict[str, Any] = {name: float(data.get(name, 0.0)) for name in _COUNTER_FIELDS}
        usage = data.get("kv_cache_usage")
        values["kv_cache_usage"] = None if usage is None else float(usage)
        for name in _SUMMED_GAUGES:
            values[name] = float(data.get(name, 0.0))
        for name in _HISTOGRAM_FIELDS:
            values[name] = Histogram.from_json(data.get(name))
        return cls(**values)


def _family_name(name: str) -> str:
    # The parser strips ``_total`` from typed counters; an untyped family keeps its sample name.
    return name.removesuffix("_total")


def _read(text: str) -> tuple[Snapshot, set[str]]:
    """The snapshot and which of the families it reads were present. ``ValueError`` when
    prometheus-client's parser refuses the text."""
    counters = dict.fromkeys(_COUNTER_FIELDS, 0.0)
    usage: float | None = None
    added = dict.fromkeys(_SUMMED_GAUGES, 0.0)
    histograms: dict[str, dict[tuple, bk.Buckets]] = {h: {} for h in _HISTOGRAM_FIELDS}
    counts = dict.fromkeys(_HISTOGRAM_FIELDS, 0.0)
    sums = dict.fromkeys(_HISTOGRAM_FIELDS, 0.0)
    has_count = dict.fromkeys(_HISTOGRAM_FIELDS, False)
    found: set[str] = set()
    for family in text_string_to_metric_families(text):
        name = _family_name(family.name)
        if name in COUNTERS:
            found.add(name)
            key = COUNTERS[name]
            for sample in family.samples:
                if sample.name in (name, f"{name}_total"):
                    counters[key] += sample.value
        elif name in GAUGES:
            found.add(name)
            key = GAUGES[name]
            for sample in family.samples:
                if sample.name != family.name or math.isnan(sample.value):
                    continue
                if key in added:
                    added[key] += sample.value
                else:
                    usage = sample.value if usage is None else max(usage, sample.value)
        elif name in HISTOGRAMS:
            found.add(name)
            key = HISTOGRAMS[name]
            for sample in family.samples:
                if sample.name == f"{name}_bucket":
                    series = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                    bound = float(sample.labels["le"])
                    histograms[key].setdefault(series, {})[bound] = sample.value
                elif sample.name == f"{name}_count":
                    counts[key] += sample.value
                    has_count[key] = True
                elif sample.name == f"{name}_sum":
                    sums[key] += sample.value
    merged: dict[str, Histogram] = {}
    for key, per_series in histograms.items():
        summed = bk.merge(per_series.values())
        count = counts[key] if has_count[key] else bk.total(summed)
        merged[key] = Histogram(summed, count, sums[key])
    values: dict[str, Any] = {**counters, "kv_cache_usage": usage, **added, **merged}
    return Snapshot(**values), found


def parse_exposition(text: str) -> Snapshot:
    """The instance's numbers, summed over label sets; families it lacks read as zero (no
    requests yet). Raises ``ValueError`` when the text is not a Prometheus exposition."""
    return _read(text)[0]


def fetch_snapshot(url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Snapshot:
    """Read ``url`` once. Raises :class:`ScrapeError` saying what went wrong: a timeout, a
    refused connection, an answer other than 200, or an answer that is not serving metrics."""
    try:
        answer = httpx.get(url, timeout=timeout)
    except httpx.TimeoutException:
        raise ScrapeError(f"no answer from {url} within {timeout:g} s") from None
    except httpx.ConnectError as exc:
        raise ScrapeError(f"cannot connect to {url}: {exc}") from None
    except httpx.HTTPError as exc:
        raise ScrapeError(f"reading {url} failed: {type(exc).__name__}: {exc}") from None
    if answer.status_code != 200:
        raise ScrapeError(f"{url} answered HTTP {answer.status_code}, not 200")
    try:
        snapshot, found = _read(answer.text)
    except ValueError as exc:
        raise ScrapeError(
            f"{url} answered text that is not a Prometheus exposition: {exc}"
        ) from None
    if not found:
        raise ScrapeError(f"{url} answered an exposition without any serving metrics")
    return snapshot
