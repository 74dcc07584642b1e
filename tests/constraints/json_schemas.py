"""Random JSON schemas, and answers sampled from a compiled grammar without a model.

Shared by tests/constraints/test_json_schema_property.py and bench/json_schema_property.py.
The sampler walks an ``xgrammar.GrammarMatcher`` with random choices among the tokens it allows,
leaning towards tokens that hold characters a JSON string must escape (control characters,
quotes, backslashes) and towards closing the answer, so the grammar's weak spots are hit often.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from hypothesis import strategies as st

from serving.constraints.json_schema import FORMATS

# Property names and enum/const strings that need escapes in JSON.
ODD_TEXT = ["a", "b c", 'q"uote', "back\\slash", "tab\there", "ctl\x01", "nl\n", "é€"]
SAFE_PATTERNS = [
    "^[a-z]+$",
    "^\\d{2,3}$",
    "^[\\w\\s]{1,5}$",
    "^.{0,4}$",
    "^[^a]*$",
    "^\\S+$",
    "^(ab|c)+$",
]

_scalars = st.one_of(
    st.sampled_from(ODD_TEXT),
    st.integers(-5, 5),
    st.sampled_from([None, True, False, 1.5]),
)


@st.composite
def _string(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    kind = draw(st.sampled_from(["plain", "length", "length", "pattern", "format"]))
    if kind == "length":
        low = draw(st.integers(0, 3))
        if draw(st.booleans()):
            schema["minLength"] = low
        schema["maxLength"] = draw(st.integers(max(low, 1), 8))
    elif kind == "pattern":
        schema["pattern"] = draw(st.sampled_from(SAFE_PATTERNS))
    elif kind == "format":
        schema["format"] = draw(st.sampled_from(sorted(FORMATS)))
    return schema


@st.composite
def _number(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["integer", "number"]))
    schema: dict[str, Any] = {"type": kind}
    low: float = draw(st.integers(-20, 10))
    if kind == "number" and draw(st.booleans()):
        low += 0.5
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["minimum", "exclusiveMinimum"]))] = low
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["maximum", "exclusiveMaximum"]))] = low + draw(
            st.integers(2, 30)
        )
    if kind == "integer" and len(schema) == 1 and draw(st.booleans()):
        schema["multipleOf"] = draw(st.integers(1, 4))
    return schema


_leaves = st.one_of(
    _string(),
    _number(),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": ["string", "null"]}]),
    st.lists(_scalars, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    _scalars.map(lambda v: {"const": v}),
    # Listed values next to keywords that rule some of them out (never all).
    st.builds(
        lambda v, n: {"type": "string", "enum": sorted({"a", *v}), "maxLength": n},
        st.lists(st.sampled_from(ODD_TEXT), min_size=1, max_size=4, unique=True),
        st.integers(4, 9),
    ),
    st.builds(
        lambda v, n: {"type": "integer", "enum": sorted({0, *v}), "maximum": n},
        st.lists(st.integers(-5, 5), min_size=1, max_size=4, unique=True),
        st.integers(0, 5),
    ),
)


def _containers(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        _object(children),
        _array(children),
        st.lists(children, min_size=2, max_size=3).map(lambda c: {"anyOf": c}),
        children.map(lambda c: {"type": "object", "additionalProperties": c}),
        st.just({"type": "object", "additionalProperties": True}),
    )


@st.composite
def _object(draw: st.DrawFn, children: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(ODD_TEXT), min_size=1, max_size=3, unique=True))
    properties = {name: draw(children) for name in names}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    schema["required"] = draw(st.lists(st.sampled_from(names), unique=True))
    if draw(st.booleans()):
        schema["additionalProperties"] = False
    if draw(st.integers(0, 4)) == 0:
        schema["type"] = ["object", "null"]
    return schema


@st.composite
def _array(draw: st.DrawFn, children: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    low = draw(st.integers(0, 2))
    schema: dict[str, Any] = {"type": "array", "items": draw(children), "minItems": low}
    if draw(st.booleans()):
        schema["maxItems"] = low + draw(st.integers(0, 3))
    return schema


_trees = st.recursive(_leaves, _containers, max_leaves=6)


@st.composite
def json_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A schema of the keywords the platform accepts, sometimes through ``$ref``/``$defs``."""
    tree = draw(_trees)
    if draw(st.booleans()):
        return tree
    return {
        "$defs": {"item": tree},
        "type": "object",
        "properties": {
            "one": {"$ref": "#/$defs/item"},
            "many": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2},
        },
        "required": ["one"],
    }


# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class Vocab:
    """A tokenizer as XGrammar sees it, with the tokens the sampler favours."""

    info: Any  # xgrammar.TokenizerInfo
    tokens: list[bytes]
    stop: int
    tricky: np.ndarray  # bool per token: holds a control character, a quote or a backslash
    closing: np.ndarray  # bool per token: holds a closing quote, bracket or brace


def _vocab(info: Any) -> Vocab:
    tokens = [bytes(t) for t in info.decoded_vocab]
    tricky = np.array([any(b < 0x20 or b in b'"\\' for b in t) for t in tokens])
    closing = np.array([any(b in b'"]}' for b in t) for t in tokens])
    return Vocab(info, tokens, int(info.stop_token_ids[0]), tricky, closing)


@cache
def byte_vocab() -> Vocab:
    """Every byte as its own token, plus one stop token: any byte string can be produced."""
    import xgrammar

    tokens = [bytes([i]) for i in range(256)] + [b""]
    info = xgrammar.TokenizerInfo(tokens, xgrammar.VocabType.RAW, stop_token_ids=[256])
    return _vocab(info)


@cache
def demo_vocab() -> Vocab:
    """The demo model's byte-level BPE tokenizer (serving/demo_model.py)."""
    import xgrammar

    from serving.demo_model import train_tokenizer

    tokenizer = train_tokenizer(512)
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    return _vocab(info)


def sample(compiled: Any, vocab: Vocab, rng: random.Random, max_tokens: int = 120) -> bytes | None:
    """One answer the grammar accepted through to its stop token, or ``None`` if it did not
    finish within ``max_tokens``."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, len(vocab.tokens))
    out = bytearray()
    for step in range(max_tokens):
        matcher.fill_next_token_bitmask(bitmask, 0)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")
        allowed = bits[: len(vocab.tokens)].astype(bool)
        if allowed[vocab.stop] and rng.random() < 0.5:
            matcher.accept_token(vocab.stop)
            return bytes(out)
        allowed[vocab.stop] = False
        token = _choose(allowed, vocab, rng, closing_bias=step / max_tokens)
        if token is None:
            return None
        if not matcher.accept_token(token):
            raise AssertionError(f"the matcher refused token {token} it had allowed")
        out += vocab.tokens[token]
    return None


def _choose(
    allowed: np.ndarray, vocab: Vocab, rng: random.Random, closing_bias: float
) -> int | None:
    r = rng.random()
    pools = []
    if r < 0.35:
        pools.append(allowed & vocab.tricky)
    elif r < 0.35 + 0.5 * closing_bias + 0.1:
        pools.append(allowed & vocab.closing)
    pools.append(allowed)
    for pool in pools:
        ids = np.flatnonzero(pool)
        if len(ids):
            return int(ids[rng.randrange(len(ids))])
    return None


def check_answer(answer: bytes, schema: dict[str, Any]) -> str | None:
    """Why ``answer`` is not a valid instance of ``schema`` (``None``: it is)."""
    import jsonschema

    try:
        value = json.loads(answer.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"not JSON: {exc}"
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(value)
    )
    return None if error is None else f"not valid: {error.message}"
