"""vLLM's Prometheus metrics, fed by the CPU engine, written in prometheus-client multiprocess
mode so that another process (the front end's unified ``/metrics``) can read them from disk.

Names, types, help texts, label names (``model_name``, ``engine``), gauge ``multiprocess_mode``
and histogram buckets follow vLLM 0.24.0 (``vllm/v1/metrics/loggers.py``,
``PrometheusStatLogger``), so dashboards built for vLLM work unchanged.

Produced (the engine feeds each through :class:`serving.engine.stats.EngineStats`):
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(the CPU engine has no paged KV cache: it reports the fraction of its ``max_num_seqs`` batch
slots in use), ``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits`` (the engine has no
prefix cache: queries count, hits stay 0, which is the truth), ``vllm:num_preemptions`` (the
engine never preempts: always 0, present so a dashboard's query does not go empty),
``vllm:prompt_tokens``, ``vllm:generation_tokens``, ``vllm:request_success``, the latency
histograms (``time_to_first_token``, ``inter_token_latency``,
``request_time_per_output_token``, ``e2e_request_latency``, ``request_queue_time``,
``request_prefill_time``, ``request_decode_time``, ``request_inference_time``), the per-request
count histograms (``request_prompt_tokens``, ``request_generation_tokens``,
``request_params_max_tokens``, ``request_params_n`` and ``request_max_num_generation_tokens``,
the last two once per request when ``n`` > 1, as vLLM records them when its last completion
finishes) and ``vllm:iteration_tokens_total``.

Not produced, because nothing in the CPU engine could feed them truthfully:
``num_requests_waiting_by_reason`` (no deferred/skipped queue), ``engine_sleep_state`` (no
sleep mode), ``corrupted_requests`` (only with ``VLLM_COMPUTE_NANS_IN_LOGITS``),
``external_prefix_cache_*`` and the KV-connector families (no KV connector), ``mm_cache_*``
(no multi-modal input), ``prompt_tokens_by_source`` / ``prompt_tokens_cached`` /
``request_prefill_kv_computed_tokens`` (no cache to split prompt tokens by),
``kv_block_*`` (no KV blocks), ``lora_requests_info`` (no LoRA),
``cache_config_info`` (no vLLM ``CacheConfig``), and the speculative-decoding and
performance families (neither exists here).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values

from serving.metrics.triton_vllm import build_1_2_5_buckets

if TYPE_CHECKING:  # importing serving.engine at run time would pull in torch
    from serving.engine.stats import FinishedRequest

LABELS = ["model_name", "engine"]
# vLLM initializes every FinishReason's counter child (str(FinishReason) values).
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# Used for the token-count histograms when the caller cannot say the model's context length
# yet (the engine is built after its stats); vLLM bounds those buckets by ``max_model_len``.
DEFAULT_MAX_MODEL_LEN = 8192

TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
TOKEN_LATENCY_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]


class MultiprocessModeError(RuntimeError):
    """prometheus-client was imported without ``PROMETHEUS_MULTIPROC_DIR``: values would stay in
    this process and the unified endpoint would never see them."""


class VllmMetrics:
    """:class:`~serving.engine.stats.EngineStats` writing vLLM's metrics.

    Each instance registers its metrics in a private :class:`CollectorRegistry`, so building two
    in one process (tests, or several models in one engine process) never clashes on names;
    the values still go to the multiprocess ``.db`` files, which is what the unified endpoint
    reads. Two instances with the same ``model_name`` and ``engine_index`` in one process would
    share (and overwrite) the same file entries: give each model its own name.
    """

    def __init__(
        self,
        model_name: str,
        *,
        max_model_len: int | None = None,
        engine_index: int = 0,
    ) -> None:
        if values.ValueClass is values.MutexValue:
            raise MultiprocessModeError(
                "PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is imported"
            )
        if max_model_len is not None and max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        self.registry = CollectorRegistry(auto_describe=True)
        labels = (model_name, str(engine_index))
        token_buckets = list(build_1_2_5_buckets(max_model_len or DEFAULT_MAX_MODEL_LEN))
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            metric = Gauge(name, doc, LABELS, registry=reg, multiprocess_mode="mostrecent")
            return metric.labels(*labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=reg).labels(*labels)

        def histogram(name: str, doc: str, buckets: list[float] | list[int]) -> Histogram:
            metric = Histogram(name, doc, LABELS, registry=reg, buckets=buckets)
            return metric.labels(*labels)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=reg,
        )
        self.request_success = {r: success.labels(*labels, r) for r in FINISH_REASONS}
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        )
        self.max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        )
        latency = {
            "e2e": ("vllm:e2e_request_latency_seconds", "e2e request latency in seconds"),
            "queue": ("vllm:request_queue_time_seconds", "time spent in WAITING phase"),
            "inference": ("vllm:request_inference_time_seconds", "time spent in RUNNING phase"),
            "prefill": ("vllm:request_prefill_time_seconds", "time spent in PREFILL phase"),
            "decode": ("vllm:request_decode_time_seconds", "time spent in DECODE phase"),
        }
        self.latency = {
            key: histogram(
                name,
                f"Histogram of {what}." if key == "e2e" else f"Histogram of {what} for request.",
                REQUEST_LATENCY_BUCKETS,
            )
            for key, (name, what) in latency.items()
        }
        # Tokens computed since the last scheduler step: vLLM observes one value per engine step.
        self._lock = threading.Lock()
        self._iteration_tokens = 0

    # --- EngineStats -----------------------------------------------------------------------

    def on_scheduler_step(self, running: int, waiting: int, slot_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_cache_usage.set(slot_usage)
        with self._lock:
            tokens, self._iteration_tokens = self._iteration_tokens, 0
        if tokens:
            self.iteration_tokens.observe(tokens)

    def on_prefill(
        self, prompt_tokens: int, prefix_cache_queries: int, prefix_cache_hits: int
    ) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_cache_queries.inc(prefix_cache_queries)
        self.prefix_cache_hits.inc(prefix_cache_hits)
        with self._lock:
            self._iteration_tokens += prompt_tokens

    def on_first_token(self, time_to_first_token: float) -> None:
        self.ttft.observe(time_to_first_token)

    def on_tokens(self, generation_tokens: int, inter_token_latencies: list[float]) -> None:
        self.generation_tokens.inc(generation_tokens)
        for latency in inter_token_latencies:
            self.inter_token_latency.observe(latency)
        with self._lock:
            self._iteration_tokens += generation_tokens

    def on_finished(self, request: FinishedRequest) -> None:
        reason = request.finish_reason
        if reason not in self.request_success:
            raise ValueError(f"finish_reason {reason!r} is not one of {FINISH_REASONS}")
        self.request_success[reason].inc()
        self.latency["e2e"].observe(request.e2e_latency)
        self.latency["queue"].observe(request.queue_time)
        self.latency["prefill"].observe(request.prefill_time)
        self.latency["inference"].observe(request.inference_time)
        self.latency["decode"].observe(request.decode_time)
        self.request_prompt_tokens.observe(request.prompt_tokens)
        self.request_generation_tokens.observe(request.generation_tokens)
        # As vLLM: the prefill's token is not a decode step.
        decoded = request.generation_tokens - 1
        self.time_per_output_token.observe(request.decode_time / decoded if decoded > 0 else 0.0)
        if request.last_of_parent:
            self.params_n.observe(request.n)
            self.max_num_generation_tokens.observe(request.max_generation_tokens)
        if request.max_tokens:
            self.params_max_tokens.observe(request.max_tokens)
