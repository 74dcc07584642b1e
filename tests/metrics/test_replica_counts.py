"""The scrape pass keeps each live deployment's ready instances and wanted replicas (0 asleep),
writes a point for a deployment asleep with nothing to scrape, and the charts carry them."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.deployments.models import Deployment, InstanceState, ObservedState
from portal.deployments.state.autoscaling import ScalingState
from portal.metrics.models import MetricPoint
from portal.metrics.services import CHARTS, VALUE_FIELDS, scrape_live_instances, series
from tests.api.helpers import ok
from tests.factories import make_deployment, make_model, make_version
from tests.metrics.helpers import Answer, EngineExposition, add_instance, loopback_source

pytestmark = pytest.mark.django_db


def _serving(deployment: Deployment, **fields) -> Deployment:
    Deployment.objects.filter(pk=deployment.pk).update(
        observed_state=ObservedState.SERVING, **fields
    )
    deployment.refresh_from_db()
    return deployment


@pytest.fixture
def asleep(team, artifact_root, cpu_instance_type):
    """A second model's deployment, scaled to zero: serving, no instance left."""
    model = make_model(team, "sleeper")
    deployment = make_deployment(model, make_version(model, artifact_root), cpu_instance_type)
    return _serving(
        deployment,
        replicas=1,
        scale_to_zero_after_seconds=600,
        scaling=ScalingState(asleep_since=time.time() - 900),
    )


def test_a_pass_keeps_ready_and_wanted_and_a_point_for_a_deployment_asleep(
    deployment, asleep, team, artifact_root, cpu_instance_type
):
    deployment = _serving(deployment, replicas=3, min_replicas=1, max_replicas=4)
    # A pending deployment with nothing started yet writes no point (as before).
    other = make_model(team, "waiting")
    pending = make_deployment(other, make_version(other, artifact_root), cpu_instance_type)
    engine = EngineExposition()
    with loopback_source(Answer(body=engine.text())) as up, loopback_source(Answer()) as starting:
        add_instance(deployment, "ready-1", up.url)
        add_instance(deployment, "ready-2", up.url)
        add_instance(deployment, "starting-1", starting.url, state=InstanceState.STARTING)
        add_instance(deployment, "stopped-1", up.url, state=InstanceState.STOPPED)
        report = scrape_live_instances()

    assert report.points == 2
    point = MetricPoint.objects.get(deployment=deployment, at=report.at)
    assert (point.ready_instances, point.wanted_replicas) == (2, 3)
    number = str(deployment.target_version.number)
    assert point.versions[number]["ready_instances"] == 2
    assert point.versions[number]["wanted_replicas"] is None  # the deployment's, not a version's

    sleeping = MetricPoint.objects.get(deployment=asleep, at=report.at)
    assert (sleeping.ready_instances, sleeping.wanted_replicas) == (0, 0)
    assert (sleeping.sources_up, sleeping.sources_down, sleeping.versions) == (0, 0, {})
    assert sleeping.requests_per_s is None
    assert not MetricPoint.objects.filter(deployment=pending).exists()


def test_a_deployment_woken_before_its_first_instance_has_a_point(asleep):
    deployment = _serving(asleep, scaling=ScalingState(woken_at=time.time() - 2))
    report = scrape_live_instances()
    point = MetricPoint.objects.get(deployment=deployment, at=report.at)
    assert (point.ready_instances, point.wanted_replicas) == (0, 1)


def test_the_series_add_counts_up_over_deployments_and_average_them_in_a_bin(deployment, asleep):
    deployment = _serving(deployment, replicas=2)
    start = timezone.now() - timedelta(minutes=2)
    with loopback_source(Answer(body=EngineExposition().text())) as source:
        add_instance(deployment, "ready-1", source.url)
        first = scrape_live_instances(now=start)
        add_instance(deployment, "ready-2", source.url)
        second = scrape_live_instances(now=start + timedelta(seconds=15))
    entries = series([deployment, asleep], start - timedelta(seconds=1))
    assert [(e["ready_instances"], e["wanted_replicas"]) for e in entries] == [(1, 2), (2, 2)]
    assert [e["at"] for e in entries] == [first.at, second.at]
    # Both passes in one bin: the mean of the passes, the asleep deployment adding its zeros.
    [binned] = series([deployment, asleep], start - timedelta(seconds=1), step=3600.0)
    assert (binned["ready_instances"], binned["wanted_replicas"]) == (1.5, 2.0)
    # Points written before the counts were kept say nothing rather than 0.
    MetricPoint.objects.create(deployment=deployment, at=start - timedelta(seconds=30))
    old = series([deployment], start - timedelta(seconds=31))[0]
    assert (old["ready_instances"], old["wanted_replicas"]) == (None, None)


def test_the_replicas_chart_is_next_to_requests_and_the_api_carries_it(
    api, member, deployment, asleep
):
    keys = [chart.key for chart in CHARTS]
    assert keys.index("replicas") == keys.index("requests") + 1
    replicas = next(chart for chart in CHARTS if chart.key == "replicas")
    assert (replicas.title, replicas.unit) == ("Replicas", "instances")
    assert [label for _, label in replicas.lines] == ["ready", "wanted"]
    assert all(name in VALUE_FIELDS for name, _ in replicas.lines)

    scrape_live_instances(now=timezone.now() - timedelta(seconds=30))
    body = ok(api(member).get(f"/api/v1/deployments/{asleep.pk}/metrics/?minutes=5"))
    [point] = body["points"]
    assert (point["ready_instances"], point["wanted_replicas"]) == (0, 0)
    chart = next(c for c in body["charts"] if c["key"] == "replicas")
    assert chart["lines"] == [
        {"field": "ready_instances", "label": "ready"},
        {"field": "wanted_replicas", "label": "wanted"},
    ]
    # The model page's merge of its deployments carries them too.
    body = ok(api(member).get(f"/api/v1/models/{asleep.model.pk}/metrics/?minutes=5"))
    assert body["points"][0]["wanted_replicas"] == 0
