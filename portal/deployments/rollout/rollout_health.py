"""The signals a rollout is judged and a deployment scaled by, read from the instances' own
unified ``/metrics``.

Counts are cumulative, so a bake compares them with a baseline taken when it began: the error
rate of a stage is (failures since) / (requests since), over the new version's instances.
"""

from __future__ import annotations

from portal.deployments.state.autoscaling import InstanceLoad
from portal.deployments.state.rollout_state import RequestCounts
from portal.metrics.scrape import ScrapeError, Snapshot, fetch_snapshot, parse_exposition

SCRAPE_TIMEOUT_SECONDS = 2.0


def _counts(snapshot: Snapshot) -> RequestCounts:
    return RequestCounts(snapshot.request_success, snapshot.request_failure)


def parse_counts(text: str) -> RequestCounts:
    """Sum Triton's ``nv_inference_request_success``/``_failure`` over models and reasons.

    Read with the metrics pages' parser, so a rollout is judged by the same numbers its charts
    show. Raises ``ValueError`` when the text is not an exposition."""
    return _counts(parse_exposition(text))


def scrape_counts(metrics_url: str) -> RequestCounts | None:
    """The instance's counts, or None when its ``/metrics`` cannot be read or parsed."""
    try:
        return _counts(fetch_snapshot(metrics_url, timeout=SCRAPE_TIMEOUT_SECONDS))
    except ScrapeError:
        return None


def scrape_load(metrics_url: str) -> InstanceLoad | None:
    """The instance's load now (requests running and waiting, KV-cache usage), or None when its
    ``/metrics`` cannot be read: the autoscaler's reading (:mod:`~portal.deployments.state.autoscaling`)."""
    try:
        snapshot = fetch_snapshot(metrics_url, timeout=SCRAPE_TIMEOUT_SECONDS)
    except ScrapeError:
        return None
    return InstanceLoad(
        snapshot.requests_running, snapshot.requests_waiting, snapshot.kv_cache_usage
    )
