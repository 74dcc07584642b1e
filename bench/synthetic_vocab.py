"""Deterministic synthetic byte-level vocabularies, catalogs and teacher-forced token streams.

No tokenizer can be downloaded where the benchmark runs, so it builds vocabularies shaped like a
real byte-level BPE vocabulary instead: the 256 single bytes, then space-prefixed and bare
pseudo-words, capitalised words, sub-word pieces, digit groups and punctuation runs, with two
EOS tokens that spell nothing at the end. Everything derives from fixed seeds, so a vocabulary
of a given size is the same on every machine and every run.

The same pseudo-word lexicon feeds the catalog titles, ranked by frequency as a real
vocabulary's merges are: frequent words are whole tokens (more of them as the vocabulary
grows) and rare ones split into pieces, so teacher-forced streams look like real tokenizations.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from serving.constraints.vocab import Vocabulary

N_EOS = 2
LEXICON_SEED = 20_241
VOCAB_SEED = 7_919

_ONSETS = [
    *("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"),
    *("br", "cr", "dr", "fr", "gr", "pr", "tr", "bl", "cl", "fl", "gl", "pl", "sl"),
    *("ch", "sh", "th", "st", "sp", "sk", "sm", "sn", "sw", "qu"),
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "y", "ai", "ea", "ou", "io", "ie"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "rt", "ck", "ng", "x"]
# Real words first: the regex workload's keywords, so they are whole tokens as in a real vocab.
_COMMON_WORDS = ["the", "of", "and", "to", "in", "street", "road", "avenue", "lane", "way"]
_PUNCTUATION = [
    *(".", ",", ":", ";", "!", "?", "-", "--", "(", ")", "[", "]", "{", "}", "'", '"', "/"),
    *("\\", "*", "&", "%", "$", "#", "@", "+", "=", "<", ">", "|", "~", "^", "_", "`", ".."),
    *("...", ".\n", "\n", "\n\n", "://", ").", "),", "('", "')", '":', '",', "},", '{"'),
    *("])", "['", "->", "=>", "==", "!=", "<=", ">=", "**", "//", "##", ";\n", ":\n"),
]


def _word(rng: random.Random) -> str:
    syllables = rng.choices((1, 2, 3, 4), weights=(3, 5, 3, 1))[0]
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    )


@lru_cache(maxsize=4)
def lexicon(n_words: int = 200_000) -> tuple[str, ...]:
    """Distinct pseudo-words, most frequent first (the order catalog titles draw them in)."""
    rng = random.Random(LEXICON_SEED)
    seen: dict[str, None] = dict.fromkeys(_COMMON_WORDS)
    while len(seen) < n_words:
        word = _word(rng)
        if len(word) >= 2:
            seen.setdefault(word, None)
    return tuple(seen)


def _token_candidates() -> Iterator[bytes]:
    """Byte strings in the order a vocabulary of any size takes them (a smaller vocabulary is
    a prefix of a larger one, as with BPE merges)."""
    yield from (p.encode() for p in _PUNCTUATION if p)
    yield from (b"  ", b"   ", b"    ", b"        ", b"\t", b"\t\t", b"\r\n")
    for n in range(1000):
        yield str(n).encode()
        yield b" " + str(n).encode()
    rng = random.Random(VOCAB_SEED)
    words = lexicon()
    for rank, word in enumerate(words):
        yield b" " + word.encode()
        if rank % 2 == 0:
            yield word.encode()
        if rank % 3 == 0:
            yield b" " + word.capitalize().encode()
        if rank % 5 == 0:
            yield word.capitalize().encode()
        if rank % 4 == 0 and len(word) >= 4:
            # A sub-word piece, as merges leave behind.
            start = rng.randrange(0, len(word) - 2)
            yield word[start : start + rng.randint(2, min(5, len(word) - start))].encode()
        if rank % 97 == 0:
            # A few non-ASCII words (accented), as multilingual vocabularies carry.
            yield (" " + word.replace("e", "é", 1)).encode()
    raise AssertionError("the lexicon is too small for the requested vocabulary")


@lru_cache(maxsize=4)
def synthetic_vocab(n_tokens: int) -> Vocabulary:
    """A vocabulary of exactly ``n_tokens`` tokens: IDs 0-255 are the single bytes, the last
    ``N_EOS`` IDs are EOS tokens spelling nothing, the rest are distinct multi-byte tokens."""
    if n_tokens < 256 + N_EOS + 16:
        raise ValueError("a synthetic vocabulary needs at least 274 tokens")
    tokens: list[bytes] = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    wanted = n_tokens - N_EOS
    for candidate in _token_candidates():
        if len(tokens) == wanted:
            break
        if candidate not in seen:
            seen.add(candidate)
            tokens.append(candidate)
    tokens.extend(b"" for _ in range(N_EOS))
    return Vocabulary.of(tokens, range(n_tokens - N_EOS, n_tokens))


class GreedyTokenizer:
    """Greedy longest-match tokenization over a vocabulary's byte strings (every byte is a
    token, so any text tokenizes)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.ids = {tok: i for i, tok in enumerate(vocab.tokens) if tok}
        self.max_len = max(len(tok) for tok in self.ids)

    def encode(self, data: bytes) -> list[int]:
        out = []
        i = 0
        while i < len(data):
            for length in range(min(self.max_len, len(data) - i), 0, -1):
                token = self.ids.get(data[i : i + length])
                if token is not None:
                    out.append(token)
                    i += length
                    break
        return out


def catalog(n_titles: int, seed: int = 1) -> list[str]:
    """``n_titles`` distinct product-like titles of 2-6 pseudo-words, drawn Zipf-like from the
    lexicon, sometimes with a model number or a separator."""
    rng = random.Random(seed)
    words = lexicon()
    # Zipf-like ranks without a per-draw log: index = floor(n ** u) - 1 for uniform u.
    n_words = len(words)
    titles: dict[str, None] = {}
    while len(titles) < n_titles:
        k = rng.randint(2, 6)
        parts = [words[int(n_words ** rng.random()) - 1] for _ in range(k)]
        parts[0] = parts[0].capitalize()
        r = rng.random()
        if r < 0.15:
            parts.append(str(rng.randint(1, 9999)))
        elif r < 0.25:
            parts.insert(rng.randint(1, k - 1), "-")
        elif r < 0.30:
            parts[-1] = parts[-1].upper()
        titles.setdefault(" ".join(parts), None)
    return list(titles)


# The regex workload: a postal-address-like record, with words, digit runs and alternations, so
# its DFA has a few dozen states and tokens of every kind are allowed somewhere along it.
ADDRESS_REGEX = (
    r"[A-Z][a-z]{1,12}( [A-Z][a-z]{1,12}){0,2}, [0-9]{1,5} [a-z]{2,16}( [a-z]{2,16})? "
    r"(street|road|avenue|lane|way), [A-Z]{2} [0-9]{5}(-[0-9]{4})?"
)
_STREET_KINDS = ("street", "road", "avenue", "lane", "way")


def address(rng: random.Random) -> str:
    """A random string that ``ADDRESS_REGEX`` fully matches, made of lexicon words where they
    fit (so tokenization uses multi-byte tokens)."""
    words = lexicon()

    def word(lo: int, hi: int) -> str:
        while True:
            w = words[int(len(words) ** rng.random()) - 1]
            if lo <= len(w) <= hi and w.isascii() and w.isalpha():
                return w

    def upper(n: int) -> str:
        return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(n))

    def digits(n: int) -> str:
        return "".join(rng.choice("0123456789") for _ in range(n))

    name = " ".join(word(2, 13).capitalize() for _ in range(rng.randint(1, 3)))
    street = " ".join(word(2, 16) for _ in range(rng.randint(1, 2)))
    zip_code = digits(5) + (f"-{digits(4)}" if rng.random() < 0.3 else "")
    return (
        f"{name}, {digits(rng.randint(1, 5))} {street} {rng.choice(_STREET_KINDS)}, "
        f"{upper(2)} {zip_code}"
    )


@dataclass(frozen=True)
class Streams:
    """Teacher-forced token streams: each ends with an EOS ID; a row that has fed all of its
    stream's tokens but the EOS is re-admitted with the next stream."""

    streams: tuple[tuple[int, ...], ...]

    def __len__(self) -> int:
        return len(self.streams)


def text_streams(vocab: Vocabulary, texts: Sequence[str]) -> Streams:
    tokenizer = GreedyTokenizer(vocab)
    eos = vocab.eos_token_ids[0]
    return Streams(tuple((*tokenizer.encode(t.encode()), eos) for t in texts))


def token_streams(vocab: Vocabulary, allowed: Sequence[int], count: int, seed: int = 3) -> Streams:
    """Random streams of 8-64 tokens drawn from ``allowed``, each closed by EOS."""
    rng = random.Random(seed)
    eos = vocab.eos_token_ids[0]
    return Streams(tuple((*rng.choices(allowed, k=rng.randint(8, 64)), eos) for _ in range(count)))
