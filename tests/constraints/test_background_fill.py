"""The native batch's background fill (``start_fill`` then ``fill``) against a plain ``fill``.

Two batches over the same constraints see the same live lists and the same operations; one
starts its fill early at random points, the other only ever calls ``fill``. Between the start
and the fill the lists change the way vLLM changes them (placeholders filled in, tokens
appended, histories cut back by a preemption) and the batch itself is changed (remove, add,
swap, move, advance), which must wait for the background work and invalidate what it wrote.
Every ``fill`` must give the same bitmask and the same dead rows on both.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from serving.constraints import parse_constraint
from serving.constraints.engine import allocate_bitmask
from serving.constraints.native import NativeEngine
from serving.constraints.vocab import Vocabulary

TOKENS = [bytes([c]) for c in b"abcdelr0123-"] + [b"ab", b"re", b"red", b"12", b""]
EOS = len(TOKENS) - 1
VOCAB = Vocabulary.of(TOKENS, [EOS], size=len(TOKENS) + 40)
CONSTRAINTS = [
    {"choice": ["red", "abc-12", "a"]},
    {"regex": "[a-c]{1,3}-[0-9]+"},
    {"regex": "(ab)+c?"},
    {"all": [{"regex": "[a-e]+"}, {"max_tokens": 4}]},
    {"allowed_tokens": [0, 1, 12]},
]


@pytest.fixture(scope="module")
def engine() -> NativeEngine:
    return NativeEngine(VOCAB)


class Twin:
    """The two batches and the rows' live lists (one copy per batch, kept equal)."""

    def __init__(self, engine: NativeEngine, rng: random.Random, rows: int) -> None:
        self.engine = engine
        self.rng = rng
        self.early = engine.new_batch(rows)
        self.plain = engine.new_batch(rows)
        self.lists: dict[int, tuple[list[int], list[int]]] = {}
        self.rows = rows
        self.mask_early = allocate_bitmask(rows, VOCAB.size)
        self.mask_plain = allocate_bitmask(rows, VOCAB.size)

    def both(self, name: str, *args: object) -> None:
        getattr(self.early, name)(*args)
        getattr(self.plain, name)(*args)

    def add(self, row: int) -> None:
        compiled = self.engine.compile(parse_constraint(self.rng.choice(CONSTRAINTS)))
        first: list[int] = []
        second: list[int] = []
        self.lists[row] = (first, second)
        self.early.add(row, compiled, first)
        self.plain.add(row, compiled, second)

    def edit_lists(self) -> None:
        """What vLLM does to live lists: append, put in a placeholder, fill it, cut back."""
        for first, second in self.lists.values():
            roll = self.rng.random()
            for out in (first, second):
                if roll < 0.3 and out and out[-1] == -1:
                    out[-1] = self._token(roll)
                elif roll < 0.55:
                    out.append(self._token(roll))
                elif roll < 0.7:
                    out.append(-1)
                elif roll < 0.75 and out:
                    del out[int(roll * 1000) % len(out) :]

    def _token(self, roll: float) -> int:
        return int(roll * 100_003) % len(TOKENS)

    def change_batch(self) -> None:
        rng = self.rng
        roll = rng.random()
        a, b = rng.randrange(self.rows), rng.randrange(self.rows)
        occupied = set(self.early.occupied_rows())
        if roll < 0.2:
            self.both("remove", a)
            self.lists.pop(a, None)
        elif roll < 0.4:
            self.add(a)
        elif roll < 0.6:
            self.both("swap", a, b)
            la, lb = self.lists.pop(a, None), self.lists.pop(b, None)
            if la is not None:
                self.lists[b] = la
            if lb is not None:
                self.lists[a] = lb
        elif roll < 0.75 and a in occupied:
            self.both("move", a, b)
            if a != b:
                self.lists[b] = self.lists.pop(a)
        elif roll < 0.85 and a in occupied:
            # advance feeds a row added with a live list too; keep both sides equal
            token = rng.randrange(len(TOKENS) - 1)
            self.both("advance", a, [token])

    def fill_and_compare(self) -> None:
        dead_early = self.early.fill(self.mask_early)
        dead_plain = self.plain.fill(self.mask_plain)
        occupied = self.plain.occupied_rows()
        assert dead_early == dead_plain
        assert np.array_equal(self.mask_early[occupied], self.mask_plain[occupied])


@pytest.mark.parametrize("seed", range(30))
def test_start_then_fill_equals_fill(engine: NativeEngine, seed: int) -> None:
    rng = random.Random(seed)
    twin = Twin(engine, rng, rows=rng.choice([1, 4, 9]))
    for row in range(twin.rows):
        if rng.random() < 0.8:
            twin.add(row)
    for _ in range(80):
        twin.edit_lists()
        if rng.random() < 0.7:
            started = twin.early.start_fill(twin.mask_early)
            assert set(started) <= set(twin.early.occupied_rows())
            if rng.random() < 0.5:
                twin.edit_lists()
            if rng.random() < 0.3:
                twin.change_batch()
        else:
            twin.change_batch()
        twin.fill_and_compare()


def test_rows_waiting_on_a_placeholder_are_left_for_fill(engine: NativeEngine) -> None:
    compiled = engine.compile(parse_constraint({"choice": ["red", "abc-12"]}))
    batch = engine.new_batch(3)
    waiting, ready = [TOKENS.index(b"r"), -1], [TOKENS.index(b"a")]
    batch.add(0, compiled, waiting)
    batch.add(2, compiled, ready)
    mask = allocate_bitmask(3, VOCAB.size)
    assert batch.start_fill(mask) == [2]
    waiting[-1] = TOKENS.index(b"e")
    assert batch.fill(mask) == []
    allowed = np.unpackbits(mask[0].view(np.uint8), bitorder="little")
    assert [t for t in range(VOCAB.size) if allowed[t]] == [TOKENS.index(b"d")]


def test_fill_into_another_array_refills_every_row(engine: NativeEngine) -> None:
    compiled = engine.compile(parse_constraint({"allowed_tokens": [1, 2]}))
    batch = engine.new_batch(2)
    batch.add(0, compiled, [])
    batch.add(1, compiled, [])
    started = allocate_bitmask(2, VOCAB.size)
    assert batch.start_fill(started) == [0, 1]
    other = allocate_bitmask(2, VOCAB.size)
    batch.fill(other)
    assert np.array_equal(other, started)
    assert not np.array_equal(other, allocate_bitmask(2, VOCAB.size))


def test_a_dead_row_found_in_the_background_is_reported_by_fill(engine: NativeEngine) -> None:
    compiled = engine.compile(parse_constraint({"choice": ["red"]}))
    batch = engine.new_batch(1)
    batch.add(0, compiled, [TOKENS.index(b"a")])  # a token the choice does not allow
    mask = allocate_bitmask(1, VOCAB.size)
    assert batch.start_fill(mask) == [0]
    assert batch.fill(mask) == [0]


def test_start_fill_checks_the_bitmask(engine: NativeEngine) -> None:
    batch = engine.new_batch(2)
    batch.add(1, engine.compile(parse_constraint({"max_tokens": 2})), [])
    with pytest.raises(ValueError, match="fewer rows"):
        batch.start_fill(allocate_bitmask(1, VOCAB.size))
    with pytest.raises(ValueError, match="words per row"):
        batch.start_fill(np.zeros((2, 1), dtype=np.int32))
