"""The instance's one ``/metrics``: the engine's Triton(-style) metrics merged with vLLM's.

vLLM writes its metrics to ``PROMETHEUS_MULTIPROC_DIR`` as ``.db`` files; Triton (or the CPU
engine standing in for it) serves ``nv_*`` families over HTTP. Neither knows the other, so this
module fetches the one, reads the other with MultiProcessCollector's merge rules (through
:class:`serving.metrics.multiprocess.MultiprocessReader`, which caches what each key means
across scrapes; ``MultiProcessCollector`` itself re-parses everything every time and was too
slow, see ``bench/metrics_scrape.py``) and writes a single exposition that prometheus-client's
own text parser accepts.

Rules of the merge:

* Each family appears once. Triton's vLLM backend with ``REPORT_CUSTOM_METRICS`` (and the CPU
  engine in its place, :mod:`serving.metrics.triton_vllm`) bridges eight ``vllm:*`` families
  into its own endpoint, seven under the same names as multiprocess ones; the multiprocess
  family wins (it is the complete source: every family, vLLM's labels), and the bridged copy
  is dropped. ``vllm:time_per_output_token_seconds`` has no multiprocess twin in vLLM 0.24, so
  the engine's copy is the one served.
* Triton's families are copied as text, not re-rendered: Triton writes counters without the
  ``_total`` suffix, and a parse/re-render through prometheus-client would rename their samples
  and break every dashboard that queries them.
* A source that is down, slow or answers garbage is left out, never the whole scrape:
  ``serving_metrics_source_up{source="triton"|"vllm"}`` says which sources answered (1) and
  which did not (0), and the endpoint still answers 200.

Reading the ``.db`` files is blocking file I/O, so it runs in a worker thread, concurrently
with the HTTP fetch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import Response

from serving.metrics.multiprocess import MultiprocessReader, family_names

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UP_FAMILY = "serving_metrics_source_up"
# Sample-name suffixes that belong to the family they extend (text format and OpenMetrics).
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_gsum", "_gcount", "_info")


@dataclass
class TextFamily:
    """One family of an exposition, kept as its original lines."""

    name: str
    type: str = "untyped"
    header: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)
    sample_names: set[str] = field(default_factory=set)

    def owns(self, sample_name: str) -> bool:
        if sample_name == self.name:
            return True
        return sample_name.startswith(self.name) and sample_name[len(self.name) :] in SUFFIXES

    def names(self) -> set[str]:
        """Every name a scraper could see for this family (a counter ``x_total`` is also ``x``)."""
        names = {self.name, *self.sample_names}
        if self.type == "counter" and self.name.endswith("_total"):
            names.add(self.name[: -len("_total")])
        return names


def split_families(text: str) -> list[TextFamily]:
    """Group a valid text exposition's lines by family, in order. Validate it first (with
    :func:`check_exposition`): this only splits, it does not check."""
    families: dict[str, TextFamily] = {}
    current: TextFamily | None = None
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue  # a plain comment
            name = parts[2]
            current = families.setdefault(name, TextFamily(name))
            if any(h.split(None, 2)[1] == parts[1] for h in current.header):
                continue  # a repeated HELP/TYPE line would make the output invalid
            current.header.append(line)
            if parts[1] == "TYPE" and len(parts) > 3:
                current.type = parts[3].strip()
            continue
        sample_name = line.split("{", 1)[0].split(None, 1)[0]
        if current is None or not current.owns(sample_name):
            current = next((f for f in families.values() if f.owns(sample_name)), None)
            if current is None:
                current = families.setdefault(sample_name, TextFamily(sample_name))
        current.samples.append(line)
        current.sample_names.add(sample_name)
    return list(families.values())


def check_exposition(text: str) -> None:
    """Raise ``ValueError`` unless prometheus-client's parser accepts ``text``."""
    for _ in text_string_to_metric_families(text):
        pass


@dataclass(frozen=True)
class VllmExposition:
    """vLLM's families as exposition text, and every name a scraper sees in it."""

    text: str
    names: frozenset[str]


def read_multiprocess(
    multiproc_dir: Path, reader: MultiprocessReader | None = None
) -> VllmExposition | None:
    """vLLM's families from ``multiproc_dir``, or ``None`` when there is nothing readable
    (missing directory, no ``.db`` file yet, no metric in them, or a file that cannot be read):
    an engine with metrics registers its families when it starts, so none means not up.

    Pass the same ``reader`` on every scrape: it remembers what each key means."""
    reader = reader or MultiprocessReader(multiproc_dir)
    try:
        families = reader.read()
    except Exception as exc:  # a torn or foreign .db file must not fail the scrape
        logger.warning(
            "cannot read vLLM metrics from %s: %s: %s", multiproc_dir, type(exc).__name__, exc
        )
        return None
    if not families:
        return None
    return VllmExposition(reader.render(families), frozenset(family_names(families)))


def merge(triton_text: str | None, vllm: VllmExposition | None) -> str:
    """One exposition: vLLM's families, then Triton's not already present, then the up gauges.

    ``triton_text`` must have passed :func:`check_exposition`; ``None`` means Triton did not
    answer usably, ``vllm=None`` that the multiprocess directory held nothing readable."""
    parts: list[str] = []
    taken: set[str] = {UP_FAMILY}
    if vllm is not None:
        parts.append(vllm.text)
        taken |= vllm.names
    for family in split_families(triton_text or ""):
        if family.names() & taken:
            logger.debug("dropping engine family %s: already served from vLLM's files", family.name)
            continue
        taken |= family.names()
        parts.append("\n".join([*family.header, *family.samples]) + "\n")
    parts.append(
        f"# HELP {UP_FAMILY} Whether a metrics source answered this scrape (1) or not (0).\n"
        f"# TYPE {UP_FAMILY} gauge\n"
        f'{UP_FAMILY}{{source="triton"}} {1.0 if triton_text is not None else 0.0}\n'
        f'{UP_FAMILY}{{source="vllm"}} {1.0 if vllm is not None else 0.0}\n'
    )
    return "".join(parts)


class UnifiedMetrics:
    """Scrapes both sources and merges them; one per front-end process (it keeps an HTTP
    connection pool to the engine's metrics port)."""

    def __init__(
        self, triton_metrics_url: str, multiproc_dir: Path | None, *, timeout: float = 2.0
    ):
        """``multiproc_dir=None``: no vLLM source is configured, and the scrape says so."""
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.triton_metrics_url = triton_metrics_url
        self.multiproc_dir = Path(multiproc_dir) if multiproc_dir is not None else None
        self.timeout = timeout
        self._reader = MultiprocessReader(self.multiproc_dir) if self.multiproc_dir else None
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        # A pooled client belongs to one event loop; a test client may run several in turn.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(timeout=self.timeout)
            self._loop = loop
        return self._client

    async def fetch_triton(self) -> str | None:
        """The engine's exposition, or ``None`` if it is down, slow, failing or not valid."""
        try:
            response = await self._http().get(self.triton_metrics_url)
        except httpx.HTTPError as exc:
            logger.warning("engine metrics %s unavailable: %s", self.triton_metrics_url, exc)
            return None
        if response.status_code != 200:
            logger.warning(
                "engine metrics %s answered %s", self.triton_metrics_url, response.status_code
            )
            return None
        try:
            text = response.content.decode("utf-8")
            check_exposition(text)
        except ValueError as exc:  # UnicodeDecodeError is a ValueError too
            logger.warning(
                "engine metrics %s are not a valid exposition: %s", self.triton_metrics_url, exc
            )
            return None
        return text

    async def render(self) -> str:
        if self.multiproc_dir is None:
            return merge(await self.fetch_triton(), None)
        triton, vllm = await asyncio.gather(
            self.fetch_triton(),
            asyncio.to_thread(read_multiprocess, self.multiproc_dir, self._reader),
        )
        return merge(triton, vllm)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def metrics_endpoint(
    triton_metrics_url: str, multiproc_dir: Path | None, *, timeout: float = 2.0
) -> Callable[[], Awaitable[Response]]:
    """An async route handler (FastAPI, no arguments) answering the unified exposition."""
    unified = UnifiedMetrics(triton_metrics_url, multiproc_dir, timeout=timeout)

    async def metrics() -> Response:
        return Response(await unified.render(), media_type=CONTENT_TYPE)

    return metrics


def add_metrics_route(
    app: FastAPI,
    triton_metrics_url: str,
    multiproc_dir: Path | None,
    *,
    path: str = "/metrics",
    timeout: float = 2.0,
) -> None:
    """Mount :func:`metrics_endpoint` at ``path`` (GET, not in the OpenAPI schema)."""
    endpoint = metrics_endpoint(triton_metrics_url, multiproc_dir, timeout=timeout)
    app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False)
