"""What the charts read besides the merged points: the split by version, the timeline's
markers, and the range the API takes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.actors import CONTROLLER, Actor
from portal.deployments.lifecycle import record_event
from portal.deployments.models import EventKind, Instance, InstanceState, ObservedState
from portal.metrics import buckets as bk
from portal.metrics.models import MetricPoint
from portal.metrics.services import (
    CHARTS,
    RANGES,
    bin_seconds,
    markers,
    scrape_live_instances,
    series,
    version_series,
)
from tests.api.helpers import api_error, ok
from tests.factories import make_version
from tests.metrics.helpers import Answer, EngineExposition, loopback_source

pytestmark = pytest.mark.django_db


@pytest.fixture
def canary(deployment, artifact_root):
    """A deployment mid-rollout: v1 (old) and v2 (canary) instances scraped twice, 10 s apart
    and over a minute ago;
    the old one serves 40 requests, 10 of them failed, the canary 10 slower ones."""
    v1 = deployment.target_version
    v2 = make_version(deployment.model, artifact_root)
    old, new = EngineExposition(), EngineExposition()
    start = timezone.now() - timedelta(seconds=90)
    with (
        loopback_source(Answer(body=old.text())) as a,
        loopback_source(Answer(body=new.text())) as b,
    ):
        for name, version, url in (("old-1", v1, a.url), ("canary-1", v2, b.url)):
            Instance.objects.create(
                deployment=deployment,
                version=version,
                name=name,
                endpoints={"metrics": url},
                state=InstanceState.READY,
            )
        scrape_live_instances(now=start)
        old.serve(ok=30, failed=10, ttft=0.01, e2e=0.2)
        new.serve(ok=10, ttft=0.5, e2e=4.0)
        a.answer, b.answer = Answer(body=old.text()), Answer(body=new.text())
        scrape_live_instances(now=start + timedelta(seconds=10))
    return deployment, v1.number, v2.number, start


def test_points_are_split_by_version(canary):
    deployment, v1, v2, start = canary
    by_version = version_series([deployment], since=start - timedelta(seconds=1))
    assert list(by_version) == [v2, v1]  # newest version first
    old, new = by_version[v1][-1], by_version[v2][-1]
    assert old["requests_per_s"] == pytest.approx(4.0) and old["errors_per_s"] == pytest.approx(1.0)
    assert new["requests_per_s"] == pytest.approx(1.0) and new["errors_per_s"] == pytest.approx(0)
    # Each version's quantiles come from its own histogram: the canary is the slow one.
    assert new["e2e_p50"] > 1.0 > old["e2e_p50"]
    assert (old["sources_up"], new["sources_up"]) == (1, 1)
    # The totals still add both up, exactly as before the split.
    total = series([deployment], since=start - timedelta(seconds=1))[-1]
    assert total["requests_per_s"] == pytest.approx(5.0)
    assert total["sources_up"] == 2


def test_a_version_down_counts_against_that_version_only(canary, settings):
    deployment, v1, v2, start = canary
    settings.METRICS_SCRAPE_TIMEOUT_SECONDS = 0.5
    # Both loopback sources are closed now: the next pass finds both down, each in its version.
    at = start + timedelta(seconds=20)
    scrape_live_instances(now=at)
    by_version = version_series([deployment], since=at)
    assert [by_version[v][-1]["sources_down"] for v in (v1, v2)] == [1, 1]
    assert by_version[v2][-1]["requests_per_s"] is None


def test_markers_come_from_the_timeline(deployment):
    since = timezone.now() - timedelta(minutes=1)
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.INSTANCE,
        message="Instance x: starting → ready.",
    )
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.STATE,
        message="Stage 1 of 3: traffic v2 10% · v1 90%.",
        data={"traffic": {"2": 10, "1": 90}, "retiring": []},
    )
    record_event(
        deployment,
        actor=Actor(label="user:test"),
        kind=EventKind.ACTION,
        message="Rollback requested. Reason: slow",
        data={"action": "rollback", "reason": "slow"},
    )
    record_event(
        deployment,
        actor=CONTROLLER,
        kind=EventKind.STATE,
        message="Rolling back: " + "x" * 300,
        from_state=ObservedState.PROGRESSING,
        to_state=ObservedState.ROLLING_BACK,
    )
    record_event(  # a rollback's restore shifts traffic too, but is no stage
        deployment,
        actor=CONTROLLER,
        kind=EventKind.STATE,
        message="v1 restored on 1 ready instance(s) and takes 100% of the traffic.",
        data={"traffic": {"1": 100}},
    )
    found = markers([deployment], since)
    # The creation (a deploy), the stage, the request and the start of the rollback; not the
    # instance line.
    assert [m.kind for m in found] == ["deploy", "stage", "rollback", "rollback"]
    assert found[0].label.startswith("Deploy v1") and found[1].label.startswith("Stage 1 of 3")
    assert len(found[3].label) == 120 and found[3].label.endswith("…")
    assert all(m.deployment == deployment.pk for m in found)
    assert markers([deployment], timezone.now() + timedelta(seconds=1)) == []


def test_the_api_answers_a_range_with_versions_and_markers(api, member, canary):
    deployment, v1, v2, _ = canary
    url = f"/api/v1/deployments/{deployment.pk}/metrics/"
    body = ok(api(member).get(url + "?range=15m"))
    assert [v["version"] for v in body["versions"]] == [v2, v1]
    assert body["versions"][0]["points"][-1]["requests_per_s"] == pytest.approx(1.0)
    assert [m["kind"] for m in body["markers"]] == ["deploy"]
    assert body["markers"][0]["deployment"] == deployment.pk
    assert {c["key"]: c["unit"] for c in body["charts"]}["e2e"] == "ms"
    assert {c["key"]: c["factor"] for c in body["charts"]} == {c.key: c.factor for c in CHARTS}
    assert len(body["points"]) == 2


@pytest.mark.parametrize("key", list(RANGES))
def test_each_range_sets_the_window(api, member, deployment, key):
    body = ok(api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/?range={key}"))
    since, until = (timezone.datetime.fromisoformat(body[k]) for k in ("since", "until"))
    assert until - since == timedelta(minutes=RANGES[key])


def test_the_range_wins_over_minutes(api, member, canary):
    deployment, *_ = canary
    url = f"/api/v1/deployments/{deployment.pk}/metrics/"
    assert ok(api(member).get(url + "?minutes=1"))["points"] == []
    assert len(ok(api(member).get(url + "?minutes=1&range=1h"))["points"]) == 2


@pytest.mark.parametrize("bad", ["2h", "1H", "60", "all"])
def test_a_bad_range_is_refused(api, member, deployment, bad):
    response = api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/?range={bad}")
    assert "range" in api_error(response, 400, "invalid")["fields"]


@pytest.mark.parametrize("field", ["range", "minutes"])
def test_a_window_left_blank_is_refused(api, member, deployment, field):
    response = api(member).get(f"/api/v1/deployments/{deployment.pk}/metrics/?{field}=")
    assert field in api_error(response, 400, "invalid")["fields"]


def test_long_windows_average_passes_into_bins(deployment, settings):
    """A day of 15 s passes is 5,760 entries; the charts get 720 of two minutes, each the mean
    rate of its passes and the quantile of their summed histograms."""
    settings.METRICS_SCRAPE_SECONDS = 15
    assert bin_seconds(timedelta(hours=1)) is None
    assert bin_seconds(timedelta(hours=24)) == 120.0
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=10)
    start -= timedelta(seconds=start.timestamp() % 120)  # on a bin's edge
    for i in range(8):  # 30 s apart, two bins of four: 1, 2, 3, 4 then 5, 6, 7, 8 req/s
        MetricPoint.objects.create(
            deployment=deployment,
            at=start + timedelta(seconds=30 * i),
            requests_per_s=float(i + 1),
            sources_up=1,
            e2e_buckets=bk.to_json({0.1: float(i < 4), 1.0: 1.0, float("inf"): 1.0}),
            versions={"1": {"requests_per_s": float(i + 1), "sources_up": 1}},
        )
    first, second = series([deployment], start, step=120.0)
    assert (first["at"], second["at"]) == (start, start + timedelta(seconds=120))
    assert (first["requests_per_s"], second["requests_per_s"]) == (2.5, 6.5)
    assert first["e2e_p50"] <= 0.1 < second["e2e_p50"]
    assert first["sources_up"] == 1
    by_version = version_series([deployment], start, step=120.0)
    assert [e["requests_per_s"] for e in by_version[1]] == [2.5, 6.5]
    assert len(series([deployment], start)) == 8


def test_a_days_range_answers_bins(api, member, deployment, settings):
    settings.METRICS_SCRAPE_SECONDS = 15
    url = f"/api/v1/deployments/{deployment.pk}/metrics/"
    assert ok(api(member).get(url + "?range=24h"))["step"] == 120.0
    assert ok(api(member).get(url + "?range=1h"))["step"] is None
