"""Constraint-processor benchmark: per-decode-step time of mask fill + apply against batch size.

Run from the repository root (``./dev bench`` installs the peers and runs this)::

    python bench/constraints.py --quick          # a small grid, about a minute
    python bench/constraints.py                  # the full grid (about 20 minutes on 2 cores)

Every engine is driven through the same teacher-forced token streams over the same synthetic
byte-level vocabulary (``bench/synthetic_vocab.py``). One decode step, timed from the Python call
boundary, is: advance every row by its next token, fill the bitmask ``[B, ceil(V/32)]``, apply it
to float32 logits ``[B, V]``. Engines:

- ``native``: ``NativeEngine`` batch (live output lists, one ``fill`` call) + ``apply_bitmask_``.
- ``reference``: ``ReferenceEngine`` batch through the same harness (the stand-in for ``native``
  while it did not exist; not in the default list).
- ``baseline``: per-request sequential processing as vLLM V0's per-request logits processors did
  it: for each row in Python, the reference constraint's allowed-token list for the row's state
  (memoized per state), as a tensor, ``mask = full(-inf); mask[allowed] = 0; logits[row] += mask``.
- ``xgrammar``: one ``GrammarMatcher`` per row, ``accept_token`` per row,
  ``BatchGrammarMatcher.batch_fill_next_token_bitmask`` and ``xgr.apply_token_bitmask_inplace``
  (CPU kernel).
- ``llguidance``: one ``LLMatcher`` per row, ``consume_token`` per row,
  ``llguidance.numpy.fill_next_token_bitmask_par`` on an ``LLExecutor``, then ``apply_bitmask_``.

Before timing each (vocabulary, constraint), every engine runs the same steps on a small batch
and the masks it applied (read back from the logits) are compared: they must be identical, except
that llguidance may allow a subset. Observed: where the next bytes are forced (one catalog entry
left), llguidance allows only the first token of its tokenizer's own tokenization of them, while
the documented semantics allow every token that keeps the output a prefix of a choice.

Results go to a JSON file and a Markdown summary next to it (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.synthetic_vocab import (  # noqa: E402
    ADDRESS_REGEX,
    GreedyTokenizer,
    Streams,
    address,
    catalog,
    synthetic_vocab,
    text_streams,
    token_streams,
)
from serving.constraints.engine import allocate_bitmask, bitmask_words  # noqa: E402
from serving.constraints.spec import Choice, ConstraintSpec, Regex, TokenSet  # noqa: E402
from serving.constraints.vocab import Vocabulary  # noqa: E402

ENGINES = ("native", "reference", "baseline", "xgrammar", "llguidance")
DEFAULT_ENGINES = ("native", "baseline", "xgrammar", "llguidance")
# Engines whose masks must equal the documented semantics exactly.
EXACT_ENGINES = ("native", "reference", "baseline", "xgrammar")
ALLOWED_SET_SIZE = 1000
N_STREAMS = 1000


# --------------------------------------------------------------------------------------------
# Grid settings


@dataclass(frozen=True)
class Plan:
    vocab_sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    choice_sizes: tuple[int, ...]
    workloads: tuple[str, ...]  # "choice" (one per choice size), "regex", "allowed-set"
    warmup_steps: int  # at most this many warm-up steps ...
    warmup_cap_s: float  # ... or this much time, whichever comes first (at least 3 steps)
    min_steps: int  # timed steps wanted for a p99
    max_steps: int
    budget_s: float  # target timed time per configuration
    slow_cap_s: float  # when min_steps would take longer than this, fewer steps ...
    floor_steps: int  # ... but never fewer than this
    verify_rows: int
    verify_steps: int
    peer_max_choices: int  # xgrammar/llguidance choice workloads up to this many strings
    compile_catalog: int  # catalog size for the compile-time measurement
    compile_vocab: int


FULL = Plan(
    vocab_sizes=(32_000, 128_256, 262_144),
    batch_sizes=(1, 8, 32, 128, 256),
    choice_sizes=(10_000, 1_000_000),
    workloads=("choice", "regex", "allowed-set"),
    warmup_steps=30,
    warmup_cap_s=1.0,
    min_steps=200,
    max_steps=3000,
    budget_s=1.5,
    slow_cap_s=4.0,
    floor_steps=25,
    verify_rows=8,
    verify_steps=40,
    peer_max_choices=10_000,
    compile_catalog=100_000,
    compile_vocab=128_256,
)

QUICK = Plan(
    vocab_sizes=(128_256,),
    batch_sizes=(1, 8, 32, 128),
    choice_sizes=(1_000,),
    workloads=("choice", "regex", "allowed-set"),
    warmup_steps=5,
    warmup_cap_s=0.1,
    min_steps=30,
    max_steps=300,
    budget_s=0.15,
    slow_cap_s=0.3,
    floor_steps=10,
    verify_rows=4,
    verify_steps=20,
    peer_max_choices=10_000,
    compile_catalog=100_000,
    compile_vocab=128_256,
)


# --------------------------------------------------------------------------------------------
# Workloads: a constraint, its equivalents for the peers, and teacher-forced streams


def regex_escape(text: str) -> str:
    """Escape regex metacharacters only (Python's re.escape also escapes spaces, which
    XGrammar's regex parser warns about)."""
    return "".join("\\" + c if c in "\\.^$*+?{}[]|()-/" else c for c in text)


def ebnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass
class Workload:
    name: str
    spec: ConstraintSpec
    streams: Streams
    regex: str | None = None  # the equivalent regex (llguidance; XGrammar when ebnf is None)
    ebnf: str | None = None  # the equivalent EBNF grammar (XGrammar)
    n_choices: int = 0
    peer_skip: dict[str, str] = field(default_factory=dict)


def choice_workload(vocab: Vocabulary, n_titles: int, n_streams: int = N_STREAMS) -> Workload:
    titles = catalog(n_titles)
    rng = random.Random(n_titles)
    picked = [titles[rng.randrange(n_titles)] for _ in range(n_streams)]
    return Workload(
        name=f"choice-{_count(n_titles)}",
        spec=Choice(tuple(titles)),
        streams=text_streams(vocab, picked),
        regex="(" + "|".join(regex_escape(t) for t in titles) + ")",
        ebnf="root ::= " + " | ".join(ebnf_literal(t) for t in titles),
        n_choices=n_titles,
    )


def regex_workload(vocab: Vocabulary, n_streams: int = N_STREAMS) -> Workload:
    rng = random.Random(5)
    texts = [address(rng) for _ in range(n_streams)]
    assert all(re.fullmatch(ADDRESS_REGEX, t, re.ASCII) for t in texts)
    return Workload(
        name="regex",
        spec=Regex(ADDRESS_REGEX),
        streams=text_streams(vocab, texts),
        regex=ADDRESS_REGEX,
    )


def allowed_set_workload(vocab: Vocabulary, n_streams: int = N_STREAMS) -> Workload:
    rng = random.Random(11)
    candidates = [i for i, tok in enumerate(vocab.tokens) if tok]
    allowed = sorted(rng.sample(candidates, min(ALLOWED_SET_SIZE, len(candidates))))
    reason = "no equivalent constraint (a set of token IDs) in this peer's grammar API"
    return Workload(
        name=f"allowed-set-{_count(len(allowed))}",
        spec=TokenSet(frozenset(allowed), banned=False),
        streams=token_streams(vocab, allowed, n_streams),
        peer_skip={"xgrammar": reason, "llguidance": reason},
    )


def _count(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# --------------------------------------------------------------------------------------------
# Per-vocabulary state shared by the engines (tokenizers, engines, compiled constraints)


class VocabContext:
    """Per-vocabulary setup, built on first use; how long each took is kept in ``setup_s``
    (the compile-time table reports it apart from compiling)."""

    def __init__(self, vocab: Vocabulary, threads: int) -> None:
        self.vocab = vocab
        self.threads = threads
        self.setup_s: dict[str, float] = {}
        self._built: dict[str, Any] = {}

    def _once(self, name: str, build: Callable[[], Any]) -> Any:
        if name not in self._built:
            t0 = time.perf_counter()
            self._built[name] = build()
            self.setup_s[name] = time.perf_counter() - t0
        return self._built[name]

    def native_engine(self) -> Any:
        from serving.constraints.native import NativeEngine

        return self._once("native", lambda: NativeEngine(self.vocab))

    def reference_engine(self) -> Any:
        from serving.constraints.reference import ReferenceEngine

        return self._once("reference", lambda: ReferenceEngine(self.vocab))

    def xgr_info(self) -> Any:
        def build() -> Any:
            import xgrammar as xgr

            return xgr.TokenizerInfo(
                list(self.vocab.tokens),
                xgr.VocabType.RAW,
                vocab_size=self.vocab.size,
                stop_token_ids=list(self.vocab.eos_token_ids),
            )

        return self._once("xgrammar", build)

    def ll_tokenizer(self) -> Any:
        def build() -> Any:
            import llguidance

            return llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_LLTokenizerSource(self.vocab)),
                n_vocab=self.vocab.size,
                eos_token=list(self.vocab.eos_token_ids),
            )

        return self._once("llguidance", build)


class _LLTokenizerSource:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer: the byte tokens, EOS, the
    special IDs, and an encode function (the same greedy tokenizer that made the streams)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.eos_token_id = vocab.eos_token_ids[0]
        self.bos_token_id = None
        self.tokens = list(vocab.tokens)
        self.special_token_ids = [i for i, tok in enumerate(vocab.tokens) if not tok]
        self._tokenizer = GreedyTokenizer(vocab)

    def __call__(self, text: bytes | str) -> list[int]:
        return self._tokenizer.encode(text.encode() if isinstance(text, str) else text)


def llguidance_limits() -> Any:
    """llguidance's default limits refuse a 1M-string alternation ("initial lexer configuration
    too big"); these are raised so every catalog the grid asks for compiles."""
    import llguidance

    return llguidance.LLParserLimits(
        initial_lexer_fuel=10**10, step_lexer_fuel=10**9, max_lexer_states=10**7
    )


# --------------------------------------------------------------------------------------------
# Engines under test. Each has: admit(row) (untimed), prepare(feed) (untimed: the (row, token)
# pairs to feed this step), then the timed phases advance(), fill(), apply(logits).


class Runner:
    name = ""
    bitmask: np.ndarray | None = None  # the engine's own bitmask after fill(), if it has one

    def admit(self, row: int) -> None:
        raise NotImplementedError

    def prepare(self, feed: list[tuple[int, int]]) -> None:
        self.feed = feed

    def advance(self) -> None:
        raise NotImplementedError

    def fill(self) -> None:
        raise NotImplementedError

    def apply(self, logits: torch.Tensor) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the runner holds."""


def native_apply_available() -> bool:
    try:
        from serving.constraints import _native  # noqa: F401
    except ImportError:
        return False
    return True


def apply_bitmask(logits: torch.Tensor, bitmask: np.ndarray) -> None:
    from serving.constraints.apply import apply_bitmask_

    apply_bitmask_(logits, bitmask)


class BatchEngineRunner(Runner):
    """``native`` or ``reference``: the engine's Batch with live output lists (as the vLLM
    adapter uses it), one ``fill`` per step, then ``apply_bitmask_``."""

    def __init__(self, name: str, engine: Any, compiled: Any, rows: int) -> None:
        self.name = name
        self.compiled = compiled
        self.batch = engine.new_batch(rows)
        self.outputs: list[list[int]] = [[] for _ in range(rows)]
        self.bitmask = allocate_bitmask(rows, engine.vocab.size)
        self.dead: list[int] = []

    def admit(self, row: int) -> None:
        self.outputs[row] = []
        self.batch.add(row, self.compiled, self.outputs[row])

    def prepare(self, feed: list[tuple[int, int]]) -> None:
        self.feed = [(self.outputs[row], token) for row, token in feed]

    def advance(self) -> None:
        for output, token in self.feed:
            output.append(token)

    def fill(self) -> None:
        self.dead = self.batch.fill(self.bitmask)

    def apply(self, logits: torch.Tensor) -> None:
        apply_bitmask(logits, self.bitmask)


class BaselineRunner(Runner):
    """Per-request, sequential, as the first published (vLLM V0) per-request processors: one
    Python call per row, the allowed-token list memoized per state, a dense -inf mask per row."""

    name = "baseline"

    def __init__(self, compiled: Compiled, rows: int, size: int) -> None:
        self.compiled = compiled.value
        self.memo = compiled.memo
        self.transitions = compiled.transitions
        self.states: list[Any] = [None] * rows
        self.size = size
        self.allowed = reference_allowed_fn(self.compiled)

    def admit(self, row: int) -> None:
        self.states[row] = self.compiled.initial_state()

    def advance(self) -> None:
        """Per-request state updates through a transition table memoized per (state, token),
        as V0's FSM-index processors looked up their next state."""
        states, transitions, advance = self.states, self.transitions, self.compiled.advance
        for row, token in self.feed:
            state = states[row]
            key = (state, token)
            nxt = transitions.get(key)
            if nxt is None:
                nxt = transitions[key] = advance(state, token)
            states[row] = nxt

    def fill(self) -> None:
        """The per-row mask and add are one loop in this design, run in apply(); the time it
        spends building masks is moved to the fill phase through ``inner_fill_ns``."""

    def apply(self, logits: torch.Tensor) -> None:
        memo, allowed_fn, size = self.memo, self.allowed, self.size
        clock = time.perf_counter_ns
        building = 0
        for row, state in enumerate(self.states):
            t0 = clock()
            allowed = memo.get(state)
            if allowed is None:
                allowed = memo[state] = list(allowed_fn(state))
            mask = torch.full((size,), -math.inf)
            mask[torch.tensor(allowed, dtype=torch.long)] = 0
            building += clock() - t0
            logits[row] += mask
        self.inner_fill_ns = building


def reference_allowed_fn(compiled: Any) -> Callable[[Any], Sequence[int]]:
    """The reference constraint's single-request "allowed tokens in this state" call."""
    for name in ("allowed_tokens", "allowed_ids", "allowed_token_ids", "allowed"):
        fn = getattr(compiled, name, None)
        if callable(fn):
            return fn
    raise RuntimeError(
        f"{type(compiled).__name__} has no allowed-tokens method "
        "(looked for allowed_tokens/allowed_ids/allowed_token_ids/allowed)"
    )


class XGrammarRunner(Runner):
    name = "xgrammar"

    def __init__(self, compiled: Any, rows: int, size: int, threads: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
        self.batcher = xgr.BatchGrammarMatcher(max_threads=threads)
        self.mask = xgr.allocate_token_bitmask(rows, size)
        self.bitmask = self.mask.numpy()

    def admit(self, row: int) -> None:
        self.matchers[row].reset()

    def prepare(self, feed: list[tuple[int, int]]) -> None:
        self.feed = [(self.matchers[row], token) for row, token in feed]

    def advance(self) -> None:
        for matcher, token in self.feed:
            if not matcher.accept_token(token):
                raise RuntimeError(f"xgrammar refused teacher-forced token {token}")

    def fill(self) -> None:
        self.batcher.batch_fill_next_token_bitmask(self.matchers, self.mask)

    def apply(self, logits: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, self.mask)


class LLGuidanceRunner(Runner):
    name = "llguidance"

    def __init__(self, prototype: Any, rows: int, size: int, threads: int) -> None:
        import llguidance
        import llguidance.numpy as llnp

        self.fill_par = llnp.fill_next_token_bitmask_par
        self.matchers = [prototype.deep_copy() for _ in range(rows)]
        self.pairs = [(m, row) for row, m in enumerate(self.matchers)]
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self.bitmask = allocate_bitmask(rows, size)

    def admit(self, row: int) -> None:
        self.matchers[row].reset()

    def prepare(self, feed: list[tuple[int, int]]) -> None:
        self.feed = [(self.matchers[row], token) for row, token in feed]

    def advance(self) -> None:
        for matcher, token in self.feed:
            if not matcher.consume_token(token):
                raise RuntimeError(f"llguidance refused teacher-forced token {token}")

    def fill(self) -> None:
        self.fill_par(self.executor, self.pairs, self.bitmask)

    def apply(self, logits: torch.Tensor) -> None:
        apply_bitmask(logits, self.bitmask)


class EngineSkipped(Exception):
    """This engine does not run this configuration; the message says why."""


@dataclass
class Compiled:
    """One engine's compiled form of one workload, shared by every batch size."""

    engine: str
    value: Any
    compile_s: float
    memo: dict[Any, list[int]] = field(default_factory=dict)  # baseline: state -> allowed list
    transitions: dict[tuple[Any, int], Any] = field(default_factory=dict)  # (state, token) -> next


def compile_for(engine: str, ctx: VocabContext, workload: Workload, plan: Plan) -> Compiled:
    if engine in ("xgrammar", "llguidance"):
        if engine in workload.peer_skip:
            raise EngineSkipped(workload.peer_skip[engine])
        if workload.n_choices > plan.peer_max_choices:
            raise EngineSkipped(
                f"catalog of {workload.n_choices:,} strings is above --peer-max-choices "
                f"{plan.peer_max_choices:,} (compile time; see the notes)"
            )
    t0 = time.perf_counter()
    if engine == "native":
        value: Any = ctx.native_engine().compile(workload.spec)
    elif engine in ("reference", "baseline"):
        value = ctx.reference_engine().compile(workload.spec)
    elif engine == "xgrammar":
        import xgrammar as xgr

        compiler = xgr.GrammarCompiler(ctx.xgr_info(), max_threads=ctx.threads, cache_enabled=False)
        if workload.ebnf is not None:
            value = compiler.compile_grammar(workload.ebnf)
        else:
            value = compiler.compile_regex(workload.regex)
    elif engine == "llguidance":
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_regex(workload.regex)
        value = llguidance.LLMatcher(
            ctx.ll_tokenizer(), grammar, limits=llguidance_limits(), log_level=0
        )
        if value.is_error():
            raise EngineSkipped(f"llguidance refused the grammar: {value.get_error()[:200]}")
    else:
        raise ValueError(engine)
    return Compiled(engine, value, time.perf_counter() - t0)


def prime_reference(
    ctx: VocabContext,
    compiled: Any,
    workload: Workload,
    transitions: dict[tuple[Any, int], Any] | None = None,
) -> float:
    """Fill the reference constraint's per-state memo for every state the streams visit, from
    the native engine's masks (untimed; returns seconds).

    The reference computes a state's allowed set by scanning the whole vocabulary in Python
    (tens of milliseconds per state at 32k, more at larger V), and its ``advance`` checks the
    token against that set, so a cold state costs far more than a step. Per-request processors
    of vLLM V0 precomputed this index when compiling; the baseline is timed in that steady
    state. Computing the index with the reference itself would take hours for the choice
    catalogs, so it is filled from the native masks, which the verification pass has just
    compared with the reference's own on the same streams. Uses the reference's private
    ``_allowed`` memo; without it, nothing is primed and cold states are paid in the steps.
    ``transitions`` (the baseline's (state, token) -> next state table) is filled on the way."""
    memo = getattr(compiled, "_allowed", None)
    if not isinstance(memo, dict) or engine_available("native") is not None:
        return 0.0
    t0 = time.perf_counter()
    engine = ctx.native_engine()
    native = engine.compile(workload.spec)
    streams = workload.streams.streams
    size = ctx.vocab.size
    chunk = 256
    for start in range(0, len(streams), chunk):
        group = streams[start : start + chunk]
        batch = engine.new_batch(len(group))
        bitmask = allocate_bitmask(len(group), size)
        for row in range(len(group)):
            batch.add(row, native)
        states = [compiled.initial_state() for _ in group]
        for pos in range(max(len(s) for s in group)):
            batch.fill(bitmask)
            for row, stream in enumerate(group):
                if pos >= len(stream):
                    continue
                state = states[row]
                if state not in memo:
                    bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")[:size]
                    memo[state] = frozenset(np.flatnonzero(bits).tolist())
                if pos < len(stream) - 1:  # the last token is EOS, never fed
                    states[row] = compiled.advance(state, stream[pos])
                    if transitions is not None:
                        transitions[(state, stream[pos])] = states[row]
                    batch.advance(row, [stream[pos]])
    return time.perf_counter() - t0


def make_runner(engine: str, ctx: VocabContext, compiled: Compiled, rows: int) -> Runner:
    size = ctx.vocab.size
    if engine == "native":
        return BatchEngineRunner("native", ctx.native_engine(), compiled.value, rows)
    if engine == "reference":
        return BatchEngineRunner("reference", ctx.reference_engine(), compiled.value, rows)
    if engine == "baseline":
        return BaselineRunner(compiled, rows, size)
    if engine == "xgrammar":
        return XGrammarRunner(compiled.value, rows, size, ctx.threads)
    if engine == "llguidance":
        return LLGuidanceRunner(compiled.value, rows, size, ctx.threads)
    raise ValueError(engine)


# --------------------------------------------------------------------------------------------
# The decode loop: teacher-forced streams, admissions, rotating logits buffers


class Schedule:
    """Which stream each row is on and what it feeds next. Every engine gets the same schedule:
    row r starts on stream r; a row whose next token is EOS is re-admitted (untimed) on the
    next unused stream, in row order."""

    def __init__(self, streams: Streams, rows: int) -> None:
        self.streams = streams.streams
        self.rows = rows
        self.eos: set[int] = set()
        self.current = [self.streams[r % len(self.streams)] for r in range(rows)]
        self.pos = [0] * rows
        self.next_stream = rows
        self.sampled: list[int | None] = [None] * rows

    def start(self, runner: Runner, eos: Sequence[int]) -> None:
        self.eos = set(eos)
        for row in range(self.rows):
            runner.admit(row)

    def feed(self) -> list[tuple[int, int]]:
        return [(r, t) for r, t in enumerate(self.sampled) if t is not None]

    def after_step(self, runner: Runner) -> list[tuple[int, int]]:
        """Pretend to sample each row's next token from its stream; re-admit finished rows. Returns the
        (row, token) pairs sampled, EOS included, for mask checks."""
        sampled = []
        for row in range(self.rows):
            token = self.current[row][self.pos[row]]
            sampled.append((row, token))
            if token in self.eos:
                self.current[row] = self.streams[self.next_stream % len(self.streams)]
                self.next_stream += 1
                self.pos[row] = 0
                self.sampled[row] = None
                runner.admit(row)
            else:
                self.pos[row] += 1
                self.sampled[row] = token
        return sampled


class LogitsPool:
    """Rotating float32 logits buffers whose total size exceeds the last-level cache, each
    restored to the same random values after use (the restore is not timed)."""

    def __init__(self, rows: int, size: int, target_bytes: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.pristine = torch.randn((rows, size), generator=generator, dtype=torch.float32)
        count = max(3, math.ceil(target_bytes / (rows * size * 4)))
        self.buffers = [self.pristine.clone() for _ in range(count)]
        self.index = 0

    def next(self) -> torch.Tensor:
        buffer = self.buffers[self.index]
        self.index = (self.index + 1) % len(self.buffers)
        return buffer

    def restore(self, buffer: torch.Tensor) -> None:
        buffer.copy_(self.pristine)


def applied_bitmask(logits: torch.Tensor, rows: int) -> np.ndarray:
    """The bitmask a row's logits show after apply: bit set where the logit is not -inf."""
    allowed = (logits[:rows] != -math.inf).numpy()
    words = bitmask_words(logits.shape[1])
    packed = np.packbits(allowed, axis=1, bitorder="little")
    out = np.zeros((rows, words * 4), dtype=np.uint8)
    out[:, : packed.shape[1]] = packed
    return out.view(np.int32)


@dataclass
class StepTimes:
    advance: list[int] = field(default_factory=list)
    fill: list[int] = field(default_factory=list)
    apply: list[int] = field(default_factory=list)

    def add(self, t0: int, t1: int, t2: int, t3: int) -> None:
        self.advance.append(t1 - t0)
        self.fill.append(t2 - t1)
        self.apply.append(t3 - t2)


def run_steps(
    runner: Runner,
    schedule: Schedule,
    pool: LogitsPool,
    steps: int,
    times: StepTimes | None,
    check: Callable[[int, torch.Tensor, list[tuple[int, int]]], None] | None = None,
) -> float:
    """Run ``steps`` decode steps; returns the wall time they took (timed part only)."""
    clock = time.perf_counter_ns
    total = 0
    for step in range(steps):
        runner.prepare(schedule.feed())
        logits = pool.next()
        t0 = clock()
        runner.advance()
        t1 = clock()
        runner.fill()
        t2 = clock()
        runner.apply(logits)
        t3 = clock()
        total += t3 - t0
        if times is not None:
            moved = getattr(runner, "inner_fill_ns", 0)
            times.add(t0, t1, t2 + moved, t3)
        sampled = schedule.after_step(runner)
        if check is not None:
            check(step, logits, sampled)
        pool.restore(logits)
    return total / 1e9


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(times: StepTimes) -> dict[str, Any]:
    step = np.asarray(times.advance) + np.asarray(times.fill) + np.asarray(times.apply)
    fill = np.asarray(times.advance) + np.asarray(times.fill)
    us = 1e-3
    return {
        "steps": len(step),
        "step_us": {
            "p50": percentile(step, 50) * us,
            "p90": percentile(step, 90) * us,
            "p99": percentile(step, 99) * us,
            "max": float(step.max()) * us,
            "mean": float(step.mean()) * us,
        },
        # advance + fill: the mask computation, without the apply
        "fill_us": {"p50": percentile(fill, 50) * us, "p99": percentile(fill, 99) * us},
        "advance_us": {"p50": percentile(times.advance, 50) * us},
        "apply_us": {
            "p50": percentile(times.apply, 50) * us,
            "p99": percentile(times.apply, 99) * us,
        },
    }


def time_config(
    engine: str,
    ctx: VocabContext,
    compiled: Compiled,
    workload: Workload,
    rows: int,
    plan: Plan,
    pool_bytes: int,
) -> dict[str, Any]:
    runner = make_runner(engine, ctx, compiled, rows)
    schedule = Schedule(workload.streams, rows)
    schedule.start(runner, ctx.vocab.eos_token_ids)
    pool = LogitsPool(rows, ctx.vocab.size, pool_bytes)
    # Warm-up: up to warmup_steps or warmup_cap_s, at least 3 steps.
    warm = StepTimes()
    started = time.perf_counter()
    done = 0
    while done < 3 or (
        done < plan.warmup_steps and time.perf_counter() - started < plan.warmup_cap_s
    ):
        run_steps(runner, schedule, pool, 1, warm)
        done += 1
    estimate = max(float(np.median(np.asarray(warm.advance) + warm.fill + warm.apply)) / 1e9, 1e-7)
    steps = int(min(plan.max_steps, max(plan.min_steps, plan.budget_s / estimate)))
    reduced = steps * estimate > plan.slow_cap_s
    if reduced:
        steps = max(plan.floor_steps, int(plan.slow_cap_s / estimate))
    times = StepTimes()
    gc.collect()
    gc.disable()
    try:
        run_steps(runner, schedule, pool, steps, times)
    finally:
        gc.enable()
    dead = getattr(runner, "dead", [])
    runner.close()
    result = summarize(times)
    result.update(
        engine=engine,
        vocab=ctx.vocab.size,
        workload=workload.name,
        batch=rows,
        warmup_steps=done,
        reduced_steps=reduced,
        logits_buffers=len(pool.buffers),
        dead_rows_last_step=len(dead),
    )
    return result


# --------------------------------------------------------------------------------------------
# Mask agreement between engines on the same streams


def verify_engines(
    ctx: VocabContext,
    workload: Workload,
    compiled: dict[str, Compiled],
    rows: int,
    steps: int,
) -> dict[str, dict[str, Any]]:
    """Run every compiled engine ``steps`` steps on ``rows`` rows with the same schedule and
    compare the masks they applied (read back from the logits), and each engine's own bitmask
    against what it applied. The first exact engine is the reference point."""
    applied: dict[str, list[np.ndarray]] = {}
    problems: dict[str, list[str]] = {}
    for engine, comp in compiled.items():
        runner = make_runner(engine, ctx, comp, rows)
        schedule = Schedule(workload.streams, rows)
        schedule.start(runner, ctx.vocab.eos_token_ids)
        pool = LogitsPool(rows, ctx.vocab.size, 0, seed=1)
        masks: list[np.ndarray] = []
        issues: list[str] = []

        def check(
            step: int,
            logits: torch.Tensor,
            sampled: list[tuple[int, int]],
            runner: Runner = runner,
            masks: list[np.ndarray] = masks,
            issues: list[str] = issues,
        ) -> None:
            mask = applied_bitmask(logits, rows)
            masks.append(mask)
            own = runner.bitmask
            if own is not None and not np.array_equal(own[:rows], mask):
                issues.append(f"step {step}: the applied logits differ from the bitmask")
            for row, token in sampled:
                if not (int(mask[row, token >> 5]) >> (token & 31)) & 1:
                    issues.append(f"step {step} row {row}: stream token {token} not allowed")
            if getattr(runner, "dead", None):
                issues.append(f"step {step}: dead rows {runner.dead}")

        run_steps(runner, schedule, pool, steps, None, check)
        runner.close()
        applied[engine] = masks
        problems[engine] = issues
    exact = [e for e in compiled if e in EXACT_ENGINES]
    base = exact[0] if exact else next(iter(compiled))
    report: dict[str, dict[str, Any]] = {}
    for engine, masks in applied.items():
        differ = subset = 0
        for mine, theirs in zip(masks, applied[base], strict=True):
            for row in range(rows):
                if np.array_equal(mine[row], theirs[row]):
                    continue
                differ += 1
                if not np.any(mine[row] & ~theirs[row]):
                    subset += 1
        if differ == 0:
            verdict = "equal"
        elif engine == "llguidance" and subset == differ:
            verdict = "subset"
        else:
            verdict = "DIFFERENT"
        report[engine] = {
            "against": base,
            "masks": steps * rows,
            "differing_masks": differ,
            "subset_masks": subset,
            "verdict": verdict if not problems[engine] else "ERROR",
            "problems": problems[engine][:5],
        }
    return report


# --------------------------------------------------------------------------------------------
# Fits, ratios, microbenchmarks


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least squares ``y = a + b x``; also R^2."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if len(x) < 2:
        return {"a": float(y[0]) if len(y) else float("nan"), "b": float("nan"), "r2": float("nan")}
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"a": float(a), "b": float(b), "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def fits(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for c in configs:
        groups.setdefault((c["engine"], c["vocab"], c["workload"]), []).append(c)
    out = []
    for (engine, vocab, workload), items in groups.items():
        items.sort(key=lambda c: c["batch"])
        batches = [c["batch"] for c in items]
        out.append(
            {
                "engine": engine,
                "vocab": vocab,
                "workload": workload,
                "batches": batches,
                "step": fit_line(batches, [c["step_us"]["p50"] for c in items]),
                "fill": fit_line(batches, [c["fill_us"]["p50"] for c in items]),
            }
        )
    return out


def ratios(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step-time p50 of each other engine over native's (how many times slower than native)."""
    by_key = {(c["engine"], c["vocab"], c["workload"], c["batch"]): c for c in configs}
    out = []
    for (engine, vocab, workload, batch), c in by_key.items():
        if engine != "native":
            continue
        row: dict[str, Any] = {"vocab": vocab, "workload": workload, "batch": batch}
        for other in ("baseline", "xgrammar", "llguidance", "reference"):
            o = by_key.get((other, vocab, workload, batch))
            if o is not None:
                row[f"{other}_over_native_step_p50"] = o["step_us"]["p50"] / c["step_us"]["p50"]
                row[f"{other}_over_native_fill_p50"] = o["fill_us"]["p50"] / c["fill_us"]["p50"]
        out.append(row)
    return out


def time_call(fn: Callable[[], Any], repeat: int, inner: int = 1) -> list[float]:
    """Per-call seconds of ``fn``, ``repeat`` samples of ``inner`` calls each."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner / 1e9)
    return samples


def mask_row_floor(vocab_size: int, rows: int = 256, repeat: int = 200) -> dict[str, Any]:
    """The floor for writing one precomputed mask row: a memcpy of ceil(V/32)*4 bytes, timed
    over a block of rows (so no Python call per row) and per row with one call each."""
    words = bitmask_words(vocab_size)
    rng = np.random.default_rng(0)
    src = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int32)
    dst = np.empty_like(src)
    block = time_call(lambda: np.copyto(dst, src), repeat)
    one_src, one_dst = src[0], dst[0]
    single = time_call(lambda: np.copyto(one_dst, one_src), repeat, inner=50)
    return {
        "vocab": vocab_size,
        "row_bytes": words * 4,
        "memcpy_per_row_us_block": percentile(block, 50) / rows * 1e6,
        "memcpy_one_row_call_us": percentile(single, 50) * 1e6,
    }


def apply_vs_memory(
    vocab_size: int,
    rows: int,
    bitmask: np.ndarray,
    pool_bytes: int,
    budget_s: float,
    with_xgrammar: bool,
) -> dict[str, Any]:
    """Applying a bitmask to fp32 logits [rows, V] against plain memory passes over the same
    logits (in-place add_, which reads and writes every element as the apply does; fill_,
    write only; copy_ from another buffer). All on the same rotating buffers."""
    pool = LogitsPool(rows, vocab_size, pool_bytes, seed=2)
    other = LogitsPool(rows, vocab_size, 0, seed=3).buffers[0]
    mask_t = torch.from_numpy(bitmask)
    ops: dict[str, Callable[[torch.Tensor], Any]] = {
        "add_": lambda x: x.add_(0.0),
        "fill_": lambda x: x.fill_(0.5),
        "copy_": lambda x: x.copy_(other),
    }
    if native_apply_available():
        ops["native_apply"] = lambda x: apply_bitmask(x, bitmask)
    if with_xgrammar:
        import xgrammar as xgr

        ops["xgrammar_apply"] = lambda x: xgr.apply_token_bitmask_inplace(x, mask_t)
    result: dict[str, Any] = {"vocab": vocab_size, "batch": rows, "bytes": rows * vocab_size * 4}
    one = max(rows * vocab_size * 4 / 5e9, 1e-6)  # rough seconds per pass
    count = int(min(500, max(15, budget_s / one)))
    for name, op in ops.items():
        samples = []
        for _ in range(count):
            buf = pool.next()
            t0 = time.perf_counter_ns()
            op(buf)
            samples.append(time.perf_counter_ns() - t0)
            pool.restore(buf)
        result[f"{name}_us"] = percentile(samples, 50) / 1e3
    result["passes"] = count
    if "native_apply_us" in result:
        result["native_apply_over_add_"] = result["native_apply_us"] / result["add__us"]
        result["native_apply_GBps"] = 2 * result["bytes"] / result["native_apply_us"] / 1e3
    if "xgrammar_apply_us" in result:
        result["xgrammar_apply_over_add_"] = result["xgrammar_apply_us"] / result["add__us"]
    result["add__GBps"] = 2 * result["bytes"] / result["add__us"] / 1e3
    return result


def admission_costs(
    ctx: VocabContext, workload: Workload, compiled: dict[str, Compiled], count: int
) -> list[dict[str, Any]]:
    """Admitting a request whose constraint is already compiled, per engine (µs each)."""
    out = []
    rows = 256
    for engine, comp in compiled.items():
        if engine in ("native", "reference"):
            factory = ctx.native_engine() if engine == "native" else ctx.reference_engine()
            batch = factory.new_batch(rows)
            outputs: list[list[int]] = [[] for _ in range(rows)]
            state = {"i": 0}

            def admit(batch: Any = batch, value: Any = comp.value, outputs=outputs, state=state):
                row = state["i"] % rows
                state["i"] += 1
                batch.add(row, value, outputs[row], [1, 2, 3])

            what = "Batch.add(row, compiled, output_ids, prompt_ids)"
        elif engine == "baseline":

            def admit(value: Any = comp.value) -> None:
                value.initial_state()

            what = "compiled.initial_state()"
        elif engine == "xgrammar":
            import xgrammar as xgr

            def admit(value: Any = comp.value) -> None:
                xgr.GrammarMatcher(value)

            what = "GrammarMatcher(compiled)"
        elif engine == "llguidance":

            def admit(value: Any = comp.value) -> None:
                value.deep_copy()

            what = "LLMatcher.deep_copy() of a compiled matcher"
        else:
            continue
        for _ in range(min(50, count)):
            admit()
        samples = time_call(admit, count)
        out.append(
            {
                "engine": engine,
                "vocab": ctx.vocab.size,
                "workload": workload.name,
                "what": what,
                "p50_us": percentile(samples, 50) * 1e6,
                "p99_us": percentile(samples, 99) * 1e6,
                "count": count,
            }
        )
    return out


def compile_times(
    vocab: Vocabulary, n_titles: int, engines: Sequence[str], threads: int, peer_compile: bool
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Compile time of an ``n_titles``-string catalog against ``vocab`` (a fresh engine each
    time, so no cache is hit), with the vocabulary's own setup time reported apart."""
    out: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    titles = tuple(catalog(n_titles))
    spec = Choice(titles)
    name = f"choice-{_count(n_titles)}"
    for engine in engines:
        ctx = VocabContext(vocab, threads)
        samples: list[float] = []
        try:
            if engine == "native":
                from serving.constraints.native import NativeEngine

                ctx.native_engine()
                for _ in range(3):
                    fresh = NativeEngine(vocab)  # an empty compile cache
                    t0 = time.perf_counter()
                    fresh.compile(spec)
                    samples.append(time.perf_counter() - t0)
            elif engine in ("reference", "baseline"):
                if engine == "baseline" and "reference" in engines:
                    continue
                t0 = time.perf_counter()
                ctx.reference_engine().compile(spec)
                samples.append(time.perf_counter() - t0)
            elif engine == "xgrammar":
                if not peer_compile:
                    skipped.append(
                        {
                            "engine": engine,
                            "what": f"compile {name} @ {vocab.size}",
                            "why": "minutes on this machine (see the choice-10k compile time "
                            "in the grid); run with --peer-compile to include it",
                        }
                    )
                    continue
                ctx.xgr_info()
                plan = Plan(**{**FULL.__dict__, "peer_max_choices": n_titles})
                wl = Workload(
                    name,
                    spec,
                    Streams(()),
                    ebnf="root ::= " + " | ".join(ebnf_literal(t) for t in titles),
                    n_choices=n_titles,
                )
                samples.append(compile_for(engine, ctx, wl, plan).compile_s)
            elif engine == "llguidance":
                ctx.ll_tokenizer()
                plan = Plan(**{**FULL.__dict__, "peer_max_choices": n_titles})
                wl = Workload(
                    name,
                    spec,
                    Streams(()),
                    regex="(" + "|".join(regex_escape(t) for t in titles) + ")",
                    n_choices=n_titles,
                )
                samples.append(compile_for(engine, ctx, wl, plan).compile_s)
            else:
                continue
        except (ImportError, EngineSkipped, RuntimeError) as exc:
            skipped.append({"engine": engine, "what": f"compile {name}", "why": str(exc)})
            continue
        out.append(
            {
                "engine": "reference" if engine == "baseline" else engine,
                "vocab": vocab.size,
                "workload": name,
                "compile_s": min(samples),
                "samples": len(samples),
                "vocab_setup_s": ctx.setup_s.get(
                    "reference" if engine == "baseline" else engine, 0.0
                ),
            }
        )
    return out, skipped


# --------------------------------------------------------------------------------------------
# Machine description


def machine_info(threads: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
    }
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        for key, field_name in (
            ("model name", "cpu_model"),
            ("cpu family", "cpu_family"),
            ("model", "cpu_model_number"),
        ):
            m = re.search(rf"^{key}\s*:\s*(.+)$", cpuinfo, re.M)
            if m:
                info[field_name] = m.group(1).strip()
        info["hypervisor"] = " hypervisor " in cpuinfo.split("flags", 1)[-1].split("\n", 1)[0] + " "
        meminfo = Path("/proc/meminfo").read_text()
        m = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        if m:
            info["memory_gib"] = round(int(m.group(1)) / 2**20, 1)
    except OSError:
        pass
    info["llc_bytes"] = llc_bytes()
    for package in ("torch", "numpy", "xgrammar", "llguidance"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = None
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info["git_dirty"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        info["git_commit"] = None
    if native_apply_available():
        from serving.constraints.native import threads as native_threads

        info["native_threads"] = native_threads()
    info["torch_threads"] = torch.get_num_threads()
    return info


def llc_bytes() -> int:
    best = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (path / "size").read_text().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if m:
            best = max(
                best, int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
            )
    return best or 32 * 2**20


# --------------------------------------------------------------------------------------------
# The whole benchmark


def engine_available(engine: str) -> str | None:
    """None when the engine can run here, else why not."""
    try:
        if engine == "native":
            from serving.constraints.native import NativeEngine  # noqa: F401
        elif engine in ("reference", "baseline"):
            from serving.constraints.reference import ReferenceEngine  # noqa: F401
        elif engine == "xgrammar":
            import xgrammar  # noqa: F401
        elif engine == "llguidance":
            import llguidance.numpy  # noqa: F401
    except ImportError as exc:
        return f"cannot import: {exc}"
    return None


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_workloads(vocab: Vocabulary, plan: Plan) -> list[Workload]:
    workloads = []
    for kind in plan.workloads:
        if kind == "choice":
            workloads.extend(choice_workload(vocab, n) for n in plan.choice_sizes)
        elif kind == "regex":
            workloads.append(regex_workload(vocab))
        elif kind == "allowed-set":
            workloads.append(allowed_set_workload(vocab))
        else:
            raise ValueError(f"unknown workload {kind!r}")
    return workloads


def run(plan: Plan, engines: Sequence[str], threads: int, peer_compile: bool) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {
        "configs": [],
        "verification": [],
        "compile": [],
        "admission": [],
        "apply": [],
        "floor": [],
        "skipped": [],
        "notes": [],
    }
    runnable = []
    for engine in engines:
        why = engine_available(engine)
        if why is None:
            runnable.append(engine)
        else:
            results["skipped"].append({"engine": engine, "what": "everything", "why": why})
            log(f"skipping {engine}: {why}")
    llc = llc_bytes()
    pool_bytes = max(4 * llc, 64 * 2**20)
    for size in plan.vocab_sizes:
        vocab = synthetic_vocab(size)
        ctx = VocabContext(vocab, threads)
        results["floor"].append(mask_row_floor(size))
        verify_bitmask: np.ndarray | None = None
        for workload in build_workloads(vocab, plan):
            compiled: dict[str, Compiled] = {}
            for engine in runnable:
                try:
                    compiled[engine] = compile_for(engine, ctx, workload, plan)
                except (EngineSkipped, RuntimeError) as exc:
                    results["skipped"].append(
                        {"engine": engine, "what": f"{workload.name} @ {size}", "why": str(exc)}
                    )
                    continue
                results["compile"].append(
                    {
                        "engine": engine,
                        "vocab": size,
                        "workload": workload.name,
                        "compile_s": compiled[engine].compile_s,
                        "samples": 1,
                        "vocab_setup_s": ctx.setup_s.get(
                            "reference" if engine == "baseline" else engine, 0.0
                        ),
                    }
                )
                log(
                    f"V={size} {workload.name}: {engine} compiled in {compiled[engine].compile_s:.3f}s"
                )
            report = verify_engines(ctx, workload, compiled, plan.verify_rows, plan.verify_steps)
            for engine, verdict in report.items():
                results["verification"].append(
                    {"vocab": size, "workload": workload.name, "engine": engine, **verdict}
                )
                if verdict["verdict"] in ("DIFFERENT", "ERROR"):
                    log(f"MASK CHECK FAILED: {engine} {workload.name} @ {size}: {verdict}")
            primed = {id(c.value) for e, c in compiled.items() if e in ("reference", "baseline")}
            for value in [c.value for c in compiled.values() if id(c.value) in primed][:1]:
                baseline = compiled.get("baseline")
                seconds = prime_reference(
                    ctx, value, workload, baseline.transitions if baseline else None
                )
                results["notes"].append(
                    f"V={size} {workload.name}: reference memo primed from native masks in "
                    f"{seconds:.1f}s (untimed)"
                )
            if workload.name == "regex" and "native" in compiled:
                verify_bitmask = regex_bitmask_sample(ctx, compiled["native"], workload)
            if size == plan.compile_vocab and workload.name.startswith(("regex", "choice")):
                results["admission"].extend(admission_costs(ctx, workload, compiled, 2000))
            for engine, comp in compiled.items():
                for rows in plan.batch_sizes:
                    config = time_config(engine, ctx, comp, workload, rows, plan, pool_bytes)
                    results["configs"].append(config)
                    log(
                        f"V={size} {workload.name} B={rows} {engine}: "
                        f"p50 {config['step_us']['p50']:.1f} us, p99 {config['step_us']['p99']:.1f} us "
                        f"({config['steps']} steps)"
                    )
            del compiled
            gc.collect()
        for rows in plan.batch_sizes:
            bitmask = tile_rows(verify_bitmask, rows, size)
            results["apply"].append(
                apply_vs_memory(
                    size, rows, bitmask, pool_bytes, plan.budget_s, "xgrammar" in runnable
                )
            )
        results.setdefault("vocab_setup", []).append({"vocab": size, **ctx.setup_s})
        del ctx
        gc.collect()
    compile_rows, compile_skips = compile_times(
        synthetic_vocab(plan.compile_vocab), plan.compile_catalog, runnable, threads, peer_compile
    )
    results["compile"].extend(compile_rows)
    results["skipped"].extend(compile_skips)
    results["fits"] = fits(results["configs"])
    results["ratios"] = ratios(results["configs"])
    results["elapsed_s"] = time.perf_counter() - started
    reduced = [c for c in results["configs"] if c["reduced_steps"]]
    results["notes"].append(
        f"Timed steps per configuration: {plan.min_steps}-{plan.max_steps} "
        f"(about {plan.budget_s}s each); {len(reduced)} slow configurations ran fewer "
        f"(at least {plan.floor_steps}, about {plan.slow_cap_s}s each), so their p99 is "
        "close to their maximum."
    )
    return results


def regex_bitmask_sample(ctx: VocabContext, compiled: Compiled, workload: Workload) -> np.ndarray:
    """Real masks (the regex along its streams) for the apply measurements."""
    runner = make_runner("native", ctx, compiled, 64)
    schedule = Schedule(workload.streams, 64)
    schedule.start(runner, ctx.vocab.eos_token_ids)
    pool = LogitsPool(64, ctx.vocab.size, 0)
    run_steps(runner, schedule, pool, 7, None)
    assert runner.bitmask is not None
    return runner.bitmask.copy()


def tile_rows(sample: np.ndarray | None, rows: int, size: int) -> np.ndarray:
    if sample is None:
        rng = np.random.default_rng(4)
        return rng.integers(-(2**31), 2**31, size=(rows, bitmask_words(size)), dtype=np.int32)
    reps = math.ceil(rows / sample.shape[0])
    return np.ascontiguousarray(np.tile(sample, (reps, 1))[:rows])


# --------------------------------------------------------------------------------------------
# Markdown summary


def _us(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value >= 10_000:
        return f"{value / 1000:,.1f} ms"
    if value >= 100:
        return f"{value:,.0f} µs"
    return f"{value:.2f} µs" if value < 10 else f"{value:.1f} µs"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}x" if value >= 10 else f"{value:.2f}x"


def render_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Constraint processor benchmark",
        "",
        "Generated by `bench/constraints.py`; do not edit by hand, rerun the command.",
        "",
        "## Machine and command",
        "",
        f"- CPU: {m.get('cpu_model', '?')} (family {m.get('cpu_family', '?')}, model "
        f"{m.get('cpu_model_number', '?')}{', virtual machine' if m.get('hypervisor') else ''}), "
        f"{m.get('cpu_count')} cores, last-level cache {m.get('llc_bytes', 0) // 2**20} MiB, "
        f"memory {m.get('memory_gib', '?')} GiB",
        f"- Threads per engine: {m.get('threads')} (native pool {m.get('native_threads', '-')}, "
        f"torch {m.get('torch_threads')})",
        f"- Python {m.get('python')}, torch {m.get('torch')}, numpy {m.get('numpy')}, "
        f"xgrammar {m.get('xgrammar') or 'not installed'}, "
        f"llguidance {m.get('llguidance') or 'not installed'}; {m.get('platform')}",
        f"- Commit {m.get('git_commit')}{' (with uncommitted changes)' if m.get('git_dirty') else ''}",
        f"- Command: `{results['command']}`",
        f"- Wall time {results.get('elapsed_s', 0) / 60:.1f} min",
        "",
        "Step = advance every row by its teacher-forced token + fill the bitmask + apply it to "
        "float32 logits, timed from the Python call boundary. Vocabularies are synthetic "
        "byte-level ones of exactly the stated size (`bench/synthetic_vocab.py`); every engine "
        "is fed the same token streams.",
        "",
    ]
    lines += _render_steps(results)
    lines += _render_fits(results)
    lines += _render_ratios(results)
    lines += _render_per_request(results)
    lines += _render_apply(results)
    lines += _render_admission_compile(results)
    lines += _render_verification(results)
    if results["skipped"]:
        lines += ["## Skipped", ""]
        lines += [f"- {s['engine']}: {s['what']}: {s['why']}" for s in results["skipped"]]
        lines.append("")
    if results["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in results["notes"]] + [""]
    return "\n".join(lines)


def _engines_in(results: dict[str, Any]) -> list[str]:
    present = {c["engine"] for c in results["configs"]}
    return [e for e in ENGINES if e in present]


def _render_steps(results: dict[str, Any]) -> list[str]:
    lines = ["## Step time (p50 / p99) against batch size", ""]
    engines = _engines_in(results)
    by_key = {(c["engine"], c["vocab"], c["workload"], c["batch"]): c for c in results["configs"]}
    groups: dict[tuple[int, str], set[int]] = {}
    for c in results["configs"]:
        groups.setdefault((c["vocab"], c["workload"]), set()).add(c["batch"])
    for (vocab, workload), batches in groups.items():
        lines += [f"### V = {vocab:,}, {workload}", ""]
        lines.append("| B | " + " | ".join(engines) + " |")
        lines.append("|---:|" + "---:|" * len(engines))
        for b in sorted(batches):
            cells = []
            for e in engines:
                c = by_key.get((e, vocab, workload, b))
                cells.append(
                    "-"
                    if c is None
                    else f"{_us(c['step_us']['p50'])} / {_us(c['step_us']['p99'])}"
                    + (" (*)" if c["reduced_steps"] else "")
                )
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["(*) fewer timed steps (slow configuration); see the notes.", ""]
    return lines


def _render_fits(results: dict[str, Any]) -> list[str]:
    floors = {f["vocab"]: f for f in results["floor"]}
    lines = [
        "## Slope: step time = a + b * batch (least squares over p50)",
        "",
        "b is the cost of one more row; the floor is one memcpy of a precomputed mask row "
        "(ceil(V/32)*4 bytes, timed over a block of 256 rows). `fill` is advance + fill without "
        "the apply.",
        "",
        "| V | workload | engine | a (step) | b (step) | R² | a (fill) | b (fill) | "
        "row memcpy floor | b (fill) / floor |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in sorted(results["fits"], key=lambda f: (f["vocab"], f["workload"], f["engine"])):
        floor = floors.get(f["vocab"], {}).get("memcpy_per_row_us_block")
        lines.append(
            f"| {f['vocab']:,} | {f['workload']} | {f['engine']} | {_us(f['step']['a'])} | "
            f"{_us(f['step']['b'])} | {f['step']['r2']:.3f} | {_us(f['fill']['a'])} | "
            f"{_us(f['fill']['b'])} | {_us(floor)} | "
            f"{_x(f['fill']['b'] / floor) if floor else '-'} |"
        )
    lines += ["", "Mask-row floor per vocabulary:", ""]
    lines += [
        "| V | row bytes | memcpy per row (block) | one row per Python call |",
        "|---:|---:|---:|---:|",
    ]
    for f in results["floor"]:
        lines.append(
            f"| {f['vocab']:,} | {f['row_bytes']:,} | {_us(f['memcpy_per_row_us_block'])} | "
            f"{_us(f['memcpy_one_row_call_us'])} |"
        )
    lines.append("")
    return lines


def _render_ratios(results: dict[str, Any]) -> list[str]:
    rows = results["ratios"]
    others = [
        e
        for e in ("baseline", "xgrammar", "llguidance", "reference")
        if any(f"{e}_over_native_step_p50" in r for r in rows)
    ]
    if not rows or not others:
        return []
    lines = [
        "## Ratios to native (other engine's p50 step time / native's; > 1 means native is faster)",
        "",
        "| V | workload | B | " + " | ".join(others) + " |",
        "|---:|---|---:|" + "---:|" * len(others),
    ]
    for r in sorted(rows, key=lambda r: (r["vocab"], r["workload"], r["batch"])):
        cells = [_x(r.get(f"{e}_over_native_step_p50")) for e in others]
        lines.append(
            f"| {r['vocab']:,} | {r['workload']} | {r['batch']} | " + " | ".join(cells) + " |"
        )
    lines.append("")
    return lines


def _render_per_request(results: dict[str, Any]) -> list[str]:
    """Mask fill per request on the regex (advance + fill at B = 1, and per row at the largest
    batch), the constraint every peer supports."""
    configs = [c for c in results["configs"] if c["workload"] == "regex"]
    if not configs:
        return []
    lines = [
        "## Mask fill per request, regex constraint (advance + fill, no apply)",
        "",
        "| V | engine | B=1 p50 | B=1 p99 | per row at largest B, p50 | per row, p99 |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    vocabs = sorted({c["vocab"] for c in configs})
    for vocab in vocabs:
        for engine in _engines_in(results):
            mine = sorted(
                (c for c in configs if c["vocab"] == vocab and c["engine"] == engine),
                key=lambda c: c["batch"],
            )
            if not mine:
                continue
            one = next((c for c in mine if c["batch"] == 1), None)
            big = mine[-1]
            lines.append(
                f"| {vocab:,} | {engine} | {_us(one['fill_us']['p50'] if one else None)} | "
                f"{_us(one['fill_us']['p99'] if one else None)} | "
                f"{_us(big['fill_us']['p50'] / big['batch'])} (B={big['batch']}) | "
                f"{_us(big['fill_us']['p99'] / big['batch'])} |"
            )
    lines.append("")
    return lines


def _render_apply(results: dict[str, Any]) -> list[str]:
    if not results["apply"]:
        return []
    lines = [
        "## Applying the mask to float32 logits against one plain memory pass",
        "",
        "Same rotating logits buffers; `add_` (in-place, reads and writes every element as the "
        "apply does) is the reference pass. GB/s counts one read and one write.",
        "",
        "| V | B | MB | native apply | xgrammar apply | add_ | fill_ | copy_ | native / add_ | "
        "xgrammar / add_ | native GB/s | add_ GB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in results["apply"]:
        lines.append(
            f"| {a['vocab']:,} | {a['batch']} | {a['bytes'] / 1e6:,.1f} | "
            f"{_us(a.get('native_apply_us'))} | {_us(a.get('xgrammar_apply_us'))} | "
            f"{_us(a['add__us'])} | {_us(a['fill__us'])} | {_us(a['copy__us'])} | "
            f"{_x(a.get('native_apply_over_add_'))} | {_x(a.get('xgrammar_apply_over_add_'))} | "
            f"{a.get('native_apply_GBps', float('nan')):.1f} | {a['add__GBps']:.1f} |"
        )
    lines.append("")
    return lines


def _render_admission_compile(results: dict[str, Any]) -> list[str]:
    lines = []
    if results["admission"]:
        lines += [
            "## Admission (a request whose constraint is already compiled)",
            "",
            "| V | workload | engine | operation | p50 | p99 |",
            "|---:|---|---|---|---:|---:|",
        ]
        for a in results["admission"]:
            lines.append(
                f"| {a['vocab']:,} | {a['workload']} | {a['engine']} | {a['what']} | "
                f"{_us(a['p50_us'])} | {_us(a['p99_us'])} |"
            )
        lines.append("")
    if results["compile"]:
        lines += [
            "## Compile time",
            "",
            "The vocabulary's one-time setup (trie, tokenizer info) is reported apart; "
            "compiles of the same workload at several batch sizes share one compile.",
            "",
            "| V | workload | engine | compile | vocab setup |",
            "|---:|---|---|---:|---:|",
        ]
        for c in sorted(results["compile"], key=lambda c: (c["vocab"], c["workload"], c["engine"])):
            lines.append(
                f"| {c['vocab']:,} | {c['workload']} | {c['engine']} | {_seconds(c['compile_s'])} | "
                f"{_seconds(c['vocab_setup_s'])} |"
            )
        lines.append("")
    return lines


def _seconds(value: float) -> str:
    return f"{value * 1e3:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def _render_verification(results: dict[str, Any]) -> list[str]:
    if not results["verification"]:
        return []
    lines = [
        "## Mask agreement",
        "",
        "Each engine ran the same steps on a small batch before timing; the masks it applied "
        "(read back from the logits) were compared with the first exact engine's. `subset`: "
        "llguidance allowed fewer tokens, never more (observed where the next bytes are forced: "
        "it then allows only the first token of its tokenizer's own tokenization of them).",
        "",
        "| V | workload | engine | against | masks | differing | verdict |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    for v in results["verification"]:
        lines.append(
            f"| {v['vocab']:,} | {v['workload']} | {v['engine']} | {v['against']} | "
            f"{v['masks']} | {v['differing_masks']} | {v['verdict']}"
            + (f": {'; '.join(v['problems'])}" if v["problems"] else "")
            + " |"
        )
    lines.append("")
    return lines


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small grid (about a minute)")
    parser.add_argument(
        "--engines",
        default=",".join(DEFAULT_ENGINES),
        help=f"comma-separated, from {', '.join(ENGINES)} (default: %(default)s)",
    )
    parser.add_argument("--out", default="bench/results/constraints.json")
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("CONSTRAINTS_THREADS", 0)) or os.cpu_count() or 1,
        help="threads for every engine (native pool, xgrammar, llguidance, torch)",
    )
    parser.add_argument("--vocab-sizes", help="override, e.g. 32000,128256")
    parser.add_argument("--batch-sizes", help="override, e.g. 1,8,32")
    parser.add_argument("--choice-sizes", help="override the catalog sizes, e.g. 10000")
    parser.add_argument("--workloads", help="override, from choice,regex,allowed-set")
    parser.add_argument(
        "--peer-max-choices",
        type=int,
        help="run xgrammar/llguidance on choice catalogs up to this size (default 10000)",
    )
    parser.add_argument(
        "--peer-compile",
        action="store_true",
        help="also time XGrammar compiling the 100k-string catalog (minutes)",
    )
    parser.add_argument("--render", metavar="JSON", help="only re-render the Markdown of a result")
    return parser.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(",") if x)

    if args.vocab_sizes:
        overrides["vocab_sizes"] = ints(args.vocab_sizes)
        if plan.compile_vocab not in overrides["vocab_sizes"]:
            overrides["compile_vocab"] = overrides["vocab_sizes"][0]
    if args.batch_sizes:
        overrides["batch_sizes"] = ints(args.batch_sizes)
    if args.choice_sizes:
        overrides["choice_sizes"] = ints(args.choice_sizes)
    if args.workloads:
        overrides["workloads"] = tuple(args.workloads.split(","))
    if args.peer_max_choices is not None:
        overrides["peer_max_choices"] = args.peer_max_choices
    return Plan(**{**plan.__dict__, **overrides})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        out.with_suffix(".md").write_text(render_markdown(results))
        return 0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise SystemExit(f"unknown engines: {', '.join(sorted(unknown))}")
    # The native pool reads its size when it starts, so set it before the first engine runs.
    os.environ["CONSTRAINTS_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    plan = plan_from(args)
    command = "python bench/constraints.py" + (
        " " + shlex.join(sys.argv[1:] if argv is None else list(argv))
        if (sys.argv[1:] if argv is None else argv)
        else ""
    )
    log(f"plan: {plan}")
    results = run(plan, engines, args.threads, args.peer_compile)
    results["machine"] = machine_info(args.threads)
    results["command"] = command
    results["plan"] = plan.__dict__
    results["engines"] = engines
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    out.with_suffix(".md").write_text(render_markdown(results))
    log(f"wrote {out} and {out.with_suffix('.md')} in {results['elapsed_s'] / 60:.1f} min")
    failed = [v for v in results["verification"] if v["verdict"] in ("DIFFERENT", "ERROR")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
