"""The pure-Python reference engine against Python's ``re`` and the rules of
docs/constraints.md (masks, EOS, dead rows, batches and live token lists)."""

from __future__ import annotations

import re
from itertools import product

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.constraints.engine import allocate_bitmask
from serving.constraints.reference import DEAD, ReferenceEngine, pack_allowed
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import (
    All,
    Choice,
    ConstraintError,
    MaxTokens,
    Regex,
    TokenSet,
    parse_constraint,
)
from tests.constraints.strategies import (
    ALPHABET,
    byte_vocabulary,
    choice_lists,
    live_token_streams,
    regex_patterns,
    specs,
    token_streams,
    vocabularies,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BYTES = byte_vocabulary()
EOS = 256


def feed(compiled, data: bytes):
    state = compiled.initial_state()
    for b in data:
        state = compiled.advance(state, b)
    return state


def allowed_ids(mask: np.ndarray, row: int, size: int) -> set[int]:
    words = mask[row].view(np.uint32)
    return {t for t in range(size) if (int(words[t >> 5]) >> (t & 31)) & 1}


def text_vocab() -> Vocabulary:
    tokens = [b"", b"a", b"b", b"ab", b"c", b"\xc3", b"\xa9", "é".encode(), b"", b"x"]
    return Vocabulary.of(tokens, [0], size=40)


# --------------------------------------------------------------------------- regex vs re


@SETTINGS
@given(pattern=regex_patterns(), text=st.text(ALPHABET, max_size=8))
def test_regex_acceptance_equals_fullmatch(pattern, text):
    compiled = ReferenceEngine(BYTES).compile(Regex(pattern))
    state = feed(compiled, text.encode())
    expected = re.fullmatch(pattern, text, re.ASCII) is not None
    assert compiled.is_accepting(state) == expected
    assert (EOS in compiled.allowed(state)) == expected


@SETTINGS
@given(data=st.data())
def test_regex_matching_strings_stay_live_on_every_prefix(data):
    pattern = data.draw(regex_patterns())
    text = data.draw(st.text(ALPHABET, max_size=8))
    if not re.fullmatch(pattern, text, re.ASCII):
        text = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True))
        if len(text) > 12 or any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            return
    compiled = ReferenceEngine(BYTES).compile(Regex(pattern))
    state = compiled.initial_state()
    for b in text.encode():
        assert b in compiled.allowed(state)
        state = compiled.advance(state, b)
        assert not compiled.is_dead(state)
    assert compiled.is_accepting(state)


SHORT = ["a", "x", "0", " ", "\n", "é", "€", "😀", "-"]


@settings(max_examples=60, deadline=None)
@given(pattern=regex_patterns(), prefix=st.text("ax0 é", max_size=2))
def test_regex_liveness_against_brute_force(pattern, prefix):
    """A state is live iff some short extension (over a small alphabet) fully matches, as far
    as brute force can see: liveness must cover every match found."""
    compiled = ReferenceEngine(BYTES).compile(Regex(pattern))
    state = feed(compiled, prefix.encode())
    extensions = ["".join(p) for n in range(3) for p in product(SHORT, repeat=n)]
    if any(re.fullmatch(pattern, prefix + ext, re.ASCII) for ext in extensions):
        assert not compiled.is_dead(state)
    if compiled.is_dead(state):
        assert not any(re.fullmatch(pattern, prefix + ext, re.ASCII) for ext in extensions)


def test_partial_utf8_is_live_only_when_a_matching_character_starts_with_it():
    engine = ReferenceEngine(BYTES)
    e_acute = engine.compile(Regex("é"))
    assert not e_acute.is_dead(feed(e_acute, b"\xc3"))
    assert e_acute.is_dead(feed(e_acute, b"\xc4"))
    assert e_acute.is_dead(feed(e_acute, b"\xe2"))
    assert e_acute.is_accepting(feed(e_acute, "é".encode()))
    anything = engine.compile(Regex("."))
    assert not anything.is_dead(feed(anything, b"\xf0\x9f"))
    for invalid in (b"\x80", b"\xc0", b"\xc1", b"\xf5", b"\xff", b"\xe0\x80", b"\xed\xa0"):
        assert anything.is_dead(feed(anything, invalid)), invalid
    # Surrogates never match, even through a negated class.
    negated = engine.compile(Regex("[^a]"))
    assert negated.is_dead(feed(negated, b"\xed\xa0\x80"))
    assert negated.is_accepting(feed(negated, "\ud7ff".encode()))


def test_dot_excludes_newline_and_classes_are_ascii():
    engine = ReferenceEngine(BYTES)
    assert engine.compile(Regex(".")).is_dead(feed(engine.compile(Regex(".")), b"\n"))
    digit = engine.compile(Regex(r"\d"))
    assert digit.is_dead(feed(digit, "٣".encode()))
    word = engine.compile(Regex(r"\w"))
    assert word.is_dead(feed(word, "é".encode()))
    not_word = engine.compile(Regex(r"\W"))
    assert not_word.is_accepting(feed(not_word, "é".encode()))


def test_anchors_at_the_ends_are_accepted():
    engine = ReferenceEngine(BYTES)
    compiled = engine.compile(Regex("^ab$"))
    assert compiled.is_accepting(feed(compiled, b"ab"))


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (r"(a)\1", "backreference"),
        (r"a(?=b)", "lookahead"),
        (r"(?<!a)b", "lookahead"),
        (r"(?i)a", "inline flags"),
        (r"(?i:a)b", "inline flags"),
        (r"\bab", "anchor"),
        (r"a^b", "anchor"),
        (r"a$b", "anchor"),
        (r"a{1001}", "1000"),
        (r"a{2,1001}", "1000"),
        (r"(", "invalid regex"),
        (r"a**", "invalid regex"),
        (r"(?>a)", "not supported"),
        (r"a*+", "not supported"),
        (r"\Aa", "anchor"),
    ],
)
def test_unsupported_regexes_are_refused_with_a_clear_message(pattern, message):
    with pytest.raises(ConstraintError, match=message):
        ReferenceEngine(BYTES).compile(Regex(pattern))


def test_counted_repeat_of_1000_is_accepted():
    compiled = ReferenceEngine(BYTES).compile(Regex("a{2,1000}"))
    assert compiled.is_accepting(feed(compiled, b"a" * 1000))
    assert compiled.is_dead(feed(compiled, b"a" * 1001))


# --------------------------------------------------------------------------- choice


@SETTINGS
@given(choices=choice_lists(), text=st.text(ALPHABET, max_size=6))
def test_choice_semantics(choices, text):
    compiled = ReferenceEngine(BYTES).compile(Choice(tuple(choices)))
    data = text.encode()
    encoded = [c.encode() for c in choices]
    state = feed(compiled, data)
    assert compiled.is_accepting(state) == (data in encoded)
    assert compiled.is_dead(state) == (not any(c.startswith(data) for c in encoded))


def test_choice_masks_allow_fragments_and_refuse_specials():
    vocab = text_vocab()
    compiled = ReferenceEngine(vocab).compile(Choice(("ab", "é", "")))
    start = compiled.initial_state()
    assert compiled.allowed(start) == {0, 1, 3, 5, 7}
    state = compiled.advance(start, 5)
    assert compiled.allowed(state) == {6}
    state = compiled.advance(state, 6)
    assert compiled.allowed(state) == {0}
    assert compiled.advance(state, 0) == state  # EOS on an accepting state keeps it
    assert compiled.advance(start, 8) is DEAD  # a non-EOS special never fits
    assert compiled.advance(start, 99) is DEAD
    assert compiled.advance(compiled.advance(start, 4), 1) is DEAD  # sticky


# --------------------------------------------------------------------------- token sets etc.


def test_allowed_and_banned_tokens():
    vocab = text_vocab()
    engine = ReferenceEngine(vocab)
    allowed = engine.compile(TokenSet(frozenset({1, 2}), banned=False))
    assert allowed.allowed(allowed.initial_state()) == {0, 1, 2}
    assert allowed.advance(allowed.initial_state(), 3) is DEAD
    banned = engine.compile(TokenSet(frozenset({1, 2}), banned=True))
    assert banned.allowed(banned.initial_state()) == set(range(10)) - {1, 2}
    state = banned.advance(banned.initial_state(), 0)
    assert banned.is_accepting(state) and not banned.is_dead(state)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (TokenSet(frozenset({10}), banned=False), "outside the vocabulary"),
        (TokenSet(frozenset({0}), banned=True), "EOS"),
        (All((MaxTokens(2), TokenSet(frozenset({0, 1}), banned=False))), "EOS"),
    ],
)
def test_bad_token_sets_are_refused(spec, message):
    with pytest.raises(ConstraintError, match=message):
        ReferenceEngine(text_vocab()).compile(spec)


def test_max_tokens_counts_every_token_including_eos():
    compiled = ReferenceEngine(text_vocab()).compile(MaxTokens(2))
    state = compiled.initial_state()
    assert compiled.allowed(state) == set(range(10))
    state = compiled.advance(state, 0)
    state = compiled.advance(state, 1)
    assert compiled.allowed(state) == {0}
    assert compiled.is_accepting(state)
    assert compiled.advance(state, 1) is DEAD
    zero = ReferenceEngine(text_vocab()).compile(MaxTokens(0))
    assert zero.allowed(zero.initial_state()) == {0}


def test_all_intersects_parts_and_eos_needs_every_part():
    engine = ReferenceEngine(text_vocab())
    compiled = engine.compile(
        All((Choice(("ab", "a")), MaxTokens(1), TokenSet(frozenset({3}), banned=True)))
    )
    start = compiled.initial_state()
    assert compiled.allowed(start) == {1}
    state = compiled.advance(start, 1)
    assert compiled.allowed(state) == {0}
    assert compiled.advance(start, 3) is DEAD


@SETTINGS
@given(data=st.data())
def test_all_agrees_with_its_parts_along_streams(data):
    vocab = data.draw(vocabularies(max_tokens=60))
    parts = [data.draw(specs(vocab).filter(lambda s: not isinstance(s, All))) for _ in range(2)]
    engine = ReferenceEngine(vocab)
    try:
        compiled = [engine.compile(p) for p in parts]
    except ConstraintError:
        return
    combined = engine.compile(All(tuple(parts)))
    states = [c.initial_state() for c in compiled]
    state = combined.initial_state()
    for token in data.draw(token_streams(vocab)):
        expected = compiled[0].allowed(states[0]) & compiled[1].allowed(states[1])
        assert combined.allowed(state) == expected
        states = [c.advance(s, token) for c, s in zip(compiled, states, strict=True)]
        state = combined.advance(state, token)
        assert combined.is_dead(state) == any(
            c.is_dead(s) for c, s in zip(compiled, states, strict=True)
        )


@SETTINGS
@given(data=st.data())
def test_live_streams_stay_live(data):
    vocab = data.draw(vocabularies(max_tokens=80))
    spec = data.draw(specs(vocab))
    try:
        compiled = ReferenceEngine(vocab).compile(spec)
    except ConstraintError:
        return
    state = compiled.initial_state()
    for token in data.draw(live_token_streams(vocab, spec)):
        state = compiled.advance(state, token)
        assert not compiled.is_dead(state)


def test_parse_errors_are_constraint_errors():
    for bad in ('{"choice": []}', '{"regex": ""}', '{"nope": 1}', "{", '{"max_tokens": -1}'):
        with pytest.raises(ConstraintError):
            parse_constraint(bad)


def test_compile_is_cached_by_spec_key():
    engine = ReferenceEngine(text_vocab())
    assert engine.compile(Choice(("a", "b"))) is engine.compile(Choice(("a", "b")))


# --------------------------------------------------------------------------- batches


def test_pack_allowed_layout():
    words = pack_allowed([0, 31, 32, 70], 71)
    assert words.dtype == np.int32 and words.shape == (3,)
    assert allowed_ids(words[None, :], 0, 71) == {0, 31, 32, 70}
    assert words[0] == np.uint32(0x80000001).view(np.int32)


def test_fill_touches_only_occupied_rows_and_reports_dead_rows():
    vocab = text_vocab()
    engine = ReferenceEngine(vocab)
    batch = engine.new_batch(4)
    batch.add(1, engine.compile(Choice(("ab",))))
    batch.add(2, engine.compile(Choice(("ab",))))
    batch.advance(2, [4])
    mask = allocate_bitmask(4, vocab.size)
    assert batch.fill(mask) == [2]
    assert (mask[0] == -1).all() and (mask[3] == -1).all()
    assert allowed_ids(mask, 1, vocab.size) == {1, 3}
    assert allowed_ids(mask, 2, vocab.size) == {0}
    assert batch.occupied_rows() == [1, 2]


def test_dead_row_without_eos_allows_every_real_token():
    vocab = Vocabulary.of([b"a", b"b"], [], size=40)
    engine = ReferenceEngine(vocab)
    batch = engine.new_batch(1)
    batch.add(0, engine.compile(Regex("c")))
    mask = allocate_bitmask(1, vocab.size)
    assert batch.fill(mask) == [0]
    assert allowed_ids(mask, 0, vocab.size) == {0, 1}


def test_swap_move_remove():
    vocab = text_vocab()
    engine = ReferenceEngine(vocab)
    batch = engine.new_batch(3)
    a, b = engine.compile(Choice(("a",))), engine.compile(Choice(("b",)))
    batch.add(0, a)
    batch.add(1, b)
    batch.swap(0, 1)
    mask = allocate_bitmask(3, vocab.size)
    batch.fill(mask)
    assert allowed_ids(mask, 0, vocab.size) == {2}
    batch.move(0, 2)
    assert batch.occupied_rows() == [1, 2]
    batch.move(2, 2)
    assert batch.occupied_rows() == [1, 2]
    batch.remove(1)
    assert batch.occupied_rows() == [2]
    batch.swap(0, 2)
    assert batch.occupied_rows() == [0]


def _row_allowed(batch, vocab, row=0):
    mask = allocate_bitmask(batch.max_rows, vocab.size)
    dead = batch.fill(mask)
    return allowed_ids(mask, row, vocab.size), dead


def test_live_lists_placeholders_and_partial_prefill():
    vocab = text_vocab()
    engine = ReferenceEngine(vocab)
    compiled = engine.compile(Choice(("abx",)))
    batch = engine.new_batch(1)
    out: list[int] = []
    batch.add(0, compiled, out, [9, 9])
    for _ in range(3):  # a prefill spread over several steps: still the initial state
        assert _row_allowed(batch, vocab)[0] == {1, 3}
    out.extend([1, -1])
    assert _row_allowed(batch, vocab)[0] == {2}
    out[1] = 2
    assert _row_allowed(batch, vocab)[0] == {9}
    out.append(9)
    assert _row_allowed(batch, vocab)[0] == {0}


def test_preemption_resets_and_rederives():
    vocab = text_vocab()
    engine = ReferenceEngine(vocab)
    compiled = engine.compile(Choice(("abx", "bx")))
    batch = engine.new_batch(1)
    out: list[int] = [1, 2]
    prompt: list[int] = [4]
    batch.add(0, compiled, out, prompt)
    assert _row_allowed(batch, vocab)[0] == {9}
    del out[1:]  # shrunk: re-derived from [1]
    assert _row_allowed(batch, vocab)[0] == {2}
    out[0] = 2  # rewritten with the same length: re-derived from [2]
    assert _row_allowed(batch, vocab)[0] == {9}
    # Preempted with the earlier output moved into the prompt.
    prompt.extend([1, 2])
    out.clear()
    assert _row_allowed(batch, vocab)[0] == {9}
    out.append(9)
    assert _row_allowed(batch, vocab)[0] == {0}


def test_preemption_with_a_different_prompt_uses_the_output():
    vocab = text_vocab()
    engine = ReferenceEngine(vocab)
    batch = engine.new_batch(1)
    out: list[int] = [1]
    prompt: list[int] = [4]
    batch.add(0, engine.compile(Choice(("ab", "b"))), out, prompt)
    assert _row_allowed(batch, vocab)[0] == {2}
    prompt[0] = 9
    out[0] = 2
    assert _row_allowed(batch, vocab)[0] == {0}


@SETTINGS
@given(data=st.data())
def test_batch_with_live_list_matches_direct_advancing(data):
    vocab = data.draw(vocabularies(max_tokens=60))
    spec = data.draw(specs(vocab))
    engine = ReferenceEngine(vocab)
    try:
        compiled = engine.compile(spec)
    except ConstraintError:
        return
    stream = data.draw(token_streams(vocab))
    batch = engine.new_batch(2)
    out: list[int] = []
    batch.add(1, compiled, out)
    state = compiled.initial_state()
    for token in stream:
        out.append(token)
        state = compiled.advance(state, token)
        mask = allocate_bitmask(2, vocab.size)
        dead = batch.fill(mask)
        allowed = compiled.allowed(state)
        assert (dead == [1]) == (compiled.is_dead(state) or not allowed)
        if not dead:
            np.testing.assert_array_equal(mask[1], pack_allowed(allowed, vocab.size))
        assert (mask[0] == -1).all()
        assert allowed_ids(mask, 1, vocab.size) <= set(range(len(vocab.tokens)))
