"""The hooks through which the engine reports what it does, so metrics stay out of its loop.

:class:`serving.metrics.vllm_metrics.VllmMetrics` implements them with vLLM's metric names in
prometheus-client's multiprocess mode; :class:`serving.metrics.triton_vllm.TritonVllmMetrics`
with the families Triton's vLLM backend bridges into Triton's metrics endpoint;
:class:`FanOutStats` feeds both from one engine. Tests may pass their own recorder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class FinishedRequest:
    """Timings in seconds, measured by the engine with ``time.monotonic``."""

    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    n: int
    queue_time: float  # arrival → first scheduled
    prefill_time: float  # first scheduled → first token
    decode_time: float  # first token → last token
    inference_time: float  # first scheduled → last token
    e2e_latency: float  # arrival → finished
    # With n > 1 each completion finishes as a request of its own (as vLLM's child requests
    # do); what belongs to the parent request is reported once, with its last completion.
    last_of_parent: bool = True
    max_generation_tokens: int = 0  # over the parent's completions, set with the last one


class EngineStats(Protocol):
    def on_scheduler_step(self, running: int, waiting: int, slot_usage: float) -> None:
        """After every scheduler iteration: requests decoding, queued, and the fraction of
        batch slots (``max_num_seqs``) in use, the CPU engine's stand-in for KV-cache usage."""

    def on_prefill(
        self, prompt_tokens: int, prefix_cache_queries: int, prefix_cache_hits: int
    ) -> None:
        """One request's prompt was processed; queries and hits are counted in tokens."""

    def on_first_token(self, time_to_first_token: float) -> None: ...

    def on_tokens(self, generation_tokens: int, inter_token_latencies: list[float]) -> None:
        """Tokens generated in one decode step, with each row's time since its last token."""

    def on_finished(self, request: FinishedRequest) -> None: ...


class NullStats:
    """Records nothing (an engine without metrics, e.g. in unit tests)."""

    def on_scheduler_step(self, running: int, waiting: int, slot_usage: float) -> None:
        pass

    def on_prefill(
        self, prompt_tokens: int, prefix_cache_queries: int, prefix_cache_hits: int
    ) -> None:
        pass

    def on_first_token(self, time_to_first_token: float) -> None:
        pass

    def on_tokens(self, generation_tokens: int, inter_token_latencies: list[float]) -> None:
        pass

    def on_finished(self, request: FinishedRequest) -> None:
        pass


class FanOutStats:
    """Forwards every event to each sink in turn: one engine feeds vLLM's multiprocess metrics
    and the families Triton's vLLM backend bridges from the same events, so they agree.

    Sinks may be added before the engine serves (the bridged families' buckets depend on the
    engine's ``max_model_len``, known only once it has loaded)."""

    def __init__(self, *sinks: EngineStats) -> None:
        self.sinks: tuple[EngineStats, ...] = sinks

    def add(self, sink: EngineStats) -> None:
        self.sinks = (*self.sinks, sink)

    def on_scheduler_step(self, running: int, waiting: int, slot_usage: float) -> None:
        for sink in self.sinks:
            sink.on_scheduler_step(running, waiting, slot_usage)

    def on_prefill(
        self, prompt_tokens: int, prefix_cache_queries: int, prefix_cache_hits: int
    ) -> None:
        for sink in self.sinks:
            sink.on_prefill(prompt_tokens, prefix_cache_queries, prefix_cache_hits)

    def on_first_token(self, time_to_first_token: float) -> None:
        for sink in self.sinks:
            sink.on_first_token(time_to_first_token)

    def on_tokens(self, generation_tokens: int, inter_token_latencies: list[float]) -> None:
        for sink in self.sinks:
            sink.on_tokens(generation_tokens, inter_token_latencies)

    def on_finished(self, request: FinishedRequest) -> None:
        for sink in self.sinks:
            sink.on_finished(request)
