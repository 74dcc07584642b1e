"""Hugging Face ``generate`` logits processor over a constraint engine (the CPU serving path).

``generate`` hands a logits processor the full ``input_ids`` (prompt and generated tokens) and
the next-token scores of every row. Rows here are ``batch * k`` where ``k`` is
``num_return_sequences`` (sampling) or ``num_beams`` (beam search): ``generate`` repeats each
prompt ``k`` times in a row, so row ``r`` carries the constraint of prompt ``r // k``.

Each row's generated tokens are fed to the engine explicitly (``Batch.advance``). The adapter
remembers what it fed each row; when a row's history is not an extension of it (beam search
reorders beams every step) the row is re-admitted and fed its whole history again, so beams are
supported without knowing the beam indices. After a row emits EOS nothing more is fed (padding
follows it in finished rows), so a finished request is not reported dead.

An instance serves one ``generate`` call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from serving.constraints.apply import apply_bitmask_
from serving.constraints.engine import Batch, Engine, allocate_bitmask, log_dead_rows


class ConstraintLogitsProcessor(LogitsProcessor):
    """``constraints[i]`` is the compiled constraint of prompt ``i`` (None: unconstrained).

    ``prompt_length`` is the column where generated tokens start (with left padding every
    prompt ends at the same column); by default it is the width of ``input_ids`` at the first
    call, which in ``generate`` is the padded prompt."""

    def __init__(
        self,
        engine: Engine,
        constraints: Sequence[Any | None],
        prompt_length: int | None = None,
    ) -> None:
        if not constraints:
            raise ValueError("constraints must have one entry (or None) per prompt")
        self.engine = engine
        self.constraints = list(constraints)
        self.prompt_length = prompt_length
        self.dead_rows_total = 0
        """Requests that went dead and were forced to EOS; each counts once."""
        self._batch: Batch | None = None
        self._bitmask: np.ndarray | None = None
        self._fed: list[list[int]] = []
        self._finished: list[bool] = []
        self._per_prompt = 1
        self._dead: set[int] = set()
        self._eos = frozenset(engine.vocab.eos_token_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[-1] > self.engine.vocab.size:
            raise ValueError(
                f"scores are {scores.shape[-1]} wide but the constraint vocabulary has "
                f"{self.engine.vocab.size} tokens: build the Vocabulary with size set to the "
                "model's vocab_size"
            )
        if self._batch is None:
            self._start(input_ids)
        batch = self._batch
        assert batch is not None and self._bitmask is not None and self.prompt_length is not None
        if input_ids.shape[0] != batch.max_rows:
            raise ValueError(
                f"generate passed {input_ids.shape[0]} rows after {batch.max_rows}: one "
                "processor serves one generate call"
            )
        rows = batch.occupied_rows()
        if not rows:
            return scores
        generated = input_ids[:, self.prompt_length :].tolist()
        for row in rows:
            self._sync(row, generated[row])
        dead = batch.fill(self._bitmask)
        new_dead = [row for row in dead if row not in self._dead and not self._finished[row]]
        if new_dead:
            self._dead.update(new_dead)
            self.dead_rows_total += len(new_dead)
            log_dead_rows(new_dead)
        apply_bitmask_(scores, self._bitmask, rows=rows)
        return scores

    def _start(self, input_ids: torch.Tensor) -> None:
        total = input_ids.shape[0]
        if total % len(self.constraints):
            raise ValueError(
                f"generate passed {total} rows for {len(self.constraints)} prompts: expected "
                "a multiple (num_return_sequences or num_beams rows per prompt)"
            )
        self._per_prompt = total // len(self.constraints)
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        self._batch = self.engine.new_batch(total)
        self._bitmask = allocate_bitmask(total, self.engine.vocab.size)
        self._fed = [[] for _ in range(total)]
        self._finished = [False] * total
        for row in range(total):
            compiled = self._constraint_of(row)
            if compiled is not None:
                self._batch.add(row, compiled)

    def _constraint_of(self, row: int) -> Any | None:
        """``generate`` repeats each prompt ``k`` times in a row, so row r is prompt r // k."""
        return self.constraints[row // self._per_prompt]

    def _sync(self, row: int, history: list[int]) -> None:
        """Feed ``row`` what it generated since the last call (up to its first EOS)."""
        batch = self._batch
        assert batch is not None
        fed = self._fed[row]
        if history[: len(fed)] != fed:
            # Another beam's history now sits in this row: start the row over.
            batch.add(row, self._constraint_of(row))
            self._dead.discard(row)
            fed.clear()
            self._finished[row] = False
        if self._finished[row]:
            return
        new = history[len(fed) :]
        for i, token in enumerate(new):
            if token in self._eos:
                new = new[: i + 1]
                self._finished[row] = True
                break
        if new:
            batch.advance(row, new)
            fed.extend(new)
