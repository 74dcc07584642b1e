"""The ``vllm:`` families Triton's vLLM backend bridges into Triton's own metrics endpoint.

With ``REPORT_CUSTOM_METRICS`` set to ``"true"`` in a model's ``config.pbtxt`` (and the engine's
``disable_log_stats`` false), Triton's vLLM backend (``src/utils/metrics.py``, ``TritonMetrics``
fed by a vLLM V1 stat logger) registers eight custom metric families with Triton, labelled
``{model, version}``, and Triton serves them on its metrics port next to ``nv_*``. Dashboards
and Triton's own CI test (``ci/L0_backend_vllm/metrics_test``) read them there, so the CPU
engine standing in for Triton serves the same families on its metrics port: the same names,
help texts, types, labels and buckets (which are *not* vLLM's own: the backend uses older,
shorter bucket lists, and ``vllm:time_per_output_token_seconds`` is fed with every
inter-token latency, a name vLLM itself no longer has).

The events are the ones that feed vLLM's multiprocess metrics
(:class:`serving.metrics.vllm_metrics.VllmMetrics`), through the same
:class:`~serving.engine.stats.EngineStats` hooks, so both always agree on what happened:

* ``vllm:prompt_tokens_total`` += the prompt's tokens at prefill (vLLM's
  ``IterationStats.num_prompt_tokens``);
* ``vllm:generation_tokens_total`` += tokens sampled in each step, the first one included
  (``num_generation_tokens``);
* ``vllm:time_to_first_token_seconds``: one observation per request, arrival to first token;
* ``vllm:time_per_output_token_seconds``: one observation per token after the first, the time
  since that request's previous token (``inter_token_latencies_iter``);
* ``vllm:e2e_request_latency_seconds``, ``vllm:request_prompt_tokens``,
  ``vllm:request_generation_tokens``, ``vllm:request_params_n``: one observation per finished
  request.

Like the ``nv_*`` families (:mod:`serving.kserve.triton_metrics`) these are plain numbers under
a lock, not prometheus-client objects: this process runs in prometheus-client's multiprocess
mode, which would write them into the ``.db`` files as well. :func:`render` writes them as
Triton's prometheus-cpp does: families exist (at zero) from model load on, a counter's sample
carries the family's name as is, a histogram's ``_count`` and ``_sum`` come before its
cumulative buckets, and numbers are C++ ``ostream`` doubles (``%.16g``).

The instance's unified ``/metrics`` (:mod:`serving.metrics.unified`) drops these bridged copies
wherever vLLM's multiprocess files hold a family of the same name;
``vllm:time_per_output_token_seconds`` has no multiprocess twin and stays.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing serving.engine at run time would pull in torch
    from serving.engine.stats import FinishedRequest

# The backend's bucket lists (``TritonMetrics.__init__``); the token-count histograms use vLLM's
# 1-2-5 series up to the engine's ``max_model_len``.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TIME_PER_OUTPUT_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
E2E_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
N_BUCKETS = (1, 2, 5, 10, 20)

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:time_per_output_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
PARAMS_N = "vllm:request_params_n"

# (name, help, type) in the backend's registration order.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    (PROMPT_TOKENS, "Number of prefill tokens processed.", "counter"),
    (GENERATION_TOKENS, "Number of generation tokens processed.", "counter"),
    (TTFT, "Histogram of time to first token in seconds.", "histogram"),
    (TIME_PER_OUTPUT_TOKEN, "Histogram of time per output token in seconds.", "histogram"),
    (E2E, "Histogram of end to end request latency in seconds.", "histogram"),
    (REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", "histogram"),
    (REQUEST_GENERATION_TOKENS, "Number of generation tokens processed.", "histogram"),
    (PARAMS_N, "Histogram of the n request parameter.", "histogram"),
)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


@dataclass
class Histogram:
    """Per-bucket (not cumulative) counts; the last slot counts what exceeds every bound."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # Prometheus buckets are upper-inclusive (``le``).
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def copy(self) -> Histogram:
        copy = Histogram(self.bounds)
        copy.counts, copy.sum, copy.count = list(self.counts), self.sum, self.count
        return copy


@dataclass
class Snapshot:
    """One model's values at one moment (what :func:`render` writes)."""

    model: str
    version: str
    counters: dict[str, float]
    histograms: dict[str, Histogram]


class TritonVllmMetrics:
    """:class:`~serving.engine.stats.EngineStats` keeping the backend's eight families for one
    model version. The engine's loop thread records; the metrics endpoint reads snapshots."""

    def __init__(self, model: str, version: str, max_model_len: int) -> None:
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        self.model = model
        self.version = version
        token_buckets = build_1_2_5_buckets(max_model_len)
        self._lock = threading.Lock()
        self._counters = {PROMPT_TOKENS: 0.0, GENERATION_TOKENS: 0.0}
        self._histograms = {
            TTFT: Histogram(TTFT_BUCKETS),
            TIME_PER_OUTPUT_TOKEN: Histogram(TIME_PER_OUTPUT_TOKEN_BUCKETS),
            E2E: Histogram(E2E_BUCKETS),
            REQUEST_PROMPT_TOKENS: Histogram(token_buckets),
            REQUEST_GENERATION_TOKENS: Histogram(token_buckets),
            PARAMS_N: Histogram(N_BUCKETS),
        }

    # --- EngineStats -----------------------------------------------------------------------

    def on_scheduler_step(self, running: int, waiting: int, slot_usage: float) -> None:
        pass  # the backend bridges no scheduler gauges

    def on_prefill(
        self, prompt_tokens: int, prefix_cache_queries: int, prefix_cache_hits: int
    ) -> None:
        with self._lock:
            self._counters[PROMPT_TOKENS] += prompt_tokens

    def on_first_token(self, time_to_first_token: float) -> None:
        with self._lock:
            self._histograms[TTFT].observe(time_to_first_token)

    def on_tokens(self, generation_tokens: int, inter_token_latencies: list[float]) -> None:
        with self._lock:
            self._counters[GENERATION_TOKENS] += generation_tokens
            histogram = self._histograms[TIME_PER_OUTPUT_TOKEN]
            for latency in inter_token_latencies:
                histogram.observe(latency)

    def on_finished(self, request: FinishedRequest) -> None:
        with self._lock:
            self._histograms[E2E].observe(request.e2e_latency)
            self._histograms[REQUEST_PROMPT_TOKENS].observe(request.prompt_tokens)
            self._histograms[REQUEST_GENERATION_TOKENS].observe(request.generation_tokens)
            if request.last_of_parent:  # once per request, as the backend's stat logger does
                self._histograms[PARAMS_N].observe(request.n)

    # --- reading ---------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                self.model,
                self.version,
                dict(self._counters),
                {name: h.copy() for name, h in self._histograms.items()},
            )


def _number(value: float) -> str:
    """A double as C++'s ``ostream`` writes it at prometheus-cpp's precision (``%.16g``)."""
    if value == float("inf"):
        return "+Inf"
    return f"{value:.16g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(metrics: list[TritonVllmMetrics]) -> str:
    """The eight families of every model in ``metrics``; empty when there is none (a model
    without ``REPORT_CUSTOM_METRICS`` has no ``vllm:`` line on Triton's port either)."""
    if not metrics:
        return ""
    snapshots = [m.snapshot() for m in metrics]
    lines: list[str] = []
    for name, help_text, kind in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for s in snapshots:
            labels = f'model="{_escape(s.model)}",version="{_escape(s.version)}"'
            if kind == "counter":
                lines.append(f"{name}{{{labels}}} {_number(s.counters[name])}")
                continue
            h = s.histograms[name]
            lines.append(f"{name}_count{{{labels}}} {h.count}")
            lines.append(f"{name}_sum{{{labels}}} {_number(h.sum)}")
            cumulative = 0
            for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
                cumulative += count
                lines.append(f'{name}_bucket{{{labels},le="{_number(bound)}"}} {cumulative}')
    return "\n".join(lines) + "\n"
