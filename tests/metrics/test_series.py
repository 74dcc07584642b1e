"""Reading points back: several deployments merged per pass, the time window, retention."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.deployments.models import InstanceState
from portal.metrics import buckets as bk
from portal.metrics.models import MetricPoint, MetricSource
from portal.metrics.services import (
    CHARTS,
    REPLICA_FIELDS,
    VALUE_FIELDS,
    scrape_live_instances,
    series,
    source_status,
)
from tests.factories import make_deployment, make_model, make_version
from tests.metrics.helpers import Answer, EngineExposition, add_instance, loopback_source

pytestmark = pytest.mark.django_db


@pytest.fixture
def second_deployment(team, release, artifact_root, cpu_instance_type):
    model = make_model(team, "reranker")
    return make_deployment(model, make_version(model, artifact_root), cpu_instance_type)


def test_two_deployments_merge_per_pass(deployment, second_deployment):
    """Each deployment gets its own engine; the merged series is what one engine serving both
    deployments' requests would show."""
    engines = {deployment.pk: EngineExposition(), second_deployment.pk: EngineExposition()}
    start = timezone.now()
    with loopback_source() as one, loopback_source() as two:
        sources = {deployment.pk: one, second_deployment.pk: two}
        for target, source in sources.items():
            source.answer = Answer(body=engines[target].text())
        add_instance(deployment, "one", one.url)
        add_instance(second_deployment, "two", two.url)
        scrape_live_instances(now=start)
        engines[deployment.pk].serve(ok=10, failed=1, ttft=0.03, e2e=0.9)
        engines[second_deployment.pk].serve(ok=30, ttft=0.3, e2e=4.0)
        engines[deployment.pk].set_usage(0.2)
        engines[second_deployment.pk].set_usage(0.6)
        for target, source in sources.items():
            source.answer = Answer(body=engines[target].text())
        scrape_live_instances(now=start + timedelta(seconds=10))

    merged = series([deployment, second_deployment], since=start - timedelta(seconds=1))
    assert [entry["at"] for entry in merged] == [start, start + timedelta(seconds=10)]
    first, last = merged
    counted = ("kv_cache_usage", *REPLICA_FIELDS)  # readings of the moment, not of an interval
    assert all(first[name] is None for name in VALUE_FIELDS if name not in counted)
    assert (first["ready_instances"], last["wanted_replicas"]) == (2, 2)
    assert (last["sources_up"], last["sources_down"]) == (2, 0)
    assert last["requests_per_s"] == pytest.approx((11 + 30) / 10)
    assert last["errors_per_s"] == pytest.approx(1 / 10)
    assert last["kv_cache_usage"] == pytest.approx(0.4)
    assert last["prefix_cache_hit_rate"] == pytest.approx(2 / 5)

    # Quantiles of the merged buckets, not an average of each deployment's quantiles.
    points = MetricPoint.objects.filter(at=last["at"])
    summed = bk.merge(bk.from_json(p.ttft_buckets) for p in points)
    assert summed[math.inf] == 40
    assert last["ttft_p50"] == pytest.approx(bk.quantile(summed, 0.5))
    assert 0.25 < last["ttft_p50"] <= 0.5  # 30 of the 40 first tokens took 0.3 s
    alone = series([deployment], since=start)[-1]
    assert alone["ttft_p50"] < 0.04 and alone["requests_per_s"] == pytest.approx(11 / 10)

    assert series([deployment], since=start + timedelta(seconds=5)) == [alone]
    assert series([], since=start) == []


def test_old_points_and_sources_of_stopped_instances_are_pruned(deployment, settings):
    settings.METRICS_RETENTION_SECONDS = 3600
    now = timezone.now()
    for age in (7200, 3601, 3599, 60):
        MetricPoint.objects.create(deployment=deployment, at=now - timedelta(seconds=age))
    with loopback_source(Answer(body=EngineExposition().text())) as source:
        gone = add_instance(deployment, "gone", source.url)
        add_instance(deployment, "kept", source.url)
        earlier = scrape_live_instances(now=now - timedelta(seconds=30))
        gone.state = InstanceState.STOPPED
        gone.save(update_fields=["state"])
        report = scrape_live_instances(now=now)
    assert (earlier.points_pruned, report.points_pruned) == (1, 1)
    assert report.sources_pruned == 1
    ages = sorted(
        int((now - at).total_seconds()) for at in MetricPoint.objects.values_list("at", flat=True)
    )
    assert ages == [0, 30, 60, 3599]
    assert list(MetricSource.objects.values_list("instance__name", flat=True)) == ["kept"]
    [status] = source_status(deployment)
    assert (status.instance, status.version, status.up) == ("kept", 1, True)
    assert status.url == source.url and status.last_scraped_at == now


def test_every_chart_plots_fields_a_point_has():
    assert [chart.key for chart in CHARTS] == [
        "tokens",
        "requests",
        "replicas",
        "ttft",
        "e2e",
        "kv_cache",
        "prefix_cache",
    ]
    for chart in CHARTS:
        assert chart.lines and all(name in VALUE_FIELDS for name, _ in chart.lines)
