"""MultiprocessReader gives exactly what prometheus-client's MultiProcessCollector gives, on
files written by real processes: every metric type, every gauge mode, awkward label values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from serving.metrics.multiprocess import MultiprocessReader, family_names
from tests.serving.instance_helpers import REPO_ROOT

WRITER = r"""
import sys
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary
step = int(sys.argv[1])
r = CollectorRegistry()
awkward = ['plain', 'quote " here', 'back\\slash', 'new\nline', '{}', 'ünï']
c = Counter("demo:requests", "Requests.\nSecond line with \\ backslash.", ["who"], registry=r)
for i, who in enumerate(awkward):
    c.labels(who).inc(i + step)
Counter("demo_nolabels", "No labels.", registry=r).inc(3)
h = Histogram("demo:latency_seconds", "Latency.", ["model"], buckets=[0.1, 1, 10], registry=r)
for v in (0.05, 0.5, 5, 50):
    h.labels("m").observe(v * step)
s = Summary("demo_size_bytes", "Sizes.", registry=r)
s.observe(100 * step)
for mode in ("all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum",
             "mostrecent", "livemostrecent"):
    Gauge(f"demo_gauge_{mode}", f"Gauge {mode}.", ["k"], multiprocess_mode=mode,
          registry=r).labels("v").set(step * 10)
"""


@pytest.fixture(scope="module")
def multiproc(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("prometheus")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    for step in (1, 3, 2):  # three processes; the last one written is the most recent
        subprocess.run(
            [sys.executable, "-c", WRITER, str(step)], cwd=REPO_ROOT, env=env, check=True
        )
    return directory


def normalized(text: str) -> dict:
    # Values rounded: both sum the same floats, in file order, which may differ (0.1 + 0.2...).
    return {
        f.name: (
            f.type,
            f.documentation,
            sorted((s.name, sorted(s.labels.items()), round(s.value, 9)) for s in f.samples),
        )
        for f in text_string_to_metric_families(text)
    }


def test_same_families_as_multiprocesscollector(multiproc):
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc))
    expected = normalized(generate_latest(registry).decode())
    reader = MultiprocessReader(multiproc)
    first = reader.render(reader.read())
    assert normalized(first) == expected
    assert len(expected) == 14  # 2 counters, a histogram, a summary, 10 gauges
    # The second read comes from the key cache and must not differ.
    assert reader.render(reader.read()) == first


def test_gauge_modes(multiproc):
    reader = MultiprocessReader(multiproc)
    families = normalized(reader.render(reader.read()))

    def values(mode: str) -> list[float]:
        return [v for _, _, v in families[f"demo_gauge_{mode}"][2]]

    assert sorted(values("all")) == [10, 20, 30]  # one series per pid
    assert values("min") == [10] and values("max") == [30] and values("sum") == [60]
    assert values("mostrecent") == [20]  # the last process to write
    pids = {dict(labels)["pid"] for _, labels, _ in families["demo_gauge_all"][2]}
    assert len(pids) == 3


def test_names_cover_every_sample(multiproc):
    reader = MultiprocessReader(multiproc)
    families = reader.read()
    text = reader.render(families)
    names = family_names(families)
    samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    # the parser reports counters' samples with _total, as written
    assert samples <= names
    assert {"demo:requests", "demo:requests_total", "demo:latency_seconds_bucket"} <= names
