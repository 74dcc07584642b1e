"""A real serving instance (``python -m serving.instance`` on the demo model) for the scraper to
read, started once for the package, and short scrape timeouts for the broken-source tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from serving.demo import MODEL, package_weights
from serving.demo_model import make_demo_model
from tests.serving.instance_helpers import Instance


@dataclass
class RealInstance:
    openai_url: str

    @property
    def metrics_url(self) -> str:
        return f"{self.openai_url}/metrics"

    def complete(self, requests: int, max_tokens: int = 4) -> None:
        """Send ``requests`` completions, one after another, each answered in full."""
        for index in range(requests):
            answer = httpx.post(
                f"{self.openai_url}/v1/completions",
                json={"model": MODEL, "prompt": f"Hello {index}", "max_tokens": max_tokens},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text


@pytest.fixture(scope="session")
def real_instance(tmp_path_factory) -> Iterator[RealInstance]:
    root: Path = tmp_path_factory.mktemp("metrics-instance")
    weights = make_demo_model(root / "weights")
    package = package_weights(weights, root / "demo.tar")
    instance = Instance(package, root / "work")
    try:
        ports = instance.wait_ready()
        yield RealInstance(f"http://127.0.0.1:{ports['openai']}")
    finally:
        instance.stop()


@pytest.fixture(autouse=True)
def _short_scrape_timeout(settings):
    settings.METRICS_SCRAPE_TIMEOUT_SECONDS = 0.5
