"""``GET /metrics`` of the front end: the instance's unified metrics endpoint.

The engine's Triton-style metrics URL and the ``PROMETHEUS_MULTIPROC_DIR`` its vLLM-named
metrics are written to are merged by :mod:`serving.metrics.unified`; without a multiprocess
directory the scrape still answers, with the vLLM source reported down.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI

from serving.metrics.unified import add_metrics_route


def add_metrics(app: FastAPI, triton_metrics_url: str, multiproc_dir: Path | None) -> None:
    if multiproc_dir is None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiproc_dir = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    add_metrics_route(app, triton_metrics_url, multiproc_dir)
