"""The pure-Python reference constraint engine: the test oracle and the "before" benchmark.

It follows ``docs/constraints.md`` literally and favours obviously-correct code over speed.
Regexes are parsed with Python's own sre parser (independent of the native engine's parser)
and run as an NFA over code points; UTF-8 fragments are judged by the range of code points
that share the fragment as a prefix, so no byte-range compiler is involved.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import numpy as np

from serving.constraints.engine import bitmask_words
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import (
    All,
    Choice,
    ConstraintError,
    ConstraintSpec,
    MaxTokens,
    Regex,
    TokenSet,
    spec_key,
)

MAX_REPEAT = 1000
MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


class _Dead:
    """The sticky dead state shared by every constraint kind."""

    _instance: _Dead | None = None

    def __new__(cls) -> _Dead:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DEAD"


DEAD: Any = _Dead()

Ranges = tuple[tuple[int, int], ...]


def pack_allowed(allowed: Iterable[int], size: int) -> np.ndarray:
    """Token IDs as one int32 bitmask row (bit ``t % 32`` of word ``t // 32``)."""
    words = [0] * bitmask_words(size)
    for token in allowed:
        if 0 <= token < size:
            words[token >> 5] |= 1 << (token & 31)
    return np.array(words, dtype=np.uint32).view(np.int32)


# --------------------------------------------------------------------------- code point sets


def _normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, merged ranges with surrogates removed (surrogates never match)."""
    pieces: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if lo <= SURROGATES[0] - 1:
            pieces.append((lo, min(hi, SURROGATES[0] - 1)))
        if hi >= SURROGATES[1] + 1:
            pieces.append((max(lo, SURROGATES[1] + 1), hi))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(p for p in pieces if p[0] <= p[1]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    start = 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return _normalize(out)


_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))
_CATEGORIES: dict[Any, Ranges] = {
    sre.CATEGORY_DIGIT: _DIGIT,
    sre.CATEGORY_NOT_DIGIT: _complement(_DIGIT),
    sre.CATEGORY_WORD: _WORD,
    sre.CATEGORY_NOT_WORD: _complement(_WORD),
    sre.CATEGORY_SPACE: _SPACE,
    sre.CATEGORY_NOT_SPACE: _complement(_SPACE),
}


def _intersects(ranges: Ranges, lo: int, hi: int) -> bool:
    return any(a <= hi and lo <= b for a, b in ranges)


def _contains(ranges: Ranges, cp: int) -> bool:
    return any(a <= cp <= b for a, b in ranges)


# --------------------------------------------------------------------------- regex -> NFA


@dataclass
class _Nfa:
    """Thompson NFA over code points: epsilon edges and (ranges, target) edges per state."""

    eps: list[list[int]] = field(default_factory=list)
    edges: list[list[tuple[Ranges, int]]] = field(default_factory=list)

    def new_state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1


class _RegexBuilder:
    """Translates sre's parse tree into an NFA, refusing everything outside the dialect."""

    def __init__(self) -> None:
        self.nfa = _Nfa()

    def build(self, pattern: str) -> tuple[int, int]:
        try:
            parsed = sre_parse.parse(pattern, re.ASCII)
        except re.error as exc:
            raise ConstraintError(f"invalid regex: {exc}") from None
        except (OverflowError, RecursionError) as exc:
            raise ConstraintError(f"invalid regex: {exc}") from None
        if parsed.state.flags & ~re.ASCII:
            raise ConstraintError("regex inline flags such as (?i) are not supported")
        items = list(parsed)
        if items and items[0][0] is sre.AT and items[0][1] is sre.AT_BEGINNING:
            items = items[1:]
        if items and items[-1][0] is sre.AT and items[-1][1] is sre.AT_END:
            items = items[:-1]
        return self._sequence(items)

    def _sequence(self, items: Sequence[tuple[Any, Any]]) -> tuple[int, int]:
        start = end = self.nfa.new_state()
        for op, arg in items:
            s, e = self._item(op, arg)
            self.nfa.eps[end].append(s)
            end = e
        return start, end

    def _edge(self, ranges: Ranges) -> tuple[int, int]:
        s, e = self.nfa.new_state(), self.nfa.new_state()
        self.nfa.edges[s].append((ranges, e))
        return s, e

    def _item(self, op: Any, arg: Any) -> tuple[int, int]:
        if op is sre.LITERAL:
            return self._edge(_normalize([(arg, arg)]))
        if op is sre.NOT_LITERAL:
            return self._edge(_complement(_normalize([(arg, arg)])))
        if op is sre.ANY:
            return self._edge(_complement(((0x0A, 0x0A),)))
        if op is sre.IN:
            return self._edge(self._charset(arg))
        if op is sre.SUBPATTERN:
            _group, add_flags, del_flags, sub = arg
            if add_flags or del_flags:
                raise ConstraintError("regex inline flags such as (?i:...) are not supported")
            return self._sequence(list(sub))
        if op is sre.BRANCH:
            start, end = self.nfa.new_state(), self.nfa.new_state()
            for alternative in arg[1]:
                s, e = self._sequence(list(alternative))
                self.nfa.eps[start].append(s)
                self.nfa.eps[e].append(end)
            return start, end
        if op is sre.MAX_REPEAT or op is sre.MIN_REPEAT:
            return self._repeat(*arg)
        if op is sre.AT:
            raise ConstraintError(
                "regex anchors are only supported as ^ at the very start and $ at the very end"
            )
        if op is sre.GROUPREF or op is sre.GROUPREF_EXISTS:
            raise ConstraintError("regex backreferences are not supported")
        if op is sre.ASSERT or op is sre.ASSERT_NOT:
            raise ConstraintError("regex lookahead/lookbehind is not supported")
        raise ConstraintError(f"regex construct {str(op).lower()} is not supported")

    def _charset(self, items: Sequence[tuple[Any, Any]]) -> Ranges:
        negate = False
        ranges: list[tuple[int, int]] = []
        for op, arg in items:
            if op is sre.NEGATE:
                negate = True
            elif op is sre.LITERAL:
                ranges.append((arg, arg))
            elif op is sre.RANGE:
                ranges.append(arg)
            elif op is sre.CATEGORY and arg in _CATEGORIES:
                ranges.extend(_CATEGORIES[arg])
            else:
                raise ConstraintError(f"regex class item {str(op).lower()} is not supported")
        result = _normalize(ranges)
        return _complement(result) if negate else result

    def _repeat(self, low: int, high: int, item: Any) -> tuple[int, int]:
        unbounded = high is sre.MAXREPEAT or high == sre.MAXREPEAT
        if low > MAX_REPEAT or (not unbounded and high > MAX_REPEAT):
            raise ConstraintError(f"regex counted repeats are limited to {MAX_REPEAT}")
        start = end = self.nfa.new_state()
        for _ in range(low):
            s, e = self._sequence(list(item))
            self.nfa.eps[end].append(s)
            end = e
        if unbounded:
            s, e = self._sequence(list(item))
            self.nfa.eps[end].append(s)
            self.nfa.eps[e].append(s)
            final = self.nfa.new_state()
            self.nfa.eps[end].append(final)
            self.nfa.eps[e].append(final)
            return start, final
        final = self.nfa.new_state()
        for _ in range(high - low):
            self.nfa.eps[end].append(final)
            s, e = self._sequence(list(item))
            self.nfa.eps[end].append(s)
            end = e
        self.nfa.eps[end].append(final)
        return start, final


def _utf8_prefix_range(prefix: bytes) -> tuple[int, int] | None:
    """The code points whose UTF-8 encoding starts with ``prefix`` (an incomplete sequence),
    or None when no valid encoding does (bad lead byte, bad continuation, overlong, too big)."""
    lead = prefix[0]
    if 0xC0 <= lead <= 0xDF:
        length, lowest, highest = 2, 0x80, 0x7FF
    elif 0xE0 <= lead <= 0xEF:
        length, lowest, highest = 3, 0x800, 0xFFFF
    elif 0xF0 <= lead <= 0xF7:
        length, lowest, highest = 4, 0x10000, MAX_CODE_POINT
    else:
        return None
    if len(prefix) >= length or any(not 0x80 <= b <= 0xBF for b in prefix[1:]):
        return None
    pad = length - len(prefix)
    lo = _decode_bits(prefix + b"\x80" * pad, length)
    hi = _decode_bits(prefix + b"\xbf" * pad, length)
    lo, hi = max(lo, lowest), min(hi, highest)
    return (lo, hi) if lo <= hi else None


def _decode_bits(seq: bytes, length: int) -> int:
    value = seq[0] & (0x7F >> length)
    for b in seq[1:]:
        value = (value << 6) | (b & 0x3F)
    return value


# --------------------------------------------------------------------------- constraints


class RefConstraint:
    """One compiled constraint. Subclasses define the per-kind transition; this class adds
    the rules every kind shares (EOS, out-of-range IDs, sticky DEAD, memoized masks)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.eos = frozenset(vocab.eos_token_ids)
        self._allowed: dict[Hashable, frozenset[int]] = {}
        self._packed: dict[Hashable, np.ndarray] = {}

    def initial_state(self) -> Hashable:
        raise NotImplementedError

    def is_accepting(self, state: Hashable) -> bool:
        raise NotImplementedError

    def _allowed_non_eos(self, state: Hashable) -> frozenset[int]:
        raise NotImplementedError

    def _step(self, state: Hashable, token: int) -> Hashable:
        """The successor for a token already known to be allowed (EOS included)."""
        raise NotImplementedError

    def is_dead(self, state: Hashable) -> bool:
        return state is DEAD

    def allowed(self, state: Hashable) -> frozenset[int]:
        """Allowed IDs in ``state`` (EOS included when accepting), before dead-row handling."""
        if state is DEAD:
            return frozenset()
        cached = self._allowed.get(state)
        if cached is None:
            cached = self._allowed_non_eos(state) - self.eos
            if self.is_accepting(state):
                cached |= self.eos
            self._allowed[state] = cached
        return cached

    def packed(self, state: Hashable) -> np.ndarray:
        """The allowed set as a bitmask row, memoized per state like ``allowed``."""
        cached = self._packed.get(state)
        if cached is None:
            cached = pack_allowed(self.allowed(state), self.vocab.size)
            self._packed[state] = cached
        return cached

    def advance(self, state: Hashable, token: int) -> Hashable:
        if state is DEAD or not 0 <= token < len(self.vocab.tokens):
            return DEAD
        if token not in self.allowed(state):
            return DEAD
        return self._step(state, token)


class _TokenSetConstraint(RefConstraint):
    def __init__(self, vocab: Vocabulary, spec: TokenSet) -> None:
        super().__init__(vocab)
        _check_ids(vocab, spec.token_ids, "banned_tokens" if spec.banned else "allowed_tokens")
        everything = frozenset(range(len(vocab.tokens)))
        self._set = everything - spec.token_ids if spec.banned else spec.token_ids

    def initial_state(self) -> Hashable:
        return 0

    def is_accepting(self, state: Hashable) -> bool:
        return state is not DEAD

    def _allowed_non_eos(self, state: Hashable) -> frozenset[int]:
        return self._set

    def _step(self, state: Hashable, token: int) -> Hashable:
        return state


def _check_ids(vocab: Vocabulary, ids: frozenset[int], kind: str) -> None:
    for token in sorted(ids):
        if token >= len(vocab.tokens):
            raise ConstraintError(
                f"{kind} lists token ID {token}, outside the vocabulary "
                f"of {len(vocab.tokens)} tokens"
            )
        if token in vocab.eos_token_ids:
            raise ConstraintError(f"{kind} lists EOS token ID {token}; EOS is always allowed")


class _MaxTokensConstraint(RefConstraint):
    """State: tokens fed so far, capped at the limit (the mask is the same past it)."""

    def __init__(self, vocab: Vocabulary, spec: MaxTokens) -> None:
        super().__init__(vocab)
        self.limit = spec.limit
        self._all = frozenset(range(len(vocab.tokens)))

    def initial_state(self) -> Hashable:
        return 0

    def is_accepting(self, state: Hashable) -> bool:
        return state is not DEAD

    def _allowed_non_eos(self, state: Hashable) -> frozenset[int]:
        assert isinstance(state, int)
        return self._all if state < self.limit else frozenset()

    def _step(self, state: Hashable, token: int) -> Hashable:
        assert isinstance(state, int)
        return min(state + 1, self.limit)


class _BytesConstraint(RefConstraint):
    """Choice and regex: a token is allowed when its (non-empty) bytes keep the state live;
    EOS leaves an accepting state unchanged."""

    def _feed_bytes(self, state: Hashable, data: bytes) -> Hashable:
        raise NotImplementedError

    def _allowed_non_eos(self, state: Hashable) -> frozenset[int]:
        return frozenset(
            t
            for t, data in enumerate(self.vocab.tokens)
            if data and t not in self.eos and self._feed_bytes(state, data) is not DEAD
        )

    def _step(self, state: Hashable, token: int) -> Hashable:
        if token in self.eos:
            return state
        return self._feed_bytes(state, self.vocab.tokens[token])


class _ChoiceConstraint(_BytesConstraint):
    """State: the output bytes so far (always a prefix of some choice)."""

    def __init__(self, vocab: Vocabulary, spec: Choice) -> None:
        super().__init__(vocab)
        self.choices = sorted({s.encode("utf-8") for s in spec.strings})
        self._set = frozenset(self.choices)

    def initial_state(self) -> Hashable:
        return b""

    def is_accepting(self, state: Hashable) -> bool:
        return state in self._set

    def _feed_bytes(self, state: Hashable, data: bytes) -> Hashable:
        assert isinstance(state, bytes)
        text = state + data
        i = bisect_left(self.choices, text)
        return text if i < len(self.choices) and self.choices[i].startswith(text) else DEAD


class _RegexConstraint(_BytesConstraint):
    """State: (frozenset of live NFA states, pending bytes of an incomplete UTF-8 char)."""

    def __init__(self, vocab: Vocabulary, spec: Regex) -> None:
        super().__init__(vocab)
        builder = _RegexBuilder()
        start, self.accept = builder.build(spec.pattern)
        self.nfa = builder.nfa
        self.live = self._coreachable()
        self._closures: dict[frozenset[int], frozenset[int]] = {}
        self._byte_steps: dict[tuple[Hashable, int], Hashable] = {}
        self._start = self._closure(frozenset([start]))

    def _coreachable(self) -> frozenset[int]:
        """NFA states from which the accepting state can be reached."""
        reverse: list[list[int]] = [[] for _ in self.nfa.eps]
        for s, targets in enumerate(self.nfa.eps):
            for t in targets:
                reverse[t].append(s)
        for s, edges in enumerate(self.nfa.edges):
            for ranges, t in edges:
                if ranges:
                    reverse[t].append(s)
        seen = {self.accept}
        todo = [self.accept]
        while todo:
            for s in reverse[todo.pop()]:
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        return frozenset(seen)

    def _closure(self, states: frozenset[int]) -> frozenset[int]:
        cached = self._closures.get(states)
        if cached is None:
            seen = set(states)
            todo = list(states)
            while todo:
                for t in self.nfa.eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            cached = frozenset(seen & self.live)
            self._closures[states] = cached
        return cached

    def _live_edges(self, states: frozenset[int]) -> Iterable[tuple[Ranges, int]]:
        for s in states:
            for ranges, target in self.nfa.edges[s]:
                if target in self.live:
                    yield ranges, target

    def initial_state(self) -> Hashable:
        return (self._start, b"") if self._start else DEAD

    def is_accepting(self, state: Hashable) -> bool:
        if state is DEAD:
            return False
        assert isinstance(state, tuple)
        states, pending = state
        return not pending and self.accept in states

    def _feed_bytes(self, state: Hashable, data: bytes) -> Hashable:
        for b in data:
            if state is DEAD:
                return DEAD
            key = (state, b)
            nxt = self._byte_steps.get(key)
            if nxt is None:
                nxt = self._feed_byte(state, b)
                self._byte_steps[key] = nxt
            state = nxt
        return state

    def _feed_byte(self, state: Hashable, b: int) -> Hashable:
        assert isinstance(state, tuple)
        states, pending = state
        seq = pending + bytes([b])
        if len(seq) == 1 and b < 0x80:
            return self._step_code_point(states, b)
        span = _utf8_prefix_range(seq)
        if span is None:
            # Either invalid, or a complete multi-byte sequence: decode it to find out.
            try:
                char = seq.decode("utf-8")
            except UnicodeDecodeError:
                return DEAD
            return self._step_code_point(states, ord(char))
        lo, hi = span
        if any(_intersects(ranges, lo, hi) for ranges, _ in self._live_edges(states)):
            return (states, seq)
        return DEAD

    def _step_code_point(self, states: frozenset[int], cp: int) -> Hashable:
        targets = frozenset(t for ranges, t in self._live_edges(states) if _contains(ranges, cp))
        closure = self._closure(targets) if targets else frozenset()
        return (closure, b"") if closure else DEAD


class _AllConstraint(RefConstraint):
    """State: one state per part; dead as soon as any part is."""

    def __init__(self, vocab: Vocabulary, parts: Sequence[RefConstraint]) -> None:
        super().__init__(vocab)
        self.parts = tuple(parts)

    def initial_state(self) -> Hashable:
        return self._join(tuple(p.initial_state() for p in self.parts))

    @staticmethod
    def _join(states: tuple[Hashable, ...]) -> Hashable:
        return DEAD if any(s is DEAD for s in states) else states

    def is_accepting(self, state: Hashable) -> bool:
        if state is DEAD:
            return False
        assert isinstance(state, tuple)
        return all(p.is_accepting(s) for p, s in zip(self.parts, state, strict=True))

    def _allowed_non_eos(self, state: Hashable) -> frozenset[int]:
        assert isinstance(state, tuple)
        result: frozenset[int] | None = None
        for part, s in zip(self.parts, state, strict=True):
            allowed = part.allowed(s)
            result = allowed if result is None else result & allowed
        return result or frozenset()

    def _step(self, state: Hashable, token: int) -> Hashable:
        assert isinstance(state, tuple)
        return self._join(
            tuple(p.advance(s, token) for p, s in zip(self.parts, state, strict=True))
        )


# --------------------------------------------------------------------------- engine and batch


class ReferenceEngine:
    """Compiles specs against one vocabulary; compiled constraints are cached by spec key."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._cache: dict[str, RefConstraint] = {}

    def compile(self, spec: ConstraintSpec) -> RefConstraint:
        key = spec_key(spec)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._compile(spec)
            self._cache[key] = compiled
        return compiled

    def _compile(self, spec: ConstraintSpec) -> RefConstraint:
        factories: dict[type, Callable[[Any], RefConstraint]] = {
            Choice: lambda s: _ChoiceConstraint(self.vocab, s),
            Regex: lambda s: _RegexConstraint(self.vocab, s),
            TokenSet: lambda s: _TokenSetConstraint(self.vocab, s),
            MaxTokens: lambda s: _MaxTokensConstraint(self.vocab, s),
            All: lambda s: _AllConstraint(self.vocab, [self._compile(p) for p in s.parts]),
        }
        factory = factories.get(type(spec))
        if factory is None:
            raise ConstraintError(f"unknown constraint spec {spec!r}")
        return factory(spec)

    def new_batch(self, max_rows: int) -> ReferenceBatch:
        return ReferenceBatch(self.vocab, max_rows)


@dataclass
class _Row:
    compiled: RefConstraint
    state: Hashable
    output: list[int] | None
    prompt: list[int] | None
    original_prompt: tuple[int, ...] | None
    consumed: int = 0
    last_fed: int | None = None


class ReferenceBatch:
    """Rows of requests; ``fill`` syncs each occupied row with its live list, then masks."""

    def __init__(self, vocab: Vocabulary, max_rows: int) -> None:
        self.vocab = vocab
        self.max_rows = max_rows
        self.rows: list[_Row | None] = [None] * max_rows
        self._dead_mask = self._make_dead_mask()

    def _make_dead_mask(self) -> np.ndarray:
        """EOS only, so the request ends; every real token if there is no EOS."""
        ids = self.vocab.eos_token_ids or range(len(self.vocab.tokens))
        return pack_allowed(ids, self.vocab.size)

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.max_rows:
            raise IndexError(f"row {row} is outside the batch of {self.max_rows} rows")

    def add(
        self,
        row: int,
        compiled: Any,
        output_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> None:
        self._check_row(row)
        original = tuple(prompt_ids) if prompt_ids is not None else None
        self.rows[row] = _Row(compiled, compiled.initial_state(), output_ids, prompt_ids, original)

    def remove(self, row: int) -> None:
        self._check_row(row)
        self.rows[row] = None

    def swap(self, a: int, b: int) -> None:
        self._check_row(a)
        self._check_row(b)
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]

    def move(self, src: int, dst: int) -> None:
        self._check_row(src)
        self._check_row(dst)
        if src != dst:
            self.rows[dst], self.rows[src] = self.rows[src], None

    def advance(self, row: int, tokens: Sequence[int]) -> None:
        """Feed tokens explicitly; every ID counts (a negative one is out of range)."""
        self._check_row(row)
        entry = self.rows[row]
        if entry is None:
            return
        for token in tokens:
            entry.state = entry.compiled.advance(entry.state, token)

    def occupied_rows(self) -> list[int]:
        return [i for i, entry in enumerate(self.rows) if entry is not None]

    def start_fill(self, bitmask: np.ndarray) -> list[int]:
        """The reference engine fills nothing ahead: ``fill`` does all the work (a valid
        answer under the protocol, which lets an engine start any subset of rows)."""
        return []

    def fill(self, bitmask: np.ndarray) -> list[int]:
        dead: list[int] = []
        for i, entry in enumerate(self.rows):
            if entry is None:
                continue
            if entry.output is not None:
                _sync(entry)
            state = entry.state
            if entry.compiled.is_dead(state) or not entry.compiled.allowed(state):
                bitmask[i, :] = self._dead_mask
                dead.append(i)
            else:
                bitmask[i, :] = entry.compiled.packed(state)
        return dead


def _feed_until_placeholder(entry: _Row, tokens: Sequence[int]) -> int:
    """Feed tokens up to the first negative ID; return how many were fed."""
    fed = 0
    for token in tokens:
        if token < 0:
            break
        entry.state = entry.compiled.advance(entry.state, token)
        entry.last_fed = token
        fed += 1
    return fed


def _sync(entry: _Row) -> None:
    output = entry.output
    assert output is not None
    consumed = entry.consumed
    rewritten = len(output) < consumed or (consumed > 0 and output[consumed - 1] != entry.last_fed)
    if not rewritten:
        entry.consumed += _feed_until_placeholder(entry, output[consumed:])
        return
    entry.state = entry.compiled.initial_state()
    entry.last_fed = None
    original = entry.original_prompt
    if entry.prompt is not None and original is not None:
        history = list(entry.prompt) + list(output)
        if tuple(history[: len(original)]) == original:
            from_prompt = len(entry.prompt) - len(original)
            fed = _feed_until_placeholder(entry, history[len(original) :])
            entry.consumed = max(0, fed - from_prompt)
            return
    entry.consumed = _feed_until_placeholder(entry, output)
