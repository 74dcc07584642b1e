"""The health signals a rollout is judged by, read from the instances' own unified ``/metrics``.

Counts are cumulative, so a bake compares them with a baseline taken when it began: the error
rate of a stage is (failures since) / (requests since), over the new version's instances.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class RequestCounts:
    success: float
    failure: float

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(self.success - other.success, self.failure - other.failure)

    @property
    def total(self) -> float:
        return self.success + self.failure

    def as_list(self) -> list[float]:
        return [self.success, self.failure]


def parse_counts(text: str) -> RequestCounts:
    """Sum Triton's ``nv_inference_request_success``/``_failure`` over models and reasons."""
    sums = {"nv_inference_request_success": 0.0, "nv_inference_request_failure": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in sums:
                sums[name] += sample.value
    return RequestCounts(sums["nv_inference_request_success"], sums["nv_inference_request_failure"])


def scrape_counts(metrics_url: str) -> RequestCounts | None:
    """The instance's counts, or None when its ``/metrics`` cannot be read or parsed."""
    try:
        answer = httpx.get(metrics_url, timeout=SCRAPE_TIMEOUT_SECONDS)
        answer.raise_for_status()
        return parse_counts(answer.text)
    except (httpx.HTTPError, ValueError):
        return None
