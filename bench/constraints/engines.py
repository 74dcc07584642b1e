"""The engines compared, each behind the same ``Runner`` phases so the decode loop times them
alike: admit and prepare are untimed; advance, fill and apply are the timed step."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.constraints.plan import Plan
from bench.constraints.workloads import Workload
from bench.synthetic_vocab import GreedyTokenizer
from serving.constraints.engine import allocate_bitmask
from serving.constraints.vocab import Vocabulary

ENGINES = ("native", "reference", "baseline", "xgrammar", "llguidance")
DEFAULT_ENGINES = ("native", "baseline", "xgrammar", "llguidance")
# Engines whose masks must equal the documented semantics exactly.
EXACT_ENGINES = ("native", "reference", "baseline", "xgrammar")


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
