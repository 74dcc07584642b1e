"""What each request through the front end was like, kept for the rollout's canary analysis.

A bake compares the new version with the old one request by request (time to first token,
latency, tokens, how the answer ended, whether it was empty, whether structured output held its
schema: :mod:`portal.deployments.rollout.judge`). Only the front end sees all of that, on CPU
instances and on Triton ones alike, so it keeps one :class:`Observation` per finished request in
a ring of fixed size and serves them at ``GET /observations?after=<seq>`` for the controller to
read (the gateway never forwards that path: it maps a route's paths under ``v1/``).

Cost on the request path: a few attribute reads and a clock reading. The checks (JSON parsing
and schema validation of structured answers) run after the answer is sent: for a whole
response as the response's background task, for a stream after its last event. Memory is
bounded by the ring (``SERVING_OBSERVATIONS``, default 20,000 records of about 300 bytes). Above
``SERVING_OBSERVE_PER_SECOND`` requests per second (default 200) a random share is kept, so the
sample stays uniform over time and the work per second stays bounded; 0 turns observing off.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import jsonschema

from serving.frontend.protocol import ChatCompletionRequest
from serving.rate_sampler import RateSampler

if TYPE_CHECKING:
    from serving.frontend.generation import Generation

DEFAULT_CAPACITY = 20_000
DEFAULT_PER_SECOND = 200.0
#: The most observations one read returns; the reader pages with ``after``.
MAX_READ = 5_000


@dataclass(frozen=True, slots=True)
class Observation:
    """One finished request. Times in seconds; ``None`` where a request has no such value (a
    whole response has no time to first token; a refused one has no tokens)."""

    seq: int
    at: float  # when it ended (Unix time)
    model: str
    route: str  # "chat" | "completions"
    status: int  # what the caller got; a stream that broke after its 200 is 500 here
    latency_s: float
    ttft_s: float | None
    tpot_s: float | None  # (latency - ttft) per output token after the first
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None  # the first choice's; "length" if any choice was cut short
    empty: bool | None  # no text and no tool call in any choice
    structured: bool  # the request asked for JSON (response_format) or may call tools
    structured_valid: bool | None  # every choice's JSON parsed and held its schema
    greedy: bool  # temperature 0: the same prompt should give the same answer
    error: str | None  # the OpenAI error type of a refused or failed request


class ObservationLog:
    """The ring of recent observations; one per front-end process."""

    def __init__(self, capacity: int, per_second: float) -> None:
        self.capacity = capacity
        self.per_second = per_second
        self._ring: deque[Observation] = deque(maxlen=capacity)
        self._seq = 0
        self._sampler = RateSampler(per_second)
        self.started = time.time()

    @classmethod
    def from_env(cls) -> ObservationLog:
        return cls(
            int(os.environ.get("SERVING_OBSERVATIONS", DEFAULT_CAPACITY)),
            float(os.environ.get("SERVING_OBSERVE_PER_SECOND", DEFAULT_PER_SECOND)),
        )

    @property
    def skipped(self) -> int:
        """Requests sampled out above the rate."""
        return self._sampler.skipped

    def wanted(self) -> bool:
        """Whether to observe the request starting now (:class:`RateSampler`)."""
        return self._sampler.wanted()

    def add(self, **fields: Any) -> Observation:
        self._seq += 1
        observation = Observation(seq=self._seq, **fields)
        self._ring.append(observation)
        return observation

    def read(self, after: int, limit: int = MAX_READ) -> dict[str, Any]:
        """Observations newer than ``after``, oldest first. ``next`` is the ``after`` of the
        next read; ``lost`` counts those that left the ring before this read (the reader came
        too late for them); ``last`` below the reader's ``after`` means the process restarted
        (sequence numbers start again at 1 with ``started``)."""
        ring = list(self._ring)
        oldest = ring[0].seq if ring else self._seq + 1
        newer = [o for o in ring if o.seq > after][: max(1, min(limit, MAX_READ))]
        return {
            "started": self.started,
            "next": newer[-1].seq if newer else after,
            "last": self._seq,
            "lost": max(0, oldest - after - 1),
            "skipped": self.skipped,
            "observations": [asdict(o) for o in newer],
        }


def record_generation(
    log: ObservationLog,
    generation: Generation,
    *,
    streamed: bool,
    status: int = 200,
    error: str | None = None,
) -> Observation:
    """Observe a finished chat or completion request (its checks included). Time to first
    token only for a stream: a whole response's first token reaches nobody before the last."""
    request = generation.request
    latency = time.monotonic() - generation.started
    first = generation.first_output_at
    ttft = first - generation.started if streamed and first is not None else None
    usage = generation.usage()
    completion = usage["completion_tokens"] if status == 200 else None
    tpot = None
    if ttft is not None and completion is not None and completion > 1:
        tpot = (latency - ttft) / (completion - 1)
    choices = sorted(generation.choices.values(), key=lambda c: c.index)
    reasons = [c.finish_reason for c in choices]
    finish = "length" if "length" in reasons else (reasons[0] if reasons else None)
    structured = _wants_structure(request)
    checked = _check_structure(generation) if structured and status == 200 else None
    return log.add(
        at=time.time(),
        model=generation.model,
        route="chat" if isinstance(request, ChatCompletionRequest) else "completions",
        status=status,
        latency_s=latency,
        ttft_s=ttft,
        tpot_s=tpot,
        prompt_tokens=usage["prompt_tokens"] if status == 200 else None,
        completion_tokens=completion,
        finish_reason=finish if status == 200 else None,
        empty=_empty(generation) if status == 200 else None,
        structured=structured,
        structured_valid=checked,
        greedy=request.temperature == 0,
        error=error,
    )


def record_refusal(
    log: ObservationLog, model: str, route: str, started: float, status: int, error: str
) -> Observation:
    """Observe a request that got an error instead of an answer (``started``: its
    time.monotonic() on arrival)."""
    return log.add(
        at=time.time(),
        model=model,
        route=route,
        status=status,
        latency_s=time.monotonic() - started,
        ttft_s=None,
        tpot_s=None,
        prompt_tokens=None,
        completion_tokens=None,
        finish_reason=None,
        empty=None,
        structured=False,
        structured_valid=None,
        greedy=False,
        error=error,
    )


def _wants_structure(request: Any) -> bool:
    response_format = getattr(request, "response_format", None)
    if response_format is not None and response_format.type in ("json_object", "json_schema"):
        return True
    return bool(getattr(request, "tools", None)) and getattr(request, "tool_choice", None) != "none"


def _empty(generation: Generation) -> bool:
    for choice in generation.choices.values():
        if "".join(choice.text).strip():
            return False
        if choice.reader is not None and choice.reader.all_calls():
            return False
    return True


def _check_structure(generation: Generation) -> bool:
    """Every choice's structured part is valid: its text as the response format asks (JSON, of
    the schema if one is given), and each tool call's arguments as its tool's parameters."""
    request = generation.request
    response_format = getattr(request, "response_format", None)
    schema = None
    if response_format is not None and response_format.json_schema is not None:
        schema = response_format.json_schema.schema_
    tools = {t.function.name: t.function.parameters for t in getattr(request, "tools", None) or []}
    for choice in generation.choices.values():
        calls = choice.reader.all_calls() if choice.reader is not None else []
        if calls:
            for call in calls:
                if not _valid_json(call.arguments, tools.get(call.name), object_only=True):
                    return False
        elif response_format is not None and response_format.type != "text":
            if not _valid_json("".join(choice.text), schema, object_only=schema is None):
                return False
        elif tools and getattr(request, "tool_choice", None) == "required":
            return False  # a call was required and none came
    return True


def _valid_json(text: str, schema: dict[str, Any] | None, *, object_only: bool) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if object_only and not isinstance(value, dict):
        return False
    if schema is None:
        return True
    try:
        return bool(jsonschema.validators.validator_for(schema)(schema).is_valid(value))
    except jsonschema.SchemaError:
        return True  # the schema was checked when the request came; never blame the model
