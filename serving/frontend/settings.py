"""How one front-end process is configured (CLI flags of ``python -m serving.frontend``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from serving.request_limits import max_body_bytes


@dataclass(frozen=True)
class Settings:
    model_repository: Path
    kserve_grpc: str = "127.0.0.1:8001"  # host:port of the engine's KServe v2 gRPC
    kserve_http: str = "127.0.0.1:8000"  # host:port (or URL) of its KServe v2 HTTP
    kserve_metrics: str = "http://127.0.0.1:8002/metrics"  # the engine's Triton-style metrics
    openai: bool = True  # False: standalone mode, only health and /metrics
    # Triton's OpenAI front end default (--default-max-tokens) when a request sets none.
    default_max_tokens: int = 16
    engine_timeout: float = 600.0  # seconds one engine stream may last
    # Where the engine writes vLLM-named metrics (default: $PROMETHEUS_MULTIPROC_DIR).
    multiproc_dir: Path | None = None
    # Tool-call format under tool_choice auto for models whose config.pbtxt names none.
    tool_call_parser: str = "hermes"
    # Request bodies over this many bytes are refused with 413 ($SERVING_MAX_BODY_BYTES).
    max_body_bytes: int = field(default_factory=max_body_bytes)
