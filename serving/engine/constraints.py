"""Per-request output constraints for the CPU engine, as one token mask per row and step.

Two sources, one bitmask layout (int32 words, bit ``t`` = token ``t`` allowed):
- the platform's native engine (:mod:`serving.constraints`) for ``regex`` and ``choice``
  structured outputs and the platform's own ``extra_args.constraint``;
- XGrammar for JSON schema, ``json_object`` and EBNF grammars, which need a pushdown automaton
  (nesting) that a regex DFA cannot express; JSON schemas become EBNF first
  (:mod:`serving.constraints.json_schema`), exactly as for vLLM.

A request may carry both (say a JSON schema plus ``max_tokens`` or a banned-token set); the
row's mask is then their intersection.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from serving.constraints import ConstraintError, validate_spec
from serving.constraints.engine import allocate_bitmask
from serving.constraints.json_schema import structured_grammar
from serving.constraints.native import NativeEngine
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import All, Choice, ConstraintSpec, Regex
from serving.sampling.types import InvalidRequestError, SamplingOptions


@dataclass(frozen=True)
class CompiledConstraints:
    """What a request's options compile to; either part may be absent."""

    native: Any | None = None
    grammar: Any | None = None  # an xgrammar CompiledGrammar


class ConstraintCompiler:
    """Compiles a request's constraints once, at admission, off the decode loop.

    Holds the tokenizer-specific state both engines need; both cache compiled results."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.vocab_size = vocab_size
        vocab = Vocabulary.from_hf_tokenizer(
            tokenizer, size=vocab_size, eos_token_ids=eos_token_ids
        )
        self.native = NativeEngine(vocab)
        self._tokenizer = tokenizer
        self._eos = eos_token_ids
        self._xgrammar: Any | None = None
        self._lock = threading.Lock()

    def compile(self, options: SamplingOptions) -> CompiledConstraints | None:
        parts: list[ConstraintSpec] = []
        if options.constraint is not None:
            parts.append(options.constraint)
        structured = options.structured
        grammar = None
        if structured is not None:
            if structured.regex is not None:
                parts.append(Regex(structured.regex))
            elif structured.choice is not None:
                parts.append(Choice(tuple(sorted(set(structured.choice)))))
            else:
                grammar = self._compile_grammar(structured)
        native = None
        if parts:
            spec = parts[0] if len(parts) == 1 else All(tuple(parts))
            try:
                validate_spec(spec)
                native = self.native.compile(spec)
            except ConstraintError as exc:
                raise InvalidRequestError(f"constraint: {exc}") from None
        if native is None and grammar is None:
            return None
        return CompiledConstraints(native=native, grammar=grammar)

    def _compile_grammar(self, structured: Any) -> Any:
        compiler = self._grammar_compiler()
        try:
            return compiler.compile_grammar(structured_grammar(structured))
        except InvalidRequestError:
            raise
        except (RuntimeError, ValueError) as exc:
            kind = "json" if structured.json_schema is not None else "grammar"
            raise InvalidRequestError(f"structured_outputs.{kind}: {exc}") from None

    def _grammar_compiler(self) -> Any:
        with self._lock:
            if self._xgrammar is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self._eos)
                )
                self._xgrammar = xgrammar.GrammarCompiler(info, cache_enabled=True)
            return self._xgrammar


class CohortMasks:
    """The masks of one batch of rows (a cohort) as it decodes.

    Rows keep the slot they were admitted in; the cohort passes the slots still running, in
    the order of its logits."""

    def __init__(self, compiler: ConstraintCompiler, constraints: list[CompiledConstraints | None]):
        self.words = (compiler.vocab_size + 31) // 32
        self._native_rows = [i for i, c in enumerate(constraints) if c and c.native is not None]
        self._batch = compiler.native.new_batch(len(constraints)) if self._native_rows else None
        self._bitmask = allocate_bitmask(len(constraints), compiler.vocab_size)
        self._matchers: dict[int, Any] = {}
        for slot, compiled in enumerate(constraints):
            if compiled is None:
                continue
            if compiled.native is not None:
                assert self._batch is not None
                self._batch.add(slot, compiled.native)
            if compiled.grammar is not None:
                import xgrammar

                self._matchers[slot] = xgrammar.GrammarMatcher(compiled.grammar)
        self.active = bool(self._native_rows or self._matchers)

    def accept(self, slot: int, token: int) -> None:
        """Advance ``slot``'s constraints with the token it just produced."""
        if self._batch is not None and slot in self._native_rows:
            self._batch.advance(slot, [token])
        matcher = self._matchers.get(slot)
        if matcher is not None and not matcher.is_terminated():
            matcher.accept_token(token)

    def release(self, slot: int) -> None:
        if self._batch is not None and slot in self._native_rows:
            self._batch.remove(slot)
            self._native_rows.remove(slot)
        self._matchers.pop(slot, None)

    def apply_(self, logits: torch.Tensor, slots: list[int]) -> None:
        """Mask ``logits`` (one row per slot in ``slots``) in place."""
        if not self.active:
            return
        from serving.constraints.apply import apply_bitmask_

        rows = [i for i, s in enumerate(slots) if s in self._matchers or s in self._native_rows]
        if not rows:
            return
        if self._batch is not None:
            self._batch.fill(self._bitmask)
        mask = torch.from_numpy(np.ascontiguousarray(self._bitmask[slots]))
        if self._matchers:
            import xgrammar

            scratch = xgrammar.allocate_token_bitmask(1, self.words * 32)
            for i, slot in enumerate(slots):
                matcher = self._matchers.get(slot)
                if matcher is None or matcher.is_terminated():
                    continue
                matcher.fill_next_token_bitmask(scratch, 0)
                mask[i] &= scratch[0, : self.words]
        apply_bitmask_(logits, mask, rows=rows)
