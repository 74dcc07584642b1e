"""The native engine against the pure-Python reference, bit for bit, on random constraints,
random vocabularies and random token streams (hypothesis).

The reference parses regexes with Python's own sre parser and matches UTF-8 fragments by code
point ranges, while the native engine has its own parser and compiles ranges to byte
sequences, so agreement here checks two independent constructions against each other.
"""

from __future__ import annotations

import os
import re

import numpy as np
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from serving.constraints import ConstraintError
from serving.constraints.engine import allocate_bitmask
from serving.constraints.native import NativeEngine
from serving.constraints.reference import ReferenceEngine
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import All, Choice, ConstraintSpec, Regex
from tests.constraints.helpers import allowed_ids
from tests.constraints.strategies import specs, vocabularies

SETTINGS = settings(
    max_examples=int(os.environ.get("CONSTRAINT_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def compile_both(vocab: Vocabulary, spec: ConstraintSpec):
    """Both engines compile it, or both refuse it. The native engine also caps a regex's DFA
    size, which the lazily built reference has no need for: such cases are skipped."""
    native: Exception | None = None
    try:
        NativeEngine(vocab).compile(spec)
    except ConstraintError as exc:
        if "DFA exceeds" in str(exc):
            reject()
        native = exc
    try:
        reference = ReferenceEngine(vocab).compile(spec)
    except ConstraintError:
        assert native is not None, f"only the reference refused {spec}"
        return None
    assert native is None, f"only the native engine refused {spec}: {native}"
    return reference, None


@SETTINGS
@given(data=st.data())
def test_masks_are_equal_bit_for_bit_along_any_token_stream(data):
    vocab = data.draw(vocabularies(), label="vocab")
    spec = data.draw(specs(vocab), label="spec")
    both = compile_both(vocab, spec)
    if both is None:
        return
    reference_batch = ReferenceEngine(vocab).new_batch(1)
    native_engine = NativeEngine(vocab)
    native_batch = native_engine.new_batch(1)
    reference_batch.add(0, both[0])
    native_batch.add(0, native_engine.compile(spec))
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        expected = allocate_bitmask(1, vocab.size)
        actual = allocate_bitmask(1, vocab.size)
        assert native_batch.fill(actual) == reference_batch.fill(expected)
        np.testing.assert_array_equal(actual, expected)
        allowed = allowed_ids(expected, 0, vocab.size)
        off_mask = (
            data.draw(st.booleans(), label="off-mask token")
            and data.draw(st.integers(0, 9), label="rarely") == 0
        )
        if off_mask or not allowed:
            token = data.draw(st.integers(-1, vocab.size), label="any token")
        else:
            token = data.draw(st.sampled_from(allowed), label="allowed token")
        reference_batch.advance(0, [token])
        native_batch.advance(0, [token])


@SETTINGS
@given(data=st.data())
def test_sequences_sampled_under_the_mask_are_accepted(data):
    vocab = data.draw(vocabularies(), label="vocab")
    spec = data.draw(specs(vocab), label="spec")
    engine = NativeEngine(vocab)
    if compile_both(vocab, spec) is None:
        return
    compiled = engine.compile(spec)
    batch = engine.new_batch(1)
    out: list[int] = []
    batch.add(0, compiled, out)
    mask = allocate_bitmask(1, vocab.size)
    eos = set(vocab.eos_token_ids)
    for _ in range(30):
        if batch.fill(mask):
            return  # a dead end (reported); nothing was sampled into it
        token = data.draw(st.sampled_from(allowed_ids(mask, 0, vocab.size)), label="token")
        if token in eos:
            break
        out.append(token)
    else:
        return
    reference = ReferenceEngine(vocab).compile(spec)
    state = reference.initial_state()
    for token in out:
        state = reference.advance(state, token)
    assert reference.is_accepting(state)
    text = b"".join(vocab.tokens[t] for t in out)
    for part in spec.parts if isinstance(spec, All) else (spec,):
        if isinstance(part, Choice):
            assert text in {s.encode() for s in part.strings}
        if isinstance(part, Regex):
            assert re.fullmatch(part.pattern, text.decode(), re.ASCII)


@SETTINGS
@given(data=st.data())
def test_batches_agree_through_adds_removes_moves_and_rewritten_histories(data):
    vocab = data.draw(vocabularies(), label="vocab")
    reference_engine = ReferenceEngine(vocab)
    native_engine = NativeEngine(vocab)
    rows = 4
    reference_batch = reference_engine.new_batch(rows)
    native_batch = native_engine.new_batch(rows)
    # Each side gets its own copies of the live lists, mutated identically.
    lists: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
    for _ in range(data.draw(st.integers(1, 25), label="operations")):
        op = data.draw(
            st.sampled_from(["add", "remove", "swap", "move", "grow", "rewrite", "fill"]),
            label="op",
        )
        row = data.draw(st.integers(0, rows - 1), label="row")
        other = data.draw(st.integers(0, rows - 1), label="other row")
        if op == "add":
            spec = data.draw(specs(vocab), label="spec")
            both = compile_both(vocab, spec)
            if both is None:
                continue
            prompt = data.draw(st.lists(st.integers(0, len(vocab.tokens) - 1), max_size=3))
            output = data.draw(st.lists(st.integers(0, len(vocab.tokens) - 1), max_size=2))
            copies = (list(output), list(prompt), list(output), list(prompt))
            lists[row] = copies
            reference_batch.add(row, reference_engine.compile(spec), copies[0], copies[1])
            native_batch.add(row, native_engine.compile(spec), copies[2], copies[3])
        elif op == "remove":
            lists.pop(row, None)
            reference_batch.remove(row)
            native_batch.remove(row)
        elif op == "swap":
            a, b = lists.pop(row, None), lists.pop(other, None)
            if a is not None:
                lists[other] = a
            if b is not None:
                lists[row] = b
            reference_batch.swap(row, other)
            native_batch.swap(row, other)
        elif op == "move":
            moved = lists.pop(row, None)
            if row != other:
                lists.pop(other, None)
            if moved is not None:
                lists[other] = moved
            reference_batch.move(row, other)
            native_batch.move(row, other)
        elif op == "grow" and row in lists:
            tokens = data.draw(st.lists(st.integers(-1, len(vocab.tokens) - 1), max_size=3))
            lists[row][0].extend(tokens)
            lists[row][2].extend(tokens)
        elif op == "rewrite" and row in lists:
            # Preemption: the output list is cut back, some of it may move into the prompt.
            out_ref, prompt_ref, out_nat, prompt_nat = lists[row]
            keep = data.draw(st.integers(0, len(out_ref)), label="keep")
            moved = data.draw(st.booleans(), label="into prompt")
            for out, prompt in ((out_ref, prompt_ref), (out_nat, prompt_nat)):
                if moved:
                    prompt.extend(out[:keep])
                    del out[:keep]
                else:
                    del out[keep:]
        elif op == "fill":
            expected = allocate_bitmask(rows, vocab.size)
            actual = allocate_bitmask(rows, vocab.size)
            assert native_batch.fill(actual) == reference_batch.fill(expected)
            np.testing.assert_array_equal(actual, expected)
            assert native_batch.occupied_rows() == reference_batch.occupied_rows()
    expected = allocate_bitmask(rows, vocab.size)
    actual = allocate_bitmask(rows, vocab.size)
    assert native_batch.fill(actual) == reference_batch.fill(expected)
    np.testing.assert_array_equal(actual, expected)
