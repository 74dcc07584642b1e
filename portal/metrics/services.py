"""Scraping live instances into per-deployment points, and reading them back for charts.

One scrape pass reads every live instance once, in parallel, and writes one point per
deployment, all stamped with the pass's start so that the points of several deployments line
up when a model's page merges them. A source that fails is recorded as down with its reason
and keeps its last good reading; one bad instance never stops the pass.

Each point also keeps the same values per model version (instances know their version), so
that during a rollout the canary can be charted next to the version it replaces; and the
deployments' timeline gives the charts their marks (deploys, stage changes, rollbacks).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from portal.deployments.models import (
    LIVE_STATES,
    Deployment,
    DeploymentEvent,
    EventKind,
    Instance,
    InstanceState,
    ObservedState,
)
from portal.metrics import buckets as bk
from portal.metrics.models import MetricPoint, MetricSource
from portal.metrics.scrape import ScrapeError, Snapshot, fetch_snapshot

logger = logging.getLogger(__name__)

#: Instance states in which an instance has (or is about to have) a ``/metrics`` worth reading.
SCRAPED_STATES = (
    InstanceState.STARTING,
    InstanceState.READY,
    InstanceState.UNHEALTHY,
    InstanceState.DRAINING,
)
MAX_PARALLEL_SCRAPES = 8

RATE_FIELDS = ("prompt_tokens_per_s", "generation_tokens_per_s", "requests_per_s", "errors_per_s")
QUANTILES = {
    "ttft_p50": ("ttft", 0.5),
    "ttft_p99": ("ttft", 0.99),
    "e2e_p50": ("e2e", 0.5),
    "e2e_p99": ("e2e", 0.99),
}
#: How many instances were ready and how many the deployment wanted (0 asleep), per pass:
#: merged, they add up over deployments (a model's total) and average over a bin's passes.
REPLICA_FIELDS = ("ready_instances", "wanted_replicas")
#: Every value a point (and a merged series entry) carries besides ``at``.
VALUE_FIELDS = (
    *RATE_FIELDS,
    *QUANTILES,
    "kv_cache_usage",
    "prefix_cache_hit_rate",
    *REPLICA_FIELDS,
)
COUNT_FIELDS = ("sources_up", "sources_down")


#: The windows the charts offer, by the ``range`` the API takes, in minutes.
RANGES: dict[str, int] = {"15m": 15, "1h": 60, "6h": 360, "24h": 1440}
#: The most entries a chart's series gets; longer windows average passes into bins.
MAX_CHART_POINTS = 720
#: A marker's label is the event's message, cut to this many characters.
MARKER_LABEL_CHARS = 120


@dataclass(frozen=True)
class Chart:
    """One chart the pages draw: which point fields it plots, under which labels.

    Points keep SI units (seconds); ``factor`` turns them into ``unit`` for people (latency
    in ms reads "p50 3.5", not "0.0035")."""

    key: str
    title: str
    unit: str
    lines: tuple[tuple[str, str], ...]
    factor: float = 1.0


CHARTS: tuple[Chart, ...] = (
    Chart(
        "tokens",
        "Tokens",
        "tokens/s",
        (("prompt_tokens_per_s", "prompt"), ("generation_tokens_per_s", "generation")),
    ),
    Chart(
        "requests",
        "Requests",
        "req/s",
        (("requests_per_s", "requests"), ("errors_per_s", "errors")),
    ),
    # Next to the load: the instances ready, and the count the autoscaler wanted (0 asleep).
    Chart(
        "replicas",
        "Replicas",
        "instances",
        (("ready_instances", "ready"), ("wanted_replicas", "wanted")),
    ),
    Chart(
        "ttft",
        "Time to first token",
        "ms",
        (("ttft_p50", "p50"), ("ttft_p99", "p99")),
        factor=1000.0,
    ),
    Chart(
        "e2e", "End-to-end latency", "ms", (("e2e_p50", "p50"), ("e2e_p99", "p99")), factor=1000.0
    ),
    Chart("kv_cache", "KV-cache usage", "fraction", (("kv_cache_usage", "usage"),)),
    Chart(
        "prefix_cache",
        "Prefix-cache hit rate",
        "fraction",
        (("prefix_cache_hit_rate", "hit rate"),),
    ),
)


@dataclass(frozen=True)
class SourceStatus:
    instance: str
    version: int
    url: str
    up: bool
    error: str
    last_scraped_at: datetime | None


@dataclass(frozen=True)
class ScrapeReport:
    at: datetime
    scraped: int
    up: int
    down: int
    points: int
    points_pruned: int
    sources_pruned: int
    errors: dict[str, str] = field(default_factory=dict)  # instance name → reason


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


# --- scraping ----------------------------------------------------------------------------------


def _read(url: str, timeout: float) -> Snapshot | str:
    """A reading, or why there is none. Anything unexpected is a reason too: the pass goes on."""
    try:
        return fetch_snapshot(url, timeout=timeout)
    except ScrapeError as exc:
        return str(exc)
    except Exception as exc:
        logger.exception("scraping %s failed unexpectedly", url)
        return f"scraping {url} failed: {type(exc).__name__}: {exc}"


@dataclass
class _Interval:
    """A deployment's instances over one pass: readings' deltas and per-second rates."""

    up: int = 0
    down: int = 0
    rates: dict[str, float] = field(default_factory=dict)
    has_rates: bool = False
    ttft: list[bk.Buckets] = field(default_factory=list)
    e2e: list[bk.Buckets] = field(default_factory=list)
    usages: list[float] = field(default_factory=list)
    queries: float = 0.0
    hits: float = 0.0
    #: Instances ready at the pass (whether or not their ``/metrics`` answered), and the
    #: replicas wanted: None where not known (a version has no count of its own).
    ready: int | None = None
    wanted: int | None = None
    #: The same, per model version number (only on a deployment's interval, not nested).
    versions: dict[int, _Interval] = field(default_factory=dict)

    def of_version(self, number: int) -> _Interval:
        return self.versions.setdefault(number, _Interval())

    def add_up(self, now: Snapshot, delta: Snapshot | None, seconds: float) -> None:
        self.up += 1
        if now.kv_cache_usage is not None:
            self.usages.append(now.kv_cache_usage)
        if delta is None or seconds <= 0:
            return
        # Per instance over its own interval: an instance whose last good reading is older
        # (it was down for a pass) is averaged over that longer gap.
        per_second = {
            "prompt_tokens_per_s": delta.prompt_tokens,
            "generation_tokens_per_s": delta.generation_tokens,
            "requests_per_s": delta.requests,
            "errors_per_s": delta.request_failure,
        }
        for name, amount in per_second.items():
            self.rates[name] = self.rates.get(name, 0.0) + amount / seconds
        self.has_rates = True
        self.ttft.append(dict(delta.ttft.buckets))
        self.e2e.append(dict(delta.e2e.buckets))
        self.queries += delta.prefix_cache_queries
        self.hits += delta.prefix_cache_hits

    def values(self) -> dict[str, Any]:
        """The interval's value fields, counts and bucket deltas (JSON-ready)."""
        ttft, e2e = bk.merge(self.ttft), bk.merge(self.e2e)
        values: dict[str, Any] = dict.fromkeys(VALUE_FIELDS)
        if self.has_rates:
            values.update(self.rates)
            values.update(_quantiles({"ttft": ttft, "e2e": e2e}))
            values["prefix_cache_hit_rate"] = self.hits / self.queries if self.queries > 0 else None
        if self.usages:
            values["kv_cache_usage"] = sum(self.usages) / len(self.usages)
        values.update(ready_instances=self.ready, wanted_replicas=self.wanted)
        values.update(
            sources_up=self.up,
            sources_down=self.down,
            ttft_buckets=bk.to_json(ttft),
            e2e_buckets=bk.to_json(e2e),
        )
        return values

    def point(self, deployment_id: int, at: datetime) -> MetricPoint:
        by_version = {str(n): self.versions[n].values() for n in sorted(self.versions)}
        return MetricPoint(deployment_id=deployment_id, at=at, versions=by_version, **self.values())


def _quantiles(histograms: dict[str, bk.Buckets]) -> dict[str, float | None]:
    return {name: bk.quantile(histograms[h], q) for name, (h, q) in QUANTILES.items()}


def _targets() -> list[tuple[Instance, str]]:
    instances = (
        Instance.objects.filter(
            deployment__observed_state__in=LIVE_STATES, state__in=SCRAPED_STATES
        )
        .select_related("metric_source", "version")
        .order_by("pk")
    )
    return [(i, url) for i in instances if (url := (i.endpoints or {}).get("metrics"))]


def _count_replicas(intervals: dict[int, _Interval]) -> None:
    """Give each live deployment's interval its ready instances (also per version) and wanted
    replicas; a deployment asleep, or waking with nothing to scrape yet, gets an interval too,
    so its chart shows the 0 rather than a gap."""
    ready: dict[int, dict[int, int]] = defaultdict(dict)
    rows = (
        Instance.objects.filter(
            deployment__observed_state__in=LIVE_STATES, state=InstanceState.READY
        )
        .values("deployment_id", "version__number")
        .annotate(n=Count("pk"))
    )
    for row in rows:
        ready[row["deployment_id"]][row["version__number"]] = row["n"]
    live = Deployment.objects.filter(observed_state__in=LIVE_STATES).only(
        "pk", "replicas", "scaling"
    )
    for deployment in live:
        state = deployment.scaling
        if deployment.pk not in intervals and not (state.asleep or state.woken_at is not None):
            continue
        interval = intervals[deployment.pk]
        interval.wanted = 0 if state.asleep else deployment.replicas
        by_version = ready.get(deployment.pk, {})
        interval.ready = sum(by_version.values())
        for number, version in interval.versions.items():
            version.ready = by_version.get(number, 0)


def _source_of(instance: Instance) -> MetricSource | None:
    try:
        return instance.metric_source
    except MetricSource.DoesNotExist:
        return None


def scrape_live_instances(now: datetime | None = None) -> ScrapeReport:
    """One pass: read every live instance's ``/metrics``, record each source's state, write a
    point per deployment, and drop what is older than the retention."""
    at = now or timezone.now()
    timeout = _setting("METRICS_SCRAPE_TIMEOUT_SECONDS", 2.0)
    targets = _targets()
    readings: list[Snapshot | str] = []
    if targets:
        workers = min(MAX_PARALLEL_SCRAPES, len(targets))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scrape") as pool:
            readings = list(pool.map(lambda target: _read(target[1], timeout), targets))

    intervals: dict[int, _Interval] = defaultdict(_Interval)
    errors: dict[str, str] = {}
    with transaction.atomic():
        for (instance, url), reading in zip(targets, readings, strict=True):
            interval = intervals[instance.deployment_id]
            of_version = interval.of_version(instance.version.number)
            source = _source_of(instance) or MetricSource(instance=instance)
            source.url, source.last_scraped_at = url, at
            if isinstance(reading, str):
                source.up, source.error = False, reading
                interval.down += 1
                of_version.down += 1
                errors[instance.name] = reading
            else:
                delta, seconds = None, 0.0
                if source.snapshot is not None and source.snapshot_at is not None:
                    delta = reading.since(Snapshot.from_json(source.snapshot))
                    seconds = (at - source.snapshot_at).total_seconds()
                elif instance.ready_at is not None:
                    # The first reading: the engine's counters began at zero when it started,
                    # and it served nothing before it was ready, so what they hold now is the
                    # traffic since then (a new instance's first seconds are not lost).
                    delta, seconds = reading, (at - instance.ready_at).total_seconds()
                interval.add_up(reading, delta, seconds)
                of_version.add_up(reading, delta, seconds)
                source.up, source.error, source.last_ok_at = True, "", at
                source.snapshot, source.snapshot_at = reading.to_json(), at
            source.save()
        _count_replicas(intervals)
        points = [interval.point(d, at) for d, interval in sorted(intervals.items())]
        MetricPoint.objects.bulk_create(points)
        pruned, sources_pruned = _prune(at)
    down = len(errors)
    return ScrapeReport(
        at=at,
        scraped=len(targets),
        up=len(targets) - down,
        down=down,
        points=len(points),
        points_pruned=pruned,
        sources_pruned=sources_pruned,
        errors=errors,
    )


def _prune(at: datetime) -> tuple[int, int]:
    retention = timedelta(seconds=_setting("METRICS_RETENTION_SECONDS", 24 * 3600))
    points, _ = MetricPoint.objects.filter(at__lt=at - retention).delete()
    sources, _ = MetricSource.objects.filter(
        instance__state__in=(InstanceState.STOPPED, InstanceState.FAILED)
    ).delete()
    return points, sources


# --- reading ------------------------------------------------------------------------------------


def _values_of(point: MetricPoint) -> dict[str, Any]:
    values = {name: getattr(point, name) for name in (*VALUE_FIELDS, *COUNT_FIELDS)}
    values.update(ttft_buckets=point.ttft_buckets, e2e_buckets=point.e2e_buckets)
    return values


def _merge(at: datetime, entries: Sequence[dict[str, Any]], passes: int = 1) -> dict[str, Any]:
    """Several deployments' (or versions') values of ``passes`` passes as one: rates add up
    (and are averaged over the passes), usage is a mean, the hit rate a request-weighted mean,
    and quantiles come from the summed bucket deltas (exact over the passes, too)."""
    merged: dict[str, Any] = {"at": at}
    for name in RATE_FIELDS:
        values = [e[name] for e in entries if e.get(name) is not None]
        merged[name] = sum(values) / passes if values else None
    histograms = {
        "ttft": bk.merge(bk.from_json(e.get("ttft_buckets") or {}) for e in entries),
        "e2e": bk.merge(bk.from_json(e.get("e2e_buckets") or {}) for e in entries),
    }
    merged.update(_quantiles(histograms))
    usages = [e["kv_cache_usage"] for e in entries if e.get("kv_cache_usage") is not None]
    merged["kv_cache_usage"] = sum(usages) / len(usages) if usages else None
    merged["prefix_cache_hit_rate"] = _weighted_hit_rate(entries)
    for name in COUNT_FIELDS:
        merged[name] = round(sum(e.get(name) or 0 for e in entries) / passes)
    for name in REPLICA_FIELDS:
        counts = [e[name] for e in entries if e.get(name) is not None]
        merged[name] = sum(counts) / passes if counts else None
    return merged


def _weighted_hit_rate(entries: Sequence[dict[str, Any]]) -> float | None:
    rated = [e for e in entries if e.get("prefix_cache_hit_rate") is not None]
    if not rated:
        return None
    weights = [e.get("requests_per_s") or 0.0 for e in rated]
    if sum(weights) <= 0:
        return sum(e["prefix_cache_hit_rate"] for e in rated) / len(rated)
    return sum(e["prefix_cache_hit_rate"] * w for e, w in zip(rated, weights, strict=True)) / sum(
        weights
    )


def _points(deployments: Iterable[Deployment | int], since: datetime) -> list[MetricPoint]:
    ids = [d if isinstance(d, int) else d.pk for d in deployments]
    if not ids:
        return []
    return list(
        MetricPoint.objects.filter(deployment_id__in=ids, at__gte=since).order_by("at", "id")
    )


def has_points(deployments: Iterable[Deployment | int], since: datetime) -> bool:
    ids = [d if isinstance(d, int) else d.pk for d in deployments]
    return MetricPoint.objects.filter(deployment_id__in=ids, at__gte=since).exists()


def bin_seconds(window: timedelta) -> float | None:
    """How many seconds of passes :func:`series` averages into one entry over ``window``:
    None (every pass) while the window holds at most ``MAX_CHART_POINTS`` passes, so a day
    is 720 entries of two minutes rather than 5,760 of 15 s, and the page stays light."""
    step = window.total_seconds() / MAX_CHART_POINTS
    return step if step > _setting("METRICS_SCRAPE_SECONDS", 15.0) else None


def _binned(
    by_at: dict[datetime, list[dict[str, Any]]], step: float | None
) -> list[dict[str, Any]]:
    """One entry per pass, or per ``step`` seconds (bins aligned to the epoch, so totals and
    versions, and one refresh and the next, cut time the same way), stamped with the bin's
    start."""
    if step is None:
        return [_merge(at, by_at[at]) for at in sorted(by_at)]
    bins: dict[float, list[datetime]] = defaultdict(list)
    for at in sorted(by_at):
        bins[at.timestamp() // step * step].append(at)
    return [
        _merge(
            datetime.fromtimestamp(start, tz=UTC),
            [entry for at in ats for entry in by_at[at]],
            passes=len(ats),
        )
        for start, ats in sorted(bins.items())
    ]


def series(
    deployments: Iterable[Deployment | int], since: datetime, step: float | None = None
) -> list[dict[str, Any]]:
    """The points of ``deployments`` since ``since``, one entry per scrape pass (or per
    ``step`` seconds, see :func:`bin_seconds`), oldest first:
    ``{"at": datetime, "<field>": float | None, ..., "sources_up": int, "sources_down": int}``."""
    by_at: dict[datetime, list[dict[str, Any]]] = defaultdict(list)
    for point in _points(deployments, since):
        by_at[point.at].append(_values_of(point))
    return _binned(by_at, step)


def version_series(
    deployments: Iterable[Deployment | int], since: datetime, step: float | None = None
) -> dict[int, list[dict[str, Any]]]:
    """The same points split by model version number: ``{2: [entry, ...], 1: [...]}``, each
    entry shaped as :func:`series`'s. A version has an entry only for the passes that read one
    of its instances, so a canary's line starts where the canary did."""
    by_version: dict[int, dict[datetime, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for point in _points(deployments, since):
        for number, values in (point.versions or {}).items():
            by_version[int(number)][point.at].append(values)
    return {
        number: _binned(passes, step) for number, passes in sorted(by_version.items(), reverse=True)
    }


@dataclass(frozen=True)
class Marker:
    """A moment the charts mark with a vertical line: ``kind`` is deploy, stage or rollback."""

    t: datetime
    kind: str
    label: str
    deployment: int


def marker_kind(event: DeploymentEvent) -> str | None:
    """Which mark a timeline event makes on the charts, if any.

    A deploy is a deployment's creation or a new rollout (back to pending from serving); a
    stage is the controller shifting traffic (its note carries the new split and the instances
    it retires); a rollback is one being asked for or started. Everything else (instances, settings) is left off: the
    charts would drown in lines."""
    data = event.data or {}
    if event.kind == EventKind.CREATED:
        return "deploy"
    if event.kind == EventKind.ACTION and data.get("action") == "rollback":
        return "rollback"
    if event.kind != EventKind.STATE:
        return None
    if event.to_state == ObservedState.ROLLING_BACK:
        return "rollback"
    if event.to_state == ObservedState.PENDING and event.from_state:
        return "deploy"
    if not event.to_state and "traffic" in data and "retiring" in data:
        return "stage"  # the controller's traffic shift (a rollback's restore has no retiring)
    return None


def markers(deployments: Iterable[Deployment | int], since: datetime) -> list[Marker]:
    """The deployments' deploys, stage changes and rollbacks since ``since``, oldest first."""
    ids = [d if isinstance(d, int) else d.pk for d in deployments]
    events = DeploymentEvent.objects.filter(
        deployment_id__in=ids,
        created_at__gte=since,
        kind__in=(EventKind.CREATED, EventKind.ACTION, EventKind.STATE),
    ).order_by("created_at", "id")
    found = []
    for event in events:
        kind = marker_kind(event)
        if kind is not None:
            label = (
                event.message
                if len(event.message) <= MARKER_LABEL_CHARS
                else (event.message[: MARKER_LABEL_CHARS - 1] + "…")
            )
            found.append(Marker(event.created_at, kind, label, event.deployment_id))
    return found


def source_status(deployment: Deployment) -> list[SourceStatus]:
    """The state of each of the deployment's scraped instances' ``/metrics``."""
    sources = (
        MetricSource.objects.filter(
            instance__deployment=deployment, instance__state__in=SCRAPED_STATES
        )
        .select_related("instance__version")
        .order_by("instance__name")
    )
    return [
        SourceStatus(
            instance=s.instance.name,
            version=s.instance.version.number,
            url=s.url,
            up=s.up,
            error=s.error,
            last_scraped_at=s.last_scraped_at,
        )
        for s in sources
    ]
