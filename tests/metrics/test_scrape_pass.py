"""A scrape pass against a real serving instance, against sources that fail in every way we
know, and across an engine restart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.deployments.models import InstanceState
from portal.deployments.rollout.rollout_health import scrape_counts
from portal.metrics.models import MetricPoint, MetricSource
from portal.metrics.scrape import Snapshot
from portal.metrics.services import scrape_live_instances
from tests.metrics.helpers import Answer, EngineExposition, add_instance, loopback_source
from tests.ports import free_port

pytestmark = pytest.mark.django_db


@pytest.mark.slow
def test_a_real_instance_gives_rates_and_quantiles_after_requests(deployment, real_instance):
    instance = add_instance(deployment, "real-1", real_instance.metrics_url)
    first = scrape_live_instances()
    assert (first.up, first.down, first.points) == (1, 0, 1)
    point = MetricPoint.objects.get(deployment=deployment, at=first.at)
    assert point.sources_up == 1 and point.requests_per_s is None  # nothing to compare with yet
    assert point.kv_cache_usage is not None

    before = scrape_counts(real_instance.metrics_url)
    real_instance.complete(4)
    second = scrape_live_instances()
    point = MetricPoint.objects.get(deployment=deployment, at=second.at)
    elapsed = (second.at - first.at).total_seconds()
    after = scrape_counts(real_instance.metrics_url)
    assert before is not None and after is not None
    assert point.requests_per_s * elapsed == pytest.approx((after - before).total)
    assert point.errors_per_s == 0
    for name in ("prompt_tokens_per_s", "generation_tokens_per_s", "requests_per_s"):
        assert getattr(point, name) > 0, name
    assert 0 < point.ttft_p50 <= point.ttft_p99
    assert 0 < point.e2e_p50 <= point.e2e_p99
    assert point.prefix_cache_hit_rate == 0.0  # the CPU engine has no prefix cache: no hits
    assert 0.0 <= point.kv_cache_usage <= 1.0
    assert point.ttft_buckets["+Inf"] == 4 and point.e2e_buckets["+Inf"] == 4

    source = MetricSource.objects.get(instance=instance)
    assert source.up and source.error == "" and source.last_ok_at == second.at
    assert Snapshot.from_json(source.snapshot).requests == after.total


BROKEN = {
    "hangs": (Answer(hang=True), "within 0.5 s"),
    "garbage": (Answer(body="<html><body>502 Bad Gateway</body></html>"), "not a Prometheus"),
    "error": (Answer(status=500, body="boom"), "HTTP 500"),
    "unrelated": (Answer(body="up 1\n"), "without any serving metrics"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_source_is_down_with_its_reason(deployment, kind):
    answer, reason = BROKEN[kind]
    with loopback_source(answer) as source:
        add_instance(deployment, f"broken-{kind}", source.url)
        report = scrape_live_instances()
    assert (report.up, report.down) == (0, 1)
    stored = MetricSource.objects.get(instance__name=f"broken-{kind}")
    assert not stored.up and reason in stored.error, stored.error
    assert source.url in stored.error
    point = MetricPoint.objects.get(deployment=deployment)
    assert (point.sources_up, point.sources_down) == (0, 1)
    assert point.requests_per_s is None and point.kv_cache_usage is None


def test_a_refused_port_is_down_with_its_reason(deployment):
    url = f"http://127.0.0.1:{free_port()}/metrics"
    add_instance(deployment, "refused", url)
    report = scrape_live_instances()
    assert report.errors["refused"].startswith(f"cannot connect to {url}")
    stored = MetricSource.objects.get(instance__name="refused")
    assert not stored.up and "cannot connect" in stored.error
    assert MetricPoint.objects.get(deployment=deployment).sources_down == 1


def test_one_bad_instance_leaves_the_others_counted(deployment):
    engine = EngineExposition()
    with (
        loopback_source(Answer(body=engine.text())) as good,
        loopback_source(Answer(status=503)) as bad,
    ):
        add_instance(deployment, "good", good.url)
        add_instance(deployment, "bad", bad.url)
        scrape_live_instances()
        engine.serve(ok=6, failed=2)
        good.answer = Answer(body=engine.text())
        report = scrape_live_instances()
    point = MetricPoint.objects.get(deployment=deployment, at=report.at)
    assert (point.sources_up, point.sources_down) == (1, 1)
    assert point.errors_per_s is not None
    assert point.requests_per_s == pytest.approx(4 * point.errors_per_s)
    assert point.prefix_cache_hit_rate == pytest.approx(2 / 5)


def test_a_failed_scrape_keeps_the_last_good_reading(deployment):
    engine = EngineExposition()
    engine.serve(ok=3)
    start = timezone.now()
    with loopback_source(Answer(body=engine.text())) as source:
        add_instance(deployment, "flaky", source.url)
        scrape_live_instances(now=start)
        kept = MetricSource.objects.get(instance__name="flaky").snapshot
        source.answer = Answer(status=500)
        scrape_live_instances(now=start + timedelta(seconds=15))
        stored = MetricSource.objects.get(instance__name="flaky")
        assert not stored.up and stored.snapshot == kept
        assert stored.snapshot_at == start and stored.last_ok_at == start

        engine.serve(ok=9)
        source.answer = Answer(body=engine.text())
        back = scrape_live_instances(now=start + timedelta(seconds=30))
    point = MetricPoint.objects.get(deployment=deployment, at=back.at)
    assert point.requests_per_s == pytest.approx(9 / 30)  # over the whole gap since `start`


def test_a_counter_reset_counts_the_new_values_as_the_interval(deployment):
    engine = EngineExposition()
    engine.serve(ok=50, ttft=0.5)
    start = timezone.now()
    with loopback_source(Answer(body=engine.text())) as source:
        add_instance(deployment, "restarts", source.url)
        scrape_live_instances(now=start)
        restarted = EngineExposition()
        restarted.serve(ok=3, ttft=0.005)
        source.answer = Answer(body=restarted.text())
        report = scrape_live_instances(now=start + timedelta(seconds=10))
    point = MetricPoint.objects.get(deployment=deployment, at=report.at)
    assert point.requests_per_s == pytest.approx(3 / 10)
    assert point.ttft_buckets["+Inf"] == 3
    assert point.ttft_p99 is not None and point.ttft_p99 <= 0.005


def test_only_live_instances_of_live_deployments_are_read(deployment):
    with loopback_source(Answer(body=EngineExposition().text())) as source:
        add_instance(deployment, "pending", source.url, state=InstanceState.PENDING)
        add_instance(deployment, "stopped", source.url, state=InstanceState.STOPPED)
        add_instance(deployment, "draining", source.url, state=InstanceState.DRAINING)
        report = scrape_live_instances()
        assert report.scraped == 1
        deployment.observed_state = "retired"
        deployment.save(update_fields=["observed_state"])
        assert scrape_live_instances().scraped == 0


def test_a_new_instances_first_reading_counts_from_when_it_became_ready(deployment):
    engine = EngineExposition()
    engine.serve(ok=20)
    now = timezone.now()
    with loopback_source(Answer(body=engine.text())) as source:
        instance = add_instance(deployment, "fresh", source.url)
        instance.ready_at = now - timedelta(seconds=10)
        instance.save(update_fields=["ready_at"])
        report = scrape_live_instances(now=now)
    point = MetricPoint.objects.get(deployment=deployment, at=report.at)
    assert point.requests_per_s == pytest.approx(20 / 10)
    assert point.e2e_p50 is not None
