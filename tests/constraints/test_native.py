"""The native engine on its own: regex dialect against Python's re, errors, batches, apply.

Bit-for-bit agreement with the pure-Python reference is in test_native_vs_reference.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.constraints import ConstraintError, parse_constraint, validate_spec
from serving.constraints.apply import _apply_torch_, apply_bitmask_
from serving.constraints.engine import allocate_bitmask
from serving.constraints.native import NativeEngine
from serving.constraints.vocab import Vocabulary
from tests.constraints.helpers import allowed_ids

EOS = 256
BYTE_VOCAB = Vocabulary.of([bytes([b]) for b in range(256)] + [b""], [EOS])


@pytest.fixture(scope="module")
def byte_engine() -> NativeEngine:
    return NativeEngine(BYTE_VOCAB)


def run(engine: NativeEngine, constraint: dict, data: bytes) -> tuple[bool, bool]:
    """Feeds `data` byte by byte; returns (accepting, dead)."""
    batch = engine.new_batch(1)
    batch.add(0, engine.compile(parse_constraint(constraint)))
    batch.advance(0, list(data))
    return batch.is_accepting(0), batch.is_dead(0)


PATTERNS = [
    r"[A-Z]{3}-\d{4}",
    r"(ab|a)*c?",
    r"\w+@\w+\.(com|org)",
    r"[^a-c]{1,3}",
    r"é+|ü?",
    r".{2}",
    r"\s*\S\s*",
    r"(?:x|y)+(?P<tail>z)?",
    r"^[0-9]+(\.[0-9]+)?$",
    r"[\x41-\x43\u00e9]+",
    r"a{2,}b{,2}",
    r"[a-]+[]x]",
    r"\W\D",
    r"€[0-9]{1,2}",
    r"(|a)b",
]


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="abcxyzAB019-_.@ \n\té€ü]", max_size=8))
def test_regex_accepts_exactly_what_python_re_fullmatches(byte_engine, pattern, text):
    accepting, dead = run(byte_engine, {"regex": pattern}, text.encode())
    expected = re.fullmatch(pattern, text, re.ASCII) is not None
    assert accepting == expected
    if expected:
        assert not dead


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_samples_built_under_the_mask_are_matches(byte_engine, pattern):
    """Walking only allowed bytes and stopping where EOS is allowed yields real matches."""
    rng = np.random.default_rng(7)
    compiled = byte_engine.compile(parse_constraint({"regex": pattern}))
    mask = allocate_bitmask(1, BYTE_VOCAB.size)
    for _ in range(40):
        batch = byte_engine.new_batch(1)
        out: list[int] = []
        batch.add(0, compiled, out)
        for _ in range(30):
            assert batch.fill(mask) == []
            choices = allowed_ids(mask, 0, BYTE_VOCAB.size)
            token = int(rng.choice(choices))
            if token == EOS:
                break
            out.append(token)
        else:
            continue
        assert re.fullmatch(pattern, bytes(out).decode(), re.ASCII)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a(?=b)", "groups are supported"),
        (r"(a)\1", "backreferences"),
        ("a**", "multiple repeat"),
        ("*a", "nothing to repeat"),
        ("a{1001}", "above 1000"),
        ("a{3,2}", "min repeat greater than max repeat"),
        ("[abc", "unterminated character set"),
        ("(ab", "missing )"),
        ("ab)", "unbalanced parenthesis"),
        ("[z-a]", "bad character range"),
        (r"[\d-z]", "bad character range"),
        (r"\q", "bad escape"),
        (r"\bword", "word boundary"),
        ("a^b", "'^' is only supported"),
        ("a$b", "'$' is only supported"),
        ("a*+", "possessive"),
        ("(?i)a", "groups are supported"),
        (r"\x4", "incomplete escape"),
    ],
)
def test_unsupported_or_invalid_regexes_are_refused_with_the_reason(byte_engine, pattern, message):
    with pytest.raises(ConstraintError, match=re.escape(message)):
        byte_engine.compile(parse_constraint({"regex": pattern}))
    with pytest.raises(ConstraintError, match=re.escape(message)):
        validate_spec(parse_constraint({"regex": pattern}))


def test_a_regex_with_too_many_dfa_states_is_refused(byte_engine):
    with pytest.raises(ConstraintError, match="DFA exceeds"):
        byte_engine.compile(parse_constraint({"regex": "(a|b)*a(a|b){14}"}))


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"allowed_tokens": [300]}, "outside the vocabulary"),
        ({"banned_tokens": [EOS]}, "is an EOS token"),
        ({"all": [{"max_tokens": 3}, {"allowed_tokens": [257]}]}, "outside the vocabulary"),
    ],
)
def test_bad_token_ids_are_refused(byte_engine, constraint, message):
    with pytest.raises(ConstraintError, match=message):
        byte_engine.compile(parse_constraint(constraint))


def test_choice_strings_that_tokenize_differently_mid_stream():
    tokens = [b"Ca", b"t", b"C", b"at", b"alog", b"Cat", b" ", b"log", b""]
    vocab = Vocabulary.of(tokens, [8])
    engine = NativeEngine(vocab)
    compiled = engine.compile(parse_constraint({"choice": ["Cat", "Catalog"]}))
    mask = allocate_bitmask(1, vocab.size)
    for spelling in ([0, 1, 4], [2, 3, 4], [5, 4], [0, 1], [2, 3], [5]):
        batch = engine.new_batch(1)
        batch.add(0, compiled)
        batch.advance(0, spelling)
        assert batch.is_accepting(0), spelling
    batch = engine.new_batch(1)
    batch.add(0, compiled)
    batch.advance(0, [2])  # "C"
    batch.fill(mask)
    assert [tokens[t] for t in allowed_ids(mask, 0, vocab.size)] == [b"at"]
    batch.advance(0, [3])  # "Cat": accepting, and only "alog" continues it
    batch.fill(mask)
    assert [tokens[t] for t in allowed_ids(mask, 0, vocab.size)] == [b"alog", b""]
    batch.advance(0, [7])  # "Catlog" is no choice
    assert batch.is_dead(0)


def test_dead_rows_get_eos_only_and_are_reported(byte_engine):
    batch = byte_engine.new_batch(3)
    batch.add(0, byte_engine.compile(parse_constraint({"regex": "ab"})))
    batch.add(2, byte_engine.compile(parse_constraint({"regex": "[^\\x00-\\U0010FFFF]"})))
    batch.advance(0, [ord("x")])
    mask = allocate_bitmask(3, BYTE_VOCAB.size)
    assert batch.fill(mask) == [0, 2]
    assert allowed_ids(mask, 0, BYTE_VOCAB.size) == [EOS]
    assert allowed_ids(mask, 2, BYTE_VOCAB.size) == [EOS]
    assert (mask[1] == -1).all(), "an empty row is not touched"


def test_max_tokens_makes_eos_the_only_choice_and_counts_eos(byte_engine):
    compiled = byte_engine.compile(parse_constraint({"max_tokens": 2}))
    batch = byte_engine.new_batch(1)
    batch.add(0, compiled)
    mask = allocate_bitmask(1, BYTE_VOCAB.size)
    batch.advance(0, [1, 2])
    assert batch.fill(mask) == []
    assert allowed_ids(mask, 0, BYTE_VOCAB.size) == [EOS]
    batch.advance(0, [3])
    assert batch.is_dead(0)


def test_batch_rejects_bad_bitmasks_and_rows(byte_engine):
    batch = byte_engine.new_batch(2)
    batch.add(1, byte_engine.compile(parse_constraint({"max_tokens": 2})))
    with pytest.raises(ConstraintError, match="int32"):
        batch.fill(np.zeros((2, 9), dtype=np.int64))
    with pytest.raises(ConstraintError, match="words per row"):
        batch.fill(np.zeros((2, 3), dtype=np.int32))
    with pytest.raises(ConstraintError, match="fewer rows"):
        batch.fill(np.zeros((1, 9), dtype=np.int32))
    with pytest.raises(ConstraintError, match="outside the batch"):
        batch.remove(2)
    with pytest.raises(ConstraintError, match="holds no request"):
        batch.advance(0, [1])
    other = NativeEngine(Vocabulary.of([b"a", b""], [1]))
    with pytest.raises(ConstraintError, match="another vocabulary"):
        batch.add(0, other.compile(parse_constraint({"max_tokens": 1})))


def test_compiled_constraints_are_cached_per_spec(byte_engine):
    a = byte_engine.compile(parse_constraint({"choice": ["x", "y"]}))
    b = byte_engine.compile(parse_constraint('{"choice": ["x", "y"]}'))
    assert a is b


def test_many_rows_on_the_thread_pool_match_one_row_at_a_time(byte_engine):
    rng = np.random.default_rng(3)
    specs = [
        {"regex": r"[a-f]{2,9}"},
        {"choice": ["abc", "abd", "fed"]},
        {"banned_tokens": [97, 98]},
    ]
    rows = 96
    batch = byte_engine.new_batch(rows)
    outputs: list[list[int]] = []
    for row in range(rows):
        out = [int(t) for t in rng.choice([97, 98, 99, 100], size=int(rng.integers(0, 3)))]
        outputs.append(out)
        batch.add(row, byte_engine.compile(parse_constraint(specs[row % 3])), out)
    together = allocate_bitmask(rows, BYTE_VOCAB.size)
    dead_together = batch.fill(together)
    for row in range(rows):
        alone = byte_engine.new_batch(1)
        alone.add(0, byte_engine.compile(parse_constraint(specs[row % 3])))
        alone.advance(0, outputs[row])
        mask = allocate_bitmask(1, BYTE_VOCAB.size)
        assert (alone.fill(mask) == [0]) == (row in dead_together)
        np.testing.assert_array_equal(mask[0], together[row])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("density", [0.001, 0.3, 0.97])
@pytest.mark.parametrize("vocab", [1000, 5003])  # 5003: long rows take the streaming-store fill
def test_native_apply_equals_the_device_path(dtype, density, vocab):
    rng = np.random.default_rng(5)
    rows = 6
    words = (vocab + 31) // 32
    bits = rng.random((rows, vocab)) < density
    bits[2] = True
    bits[3] = False
    padded = np.zeros((rows, words * 32), dtype=bool)
    padded[:, :vocab] = bits
    bitmask = np.packbits(padded.reshape(rows, -1, 32)[:, :, ::-1], axis=-1, bitorder="big")
    bitmask = bitmask.reshape(rows, -1, 4)[:, :, ::-1].copy().view(np.int32).reshape(rows, words)
    base = torch.randn(rows, vocab + 7).to(dtype)[:, :vocab]  # rows are strided
    expected = base.clone()
    expected[torch.from_numpy(~bits)] = float("-inf")
    native = base.clone()
    apply_bitmask_(native, bitmask)
    torch.testing.assert_close(native, expected, rtol=0, atol=0)
    via_torch = base.clone()
    _apply_torch_(via_torch, torch.from_numpy(bitmask), None)
    torch.testing.assert_close(via_torch, expected, rtol=0, atol=0)
    subset = base.clone()
    apply_bitmask_(subset, bitmask, rows=[1, 4])
    assert torch.equal(subset[[0, 2, 3, 5]], base[[0, 2, 3, 5]])
    torch.testing.assert_close(subset[[1, 4]], expected[[1, 4]], rtol=0, atol=0)


def test_apply_refuses_rows_outside_the_logits():
    with pytest.raises(ConstraintError, match="outside the logits"):
        apply_bitmask_(torch.zeros(2, 64), np.zeros((4, 2), dtype=np.int32), rows=[3])
