"""The native (C++) constraint engine behind the same interface as the reference engine.

Compiled constraints are cached per spec on the engine, and an engine belongs to one
vocabulary, so the cache is keyed by (constraint, tokenizer) as the decode loop needs: a regex
or a catalog is compiled once and then shared by every request that carries it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from serving.constraints import _native
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

NativeConstraint = _native.Constraint
NativeBatch = _native.Batch


class NativeEngine:
    """Compiles constraints for one vocabulary and makes batches of per-request state."""

    def __init__(self, vocab: Vocabulary, cache_size: int = 256) -> None:
        self.vocab = vocab
        self.native_vocab = _native.Vocab(list(vocab.tokens), list(vocab.eos_token_ids), vocab.size)
        self._cache: OrderedDict[str, _native.Constraint] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, spec: ConstraintSpec) -> _native.Constraint:
        key = spec_key(spec)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        parts = spec.parts if isinstance(spec, All) else (spec,)
        compiled = _native.Constraint(self.native_vocab, [self._part(p) for p in parts])
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def new_batch(self, max_rows: int) -> _native.Batch:
        return _native.Batch(self.native_vocab, max_rows)

    def _part(self, spec: ConstraintSpec) -> _native.Part:
        vocab = self.native_vocab
        if isinstance(spec, Choice):
            return _native.choice(vocab, [s.encode("utf-8") for s in spec.strings])
        if isinstance(spec, Regex):
            return _native.regex(vocab, spec.pattern)
        if isinstance(spec, TokenSet):
            return _native.token_set(vocab, sorted(spec.token_ids), spec.banned)
        if isinstance(spec, MaxTokens):
            return _native.max_tokens(vocab, spec.limit)
        raise ConstraintError("'all' cannot be nested inside another 'all'")


def threads() -> int:
    """Size of the engine's persistent thread pool (``CONSTRAINTS_THREADS`` sets it)."""
    return int(_native.threads())
