"""The custom metrics a model creates with ``pb_utils.MetricFamily``, kept in the server.

Triton keeps them in the server's registry (the model only holds handles), so they survive as
long as the model is loaded and read the same whichever instance updated them. Here too: the
stub forwards every operation and the values live in :class:`CustomMetrics`, which renders
them as Prometheus text the way Triton's endpoint does (counters keep their own name, no
``_total``), valid for prometheus-client's parser.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
_KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}


class MetricError(ValueError):
    """An operation Triton refuses (the message is what the model sees)."""


@dataclass
class _Series:
    labels: tuple[tuple[str, str], ...]
    value: float = 0.0
    buckets: list[float] = field(default_factory=list)
    bucket_counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0
    refs: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: int
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)
    refs: int = 0


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class CustomMetrics:
    """Families and series of one model, addressed by the ids the stub holds."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}
        self._family_ids: dict[int, _Family] = {}
        self._metric_ids: dict[int, tuple[_Family, _Series]] = {}
        self._next_id = 1

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def create_family(self, name: str, description: str, kind: int) -> int:
        if not _NAME.match(name):
            raise MetricError(f"invalid metric family name '{name}'")
        if kind not in _KIND_NAMES:
            raise MetricError("Unsupported kind passed to MetricFamily constructor.")
        family = self._families.get(name)
        if family is None:
            family = _Family(name, description, kind)
            self._families[name] = family
        elif family.kind != kind or family.description != description:
            raise MetricError(
                f"metric family '{name}' already exists with a different kind or description"
            )
        family.refs += 1
        family_id = self._new_id()
        self._family_ids[family_id] = family
        return family_id

    def create_metric(
        self, family_id: int, labels: list[tuple[str, str]], buckets: list[float] | None
    ) -> int:
        family = self._family_ids.get(family_id)
        if family is None:
            raise MetricError("the MetricFamily has been deleted")
        for key, _ in labels:
            if not _LABEL.match(key) or key.startswith("__"):
                raise MetricError(f"invalid label name '{key}'")
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("Bucket boundaries not found in Metric args.")
            if sorted(buckets) != buckets or len(set(buckets)) != len(buckets):
                raise MetricError("histogram buckets must be strictly increasing")
        elif buckets is not None:
            raise MetricError("Metric args not set to histogram kind.")
        series_key = tuple(sorted(labels))
        series = family.series.get(series_key)
        if series is None:
            series = _Series(series_key)
            if buckets is not None:
                series.buckets = list(buckets)
                series.bucket_counts = [0] * len(buckets)
            family.series[series_key] = series
        series.refs += 1
        metric_id = self._new_id()
        self._metric_ids[metric_id] = (family, series)
        return metric_id

    def _metric(self, metric_id: int) -> tuple[_Family, _Series]:
        found = self._metric_ids.get(metric_id)
        if found is None:
            raise MetricError("Metric has been invalidated.")
        return found

    def increment(self, metric_id: int, value: float) -> None:
        family, series = self._metric(metric_id)
        if family.kind == HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
        if family.kind == COUNTER and value < 0:
            raise MetricError(
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                "non-negative values."
            )
        series.value += value

    def set(self, metric_id: int, value: float) -> None:
        family, series = self._metric(metric_id)
        if family.kind != GAUGE:
            raise MetricError(
                f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[family.kind].upper()} does not support Set"
            )
        series.value = value

    def observe(self, metric_id: int, value: float) -> None:
        family, series = self._metric(metric_id)
        if family.kind != HISTOGRAM:
            raise MetricError(
                f"TRITONSERVER_METRIC_KIND_{_KIND_NAMES[family.kind].upper()} does not support "
                "Observe"
            )
        for i, bound in enumerate(series.buckets):
            if value <= bound:
                series.bucket_counts[i] += 1
        series.sum += value
        series.count += 1

    def value(self, metric_id: int) -> float:
        family, series = self._metric(metric_id)
        if family.kind == HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
        return series.value

    def delete_metric(self, metric_id: int) -> None:
        found = self._metric_ids.pop(metric_id, None)
        if found is None:
            return
        family, series = found
        series.refs -= 1
        if series.refs <= 0:
            family.series.pop(series.labels, None)

    def delete_family(self, family_id: int) -> None:
        family = self._family_ids.pop(family_id, None)
        if family is None:
            return
        family.refs -= 1
        if family.refs <= 0:
            self._families.pop(family.name, None)

    def clear(self) -> None:
        """The model's process is gone: its families go with it, as at unload in Triton."""
        self._families.clear()
        self._family_ids.clear()
        self._metric_ids.clear()

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families.values():
            lines.append(f"# HELP {family.name} {family.description.replace(chr(10), ' ')}")
            lines.append(f"# TYPE {family.name} {_KIND_NAMES[family.kind]}")
            for series in family.series.values():
                if family.kind == HISTOGRAM:
                    for bound, count in zip(series.buckets, series.bucket_counts, strict=True):
                        labels = _labels(series.labels, ("le", _number(bound)))
                        lines.append(f"{family.name}_bucket{labels} {count}")
                    labels = _labels(series.labels, ("le", "+Inf"))
                    lines.append(f"{family.name}_bucket{labels} {series.count}")
                    lines.append(f"{family.name}_sum{_labels(series.labels)} {_number(series.sum)}")
                    lines.append(f"{family.name}_count{_labels(series.labels)} {series.count}")
                else:
                    lines.append(f"{family.name}{_labels(series.labels)} {_number(series.value)}")
        return "\n".join(lines) + ("\n" if lines else "")


def _labels(pairs: tuple[tuple[str, str], ...], extra: tuple[str, str] | None = None) -> str:
    items = [*pairs, *([extra] if extra else [])]
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"
