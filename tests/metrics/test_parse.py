"""The parser on a real instance's exposition, and the arithmetic of readings and buckets."""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest

from portal.deployments.rollout.rollout_health import parse_counts
from portal.metrics import buckets as bk
from portal.metrics.scrape import Snapshot, parse_exposition
from tests.metrics.helpers import EngineExposition


@pytest.fixture(scope="module")
def served(real_instance) -> tuple[str, str, int]:
    """The instance's exposition before and after some requests, and how many were sent."""
    before = httpx.get(real_instance.metrics_url).text
    real_instance.complete(3)
    return before, httpx.get(real_instance.metrics_url).text, 3


@pytest.mark.slow  # a real instance starts for them (10-12 s)
def test_a_real_exposition_reads_as_the_requests_sent(served):
    before_text, after_text, sent = served
    before, after = parse_exposition(before_text), parse_exposition(after_text)
    interval = after.since(before)
    assert interval.request_success == sent
    assert interval.request_failure == 0
    assert interval.ttft.count == sent
    assert interval.e2e.count == sent
    assert interval.prompt_tokens > 0 and interval.generation_tokens > 0
    assert interval.prefix_cache_queries == interval.prompt_tokens  # the CPU engine's truth
    assert after.kv_cache_usage is not None and 0.0 <= after.kv_cache_usage <= 1.0
    for histogram in (after.ttft, after.e2e):
        counts = [histogram.buckets[b] for b in sorted(histogram.buckets)]
        assert counts == sorted(counts)
        assert math.isinf(max(histogram.buckets))
        assert bk.total(histogram.buckets) == histogram.count
        assert histogram.sum > 0
    assert 0 < interval.ttft.quantile(0.5) <= interval.ttft.quantile(0.99)


@pytest.mark.slow  # a real instance starts for them (10-12 s)
def test_the_rollout_signals_read_the_same_counts(served):
    _, text, _ = served
    snapshot = parse_exposition(text)
    counts = parse_counts(text)
    assert (counts.success, counts.failure) == (snapshot.request_success, snapshot.request_failure)
    assert counts.total >= 3


@pytest.mark.slow  # a real instance starts for them (10-12 s)
def test_counters_read_the_same_with_or_without_their_type_lines(served):
    _, text, _ = served
    counter_families = re.findall(r"^# TYPE (\S+) counter$", text, flags=re.MULTILINE)
    assert "nv_inference_request_success" in counter_families
    untyped = "\n".join(
        line
        for line in text.splitlines()
        if not (line.startswith("#") and line.split()[2] in counter_families)
    )
    assert parse_exposition(untyped) == parse_exposition(text)


@pytest.mark.slow  # a real instance starts for them (10-12 s)
def test_a_reading_survives_json(served):
    _, text, _ = served
    snapshot = parse_exposition(text)
    assert Snapshot.from_json(json.loads(json.dumps(snapshot.to_json()))) == snapshot


def test_label_sets_are_summed_and_usage_is_the_busiest_engine():
    engines = EngineExposition()
    engines.serve(ok=2, failed=1, engine="0")
    engines.serve(ok=3, engine="1")
    engines.set_usage(0.25, engine="0")
    engines.set_usage(0.75, engine="1")
    snapshot = parse_exposition(engines.text())
    assert (snapshot.request_success, snapshot.request_failure) == (5, 1)
    assert snapshot.kv_cache_usage == 0.75
    assert snapshot.ttft.count == 5 and bk.total(snapshot.ttft.buckets) == 5
    assert snapshot.prompt_tokens == 5 * 5


def test_garbage_is_refused():
    with pytest.raises(ValueError):
        parse_exposition("<html><body>Bad gateway</body></html>")


def test_a_restart_counts_everything_it_holds_as_new():
    engine = EngineExposition()
    engine.serve(ok=10)
    before = parse_exposition(engine.text())
    restarted = EngineExposition()
    restarted.serve(ok=2)
    after = parse_exposition(restarted.text())
    assert after.restarted_since(before)
    assert after.since(before) == after


def test_quantiles_interpolate_within_the_bucket():
    buckets = {0.1: 0.0, 0.2: 4.0, 0.4: 8.0, math.inf: 10.0}
    assert bk.quantile(buckets, 0.5) == pytest.approx(0.2 + 0.2 * (5 - 4) / (8 - 4))
    assert bk.quantile(buckets, 0.2) == pytest.approx(0.1 + 0.1 * (2 - 0) / 4)
    assert bk.quantile(buckets, 0.99) == 0.4  # in +Inf: the largest finite bound
    assert bk.quantile({0.1: 0.0, math.inf: 0.0}, 0.5) is None
    assert bk.quantile({}, 0.5) is None


def test_merging_sums_cumulative_counts_per_bound():
    a = {0.1: 1.0, 0.5: 3.0, math.inf: 4.0}
    b = {0.1: 0.0, 0.5: 2.0, math.inf: 2.0}
    assert bk.merge([a, b]) == {0.1: 1.0, 0.5: 5.0, math.inf: 6.0}
    assert bk.subtract(bk.merge([a, b]), b) == a
    assert bk.from_json(json.loads(json.dumps(bk.to_json(a)))) == a
