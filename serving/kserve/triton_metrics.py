"""Triton-style per-model statistics: the numbers behind ``ModelStatistics`` (gRPC), ``/stats``
(HTTP) and the ``nv_inference_*`` families on the metrics port.

Names, help texts and labels follow Triton core (``src/metrics.cc``,
``src/metric_model_reporter.cc``): counters labelled ``model`` and ``version``;
``nv_inference_request_failure`` also carries ``reason`` (``REJECTED``, ``CANCELED``,
``BACKEND``, ``OTHER``), every reason present from the start as Triton initializes them.

These are deliberately *not* prometheus-client metric objects: this process runs with
``PROMETHEUS_MULTIPROC_DIR`` set for the vLLM-named metrics, and prometheus-client would put
any Counter created here into the multiprocess ``.db`` files too, so the unified endpoint
would show them twice. Plain counters under a lock are rendered by :func:`render`, which
writes the exposition the way Triton's prometheus-cpp does (counter samples without a
``_total`` suffix, which prometheus-client's own writer would add to the family name).

What the durations mean on the CPU engine, where there is no Triton scheduler in front of
the model: *queue* is arrival to the first response (the engine's queue and prefill),
*compute input* is decoding the request tensors, *compute infer* is first response to last,
*compute output* is building the response tensors; *request* is arrival to the final
response. A request counts as one inference and one execution (batch size 1, as decoupled
models report), except for Python-backend models, whose executions (one ``execute`` call may
carry several requests) and inferences (batch-size units) are counted where ``execute`` runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, ns)


@dataclass
class ModelStats:
    """One model version's counters; mutate only through :class:`StatsRecorder`."""

    name: str
    version: str
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    pending: int = 0
    # (inference count, execution count) from the model itself, when it counts them.
    counts: Callable[[], tuple[int, int]] | None = None


class RequestTimer:
    """Timestamps of one request, recorded into its model's stats when it ends."""

    def __init__(self, recorder: StatsRecorder, stats: ModelStats) -> None:
        self.recorder = recorder
        self.stats = stats
        self.start = time.monotonic_ns()
        self.first_response = 0
        self.input_ns = 0
        self.output_ns = 0
        self.done = False
        recorder.change_pending(stats, +1)

    def responded(self) -> None:
        if not self.first_response:
            self.first_response = time.monotonic_ns()
            self.recorder.change_pending(self.stats, -1)

    def succeeded(self) -> None:
        self._end(None)

    def failed(self, reason: str) -> None:
        self._end(reason)

    def _end(self, reason: str | None) -> None:
        if self.done:
            return
        self.done = True
        now = time.monotonic_ns()
        if not self.first_response:
            self.recorder.change_pending(self.stats, -1)
        self.recorder.record(self, now, reason)


class StatsRecorder:
    """Every served model's stats behind one lock (the gRPC and HTTP servers share it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.models: dict[str, ModelStats] = {}

    def add_model(
        self, name: str, version: str, counts: Callable[[], tuple[int, int]] | None = None
    ) -> ModelStats:
        stats = ModelStats(name, version, counts=counts)
        self.models[name] = stats
        return stats

    def timer(self, name: str) -> RequestTimer:
        return RequestTimer(self, self.models[name])

    def change_pending(self, stats: ModelStats, delta: int) -> None:
        with self._lock:
            stats.pending += delta

    def record(self, timer: RequestTimer, now: int, reason: str | None) -> None:
        first = timer.first_response or now
        with self._lock:
            stats = timer.stats
            if reason is None:
                stats.success.add(now - timer.start)
                stats.queue.add(first - timer.start)
                stats.compute_input.add(timer.input_ns)
                stats.compute_infer.add(now - first)
                stats.compute_output.add(timer.output_ns)
                stats.inference_count += 1
                stats.execution_count += 1
                stats.last_inference_ms = int(time.time() * 1000)
            else:
                stats.fail.add(now - timer.start)
                stats.failures[reason] += 1

    def snapshot(self) -> list[ModelStats]:
        """Consistent copies, sorted by model name."""
        with self._lock:
            return [
                ModelStats(
                    s.name,
                    s.version,
                    Duration(s.success.count, s.success.ns),
                    Duration(s.fail.count, s.fail.ns),
                    dict(s.failures),
                    Duration(s.queue.count, s.queue.ns),
                    Duration(s.compute_input.count, s.compute_input.ns),
                    Duration(s.compute_infer.count, s.compute_infer.ns),
                    Duration(s.compute_output.count, s.compute_output.ns),
                    *(
                        s.counts()
                        if s.counts is not None
                        else (s.inference_count, s.execution_count)
                    ),
                    s.last_inference_ms,
                    s.pending,
                )
                for _, s in sorted(self.models.items())
            ]


# --- exposition -----------------------------------------------------------------------------

_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        "success",
    ),
    (
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        "failure",
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        "inference_count",
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        "execution_count",
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        "request_us",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        "queue_us",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "input_us",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "infer_us",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        "output_us",
    ),
)


def _value(stats: ModelStats, key: str) -> int:
    if key == "success":
        return stats.success.count
    if key in ("inference_count", "execution_count"):
        return int(getattr(stats, key))
    if key == "request_us":  # successful and failed requests, as Triton counts them
        return (stats.success.ns + stats.fail.ns) // 1000
    source = {"queue_us": stats.queue, "input_us": stats.compute_input}
    source |= {"infer_us": stats.compute_infer, "output_us": stats.compute_output}
    return source[key].ns // 1000


def _labels(**labels: str) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


def render(recorder: StatsRecorder) -> str:
    """The Prometheus text exposition (format 0.0.4) of every model's counters."""
    models = recorder.snapshot()
    lines: list[str] = []
    for name, help_text, key in _COUNTERS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for s in models:
            if key == "failure":
                for reason in REASONS:
                    labels = _labels(model=s.name, reason=reason, version=s.version)
                    lines.append(f"{name}{labels} {s.failures[reason]}")
            else:
                lines.append(f"{name}{_labels(model=s.name, version=s.version)} {_value(s, key)}")
    name = "nv_inference_pending_request_count"
    lines += [
        f"# HELP {name} Instantaneous number of pending requests awaiting execution per-model.",
        f"# TYPE {name} gauge",
    ]
    lines += [f"{name}{_labels(model=s.name, version=s.version)} {s.pending}" for s in models]
    return "\n".join(lines) + "\n"


def merge_families(texts: list[str]) -> str:
    """Several Prometheus text expositions as one, each family's ``HELP``/``TYPE`` once.

    Python models' custom metric families live server-wide in Triton: two models that create a
    family of the same name add their series to that one family. Each model renders its own
    here, so the families are joined by name (the first model's help text and type win;
    :mod:`serving.python_backend.metrics` refuses nothing across models)."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] | None = None
    for text in texts:
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                header, samples = families.setdefault(name, ([], []))
                kind = line[:7]
                if not any(h.startswith(kind) for h in header):
                    header.append(line)
                current = samples
            elif current is not None and line not in current:
                current.append(line)
    lines: list[str] = []
    for header, samples in families.values():
        lines += header + samples
    return "\n".join(lines) + ("\n" if lines else "")
