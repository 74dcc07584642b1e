"""The hooks through which the engine reports what it does, so metrics stay out of its loop.

:class:`serving.metrics.vllm_metrics.VllmMetrics` implements them with vLLM's metric names in
prometheus-client's multiprocess mode; tests may pass their own recorder.
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
