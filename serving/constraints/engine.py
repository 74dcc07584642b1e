"""The interface both constraint engines (pure-Python reference and native C++) implement.

Adapters (vLLM, Hugging Face) are written against these protocols only, so the tests can run
the same adapter over the reference engine and the native one and compare them row by row.
The semantics every implementation must follow are in ``docs/constraints.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import ConstraintSpec


class Compiled(Protocol):
    """A compiled constraint: immutable, shared by every request that uses it."""


class Batch(Protocol):
    @property
    def max_rows(self) -> int: ...

    def add(
        self,
        row: int,
        compiled: Any,
        output_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> None: ...

    def remove(self, row: int) -> None: ...

    def swap(self, a: int, b: int) -> None: ...

    def move(self, src: int, dst: int) -> None: ...

    def advance(self, row: int, tokens: Sequence[int]) -> None: ...

    def fill(self, bitmask: np.ndarray) -> list[int]: ...

    def start_fill(self, bitmask: np.ndarray) -> list[int]:
        """Start filling, in the background, the rows whose tokens are all known (it syncs with
        the live lists now); return those rows. The next ``fill`` with the same array finishes
        the job, refilling only rows whose lists changed since. Until then the array must not be
        written, and any other call on the batch first waits for the background work."""
        ...

    def occupied_rows(self) -> list[int]: ...


class Engine(Protocol):
    vocab: Vocabulary

    def compile(self, spec: ConstraintSpec) -> Any: ...

    def new_batch(self, max_rows: int) -> Batch: ...


logger = logging.getLogger("serving.constraints")


def log_dead_rows(rows: list[int]) -> None:
    """Dead rows are forced to EOS; say so once per request, so an operator can find them."""
    logger.warning(
        "constraint dead in rows %s (it allows nothing, or was fed a token it did not allow); "
        "only EOS is allowed there",
        rows,
    )


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> np.ndarray:
    """An int32 bitmask ``[rows, ceil(vocab_size / 32)]`` with every token allowed."""
    return np.full((rows, bitmask_words(vocab_size)), -1, dtype=np.int32)
