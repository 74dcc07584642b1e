"""Hypothesis strategies shared by the reference tests and the native-vs-reference tests.

Vocabularies deliberately mix single bytes, ASCII words, fragments of multi-byte UTF-8
characters, whole non-ASCII characters and empty special tokens, so that tokens split
characters at every possible point. Regexes come from a grammar of the supported dialect only.
"""

from __future__ import annotations

from hypothesis import strategies as st

from serving.constraints.reference import ReferenceEngine
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import All, Choice, ConstraintSpec, MaxTokens, Regex, TokenSet

NON_ASCII = "éü€中😀ß"
ASCII_ALPHABET = "abcxyz019 -_.\n"
ALPHABET = ASCII_ALPHABET + NON_ASCII


def _fragments() -> list[bytes]:
    """Every proper prefix and suffix of the UTF-8 encodings of the non-ASCII characters."""
    out: set[bytes] = set()
    for ch in NON_ASCII:
        data = ch.encode()
        for i in range(1, len(data)):
            out.add(data[:i])
            out.add(data[i:])
    return sorted(out)


FRAGMENTS = _fragments()


@st.composite
def vocabularies(draw: st.DrawFn, min_tokens: int = 20, max_tokens: int = 300) -> Vocabulary:
    """A random small vocabulary (see the module docstring); 1-2 EOS IDs, padded size."""
    single = st.sampled_from([bytes([c]) for c in ALPHABET.encode() if c < 0x80])
    words = st.text(ASCII_ALPHABET, min_size=2, max_size=4).map(str.encode)
    whole = st.text(ALPHABET, min_size=1, max_size=2).map(str.encode)
    token = st.one_of(
        single,
        words,
        st.sampled_from(FRAGMENTS),
        whole,
        st.just(b""),
        st.binary(min_size=1, max_size=1),
    )
    count = draw(st.integers(min_tokens, max_tokens))
    base = [bytes([c]) for c in ALPHABET.encode() if c < 0x80]
    tokens = base + draw(st.lists(token, min_size=count - len(base), max_size=count - len(base)))
    tokens = tokens[:count]
    eos = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=2, unique=True))
    for e in eos:
        tokens[e] = b""
    padding = draw(st.sampled_from([0, 0, 1, 7, 40]))
    return Vocabulary.of(tokens, eos, size=count + padding)


def byte_vocabulary() -> Vocabulary:
    """Every single byte as a token, plus one EOS: feeds any byte string exactly."""
    return Vocabulary.of([bytes([i]) for i in range(256)] + [b""], [256])


# --------------------------------------------------------------------------- regexes

_LITERALS = st.sampled_from(list("abcxyz019-_ ") + list(NON_ASCII) + [r"\.", r"\n", r"\t"])
_CLASS_ITEMS = st.sampled_from(
    ["a-c", "x", "0-9", r"\d", r"\w", r"\s", "é", "€-中", "_", r"\-", " "]
)
_ESCAPES = st.sampled_from([r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", "."])


def _klass() -> st.SearchStrategy[str]:
    return st.builds(
        lambda negate, items: "[" + ("^" if negate else "") + "".join(items) + "]",
        st.booleans(),
        st.lists(_CLASS_ITEMS, min_size=1, max_size=3),
    )


def _quantified(atom: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    counted = st.builds(
        lambda n, extra, open_ended: (
            f"{{{n},}}" if open_ended else f"{{{n}}}" if extra == 0 else f"{{{n},{n + extra}}}"
        ),
        st.integers(0, 3),
        st.integers(0, 2),
        st.booleans(),
    )
    quant = st.one_of(st.just(""), st.just(""), st.sampled_from(["*", "+", "?"]), counted)
    lazy = st.sampled_from(["", "", "?"])
    return st.builds(
        lambda a, q, z: a + q + (z if q else ""),
        atom,
        quant,
        lazy,
    )


def _regex_tree() -> st.SearchStrategy[str]:
    """Atoms only (a literal, class, escape or group), so quantifiers never stack."""
    leaf = st.one_of(_LITERALS, _LITERALS, _klass(), _ESCAPES)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        seq = st.lists(_quantified(inner), min_size=1, max_size=3).map("".join)
        alternation = st.lists(seq, min_size=1, max_size=3).map("|".join)
        group = st.builds(
            lambda kind, body: kind + body + ")",
            st.sampled_from(["(", "(?:", "(?P<g>"]),
            alternation,
        )
        return group

    return st.recursive(leaf, extend, max_leaves=4)


@st.composite
def regex_patterns(draw: st.DrawFn) -> str:
    """A pattern of the supported subset (duplicate group names are avoided)."""
    body = draw(st.lists(_quantified(_regex_tree()), min_size=1, max_size=3).map("".join))
    if draw(st.booleans()):
        body = body + "|" + draw(_quantified(_regex_tree()))
    count = 0

    def rename(_: object) -> str:
        nonlocal count
        count += 1
        return f"(?P<g{count}>"

    while "(?P<g>" in body:
        body = body.replace("(?P<g>", rename(None), 1)
    anchored = draw(st.integers(0, 4)) == 0
    if anchored and "|" in body:
        body = "(?:" + body + ")"  # anchors only ever at the very start and end, outside |
    prefix = "^" if anchored and draw(st.booleans()) else ""
    suffix = "$" if anchored and draw(st.booleans()) else ""
    return prefix + body + suffix


def choice_lists() -> st.SearchStrategy[list[str]]:
    """Choice lists with shared prefixes, empty strings and non-ASCII text."""
    return st.lists(st.text(ALPHABET, max_size=5), min_size=1, max_size=6)


# --------------------------------------------------------------------------- specs


def token_sets(vocab: Vocabulary) -> st.SearchStrategy[TokenSet]:
    eos = set(vocab.eos_token_ids)
    ids = [t for t in range(len(vocab.tokens)) if t not in eos]
    return st.builds(
        lambda chosen, banned: TokenSet(frozenset(chosen), banned),
        st.lists(st.sampled_from(ids), min_size=1, max_size=min(len(ids), 40)),
        st.booleans(),
    )


def simple_specs(vocab: Vocabulary) -> st.SearchStrategy[ConstraintSpec]:
    return st.one_of(
        choice_lists().map(lambda c: Choice(tuple(c))),
        regex_patterns().map(Regex),
        token_sets(vocab),
        st.integers(0, 6).map(MaxTokens),
    )


def specs(vocab: Vocabulary) -> st.SearchStrategy[ConstraintSpec]:
    """Any kind of spec, including ``All`` of 2-3 parts; token IDs valid for ``vocab``."""
    simple = simple_specs(vocab)
    combined = st.lists(simple, min_size=2, max_size=3).map(lambda p: All(tuple(p)))
    return st.one_of(simple, simple, combined)


# --------------------------------------------------------------------------- token streams


def token_streams(
    vocab: Vocabulary, max_size: int = 12, placeholders: bool = False
) -> st.SearchStrategy[list[int]]:
    """Random token streams, valid IDs only (optionally with -1 placeholders)."""
    low = -1 if placeholders else 0
    return st.lists(st.integers(low, len(vocab.tokens) - 1), max_size=max_size)


@st.composite
def live_token_streams(
    draw: st.DrawFn, vocab: Vocabulary, spec: ConstraintSpec, max_size: int = 12
) -> list[int]:
    """A stream sampled under the reference mask, so the request never dies; it ends
    early at a dead end and never contains EOS. The spec must compile."""
    compiled = ReferenceEngine(vocab).compile(spec)
    eos = set(vocab.eos_token_ids)
    state = compiled.initial_state()
    out: list[int] = []
    for _ in range(draw(st.integers(0, max_size))):
        choices = sorted(compiled.allowed(state) - eos)
        if not choices:
            break
        token = draw(st.sampled_from(choices))
        state = compiled.advance(state, token)
        out.append(token)
    return out
