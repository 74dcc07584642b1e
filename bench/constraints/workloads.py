"""What is measured: each constraint in the native spec and in the peers' own terms (regex, EBNF,
token set), with teacher-forced streams, so that every engine sees the same work."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from bench.synthetic_vocab import (
    ADDRESS_REGEX,
    Streams,
    address,
    catalog,
    text_streams,
    token_streams,
)
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import Choice, ConstraintSpec, Regex, TokenSet

ALLOWED_SET_SIZE = 1000
N_STREAMS = 1000


def regex_escape(text: str) -> str:
    """Escape regex metacharacters only (Python's re.escape also escapes spaces, which
    XGrammar's regex parser warns about)."""
    return "".join("\\" + c if c in "\\.^$*+?{}[]|()-/" else c for c in text)


def ebnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass
class Workload:
    name: str
    spec: ConstraintSpec
    streams: Streams
    regex: str | None = None  # the equivalent regex (llguidance; XGrammar when ebnf is None)
    ebnf: str | None = None  # the equivalent EBNF grammar (XGrammar)
    n_choices: int = 0
    peer_skip: dict[str, str] = field(default_factory=dict)


def choice_workload(vocab: Vocabulary, n_titles: int, n_streams: int = N_STREAMS) -> Workload:
    titles = catalog(n_titles)
    rng = random.Random(n_titles)
    picked = [titles[rng.randrange(n_titles)] for _ in range(n_streams)]
    return Workload(
        name=f"choice-{short_count(n_titles)}",
        spec=Choice(tuple(titles)),
        streams=text_streams(vocab, picked),
        regex="(" + "|".join(regex_escape(t) for t in titles) + ")",
        ebnf="root ::= " + " | ".join(ebnf_literal(t) for t in titles),
        n_choices=n_titles,
    )


def regex_workload(vocab: Vocabulary, n_streams: int = N_STREAMS) -> Workload:
    rng = random.Random(5)
    texts = [address(rng) for _ in range(n_streams)]
    assert all(re.fullmatch(ADDRESS_REGEX, t, re.ASCII) for t in texts)
    return Workload(
        name="regex",
        spec=Regex(ADDRESS_REGEX),
        streams=text_streams(vocab, texts),
        regex=ADDRESS_REGEX,
    )


def allowed_set_workload(vocab: Vocabulary, n_streams: int = N_STREAMS) -> Workload:
    rng = random.Random(11)
    candidates = [i for i, tok in enumerate(vocab.tokens) if tok]
    allowed = sorted(rng.sample(candidates, min(ALLOWED_SET_SIZE, len(candidates))))
    reason = "no equivalent constraint (a set of token IDs) in this peer's grammar API"
    return Workload(
        name=f"allowed-set-{short_count(len(allowed))}",
        spec=TokenSet(frozenset(allowed), banned=False),
        streams=token_streams(vocab, allowed, n_streams),
        peer_skip={"xgrammar": reason, "llguidance": reason},
    )


def short_count(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)
