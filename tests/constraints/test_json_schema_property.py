"""Every answer a JSON-schema grammar lets finish is JSON and valid against the schema.

Answers are sampled without a model (tests/constraints/json_schemas.py) from the grammar both
engines use (serving.constraints.json_schema), with the demo model's tokenizer and a byte-level
vocabulary. The slow variant (JSON_SCHEMA_PROPERTY_EXAMPLES=300, or
``python bench/json_schema_property.py``) samples thousands of answers.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

import jsonschema
import pytest
import xgrammar
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.constraints.json_schema import json_object_grammar, json_schema_grammar
from serving.sampling.types import InvalidRequestError
from tests.constraints.json_schemas import (
    Vocab,
    byte_vocab,
    check_answer,
    demo_vocab,
    json_schemas,
    sample,
)

EXAMPLES = int(os.environ.get("JSON_SCHEMA_PROPERTY_EXAMPLES", "25"))
ANSWERS_PER_SCHEMA = 8

VOCABS = {"bytes": byte_vocab, "demo": demo_vocab}


def _compiler(vocab: Vocab) -> Any:
    return xgrammar.GrammarCompiler(vocab.info, cache_enabled=False)


@pytest.mark.parametrize("vocab_name", sorted(VOCABS))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schema=json_schemas(), seed=st.integers(0, 2**32 - 1))
def test_finished_answers_are_valid_json(
    vocab_name: str, schema: dict[str, Any], seed: int
) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    vocab = VOCABS[vocab_name]()
    compiled = _compiler(vocab).compile_grammar(json_schema_grammar(schema))
    rng = random.Random(seed)
    for _ in range(ANSWERS_PER_SCHEMA):
        answer = sample(compiled, vocab, rng)
        if answer is not None:
            assert check_answer(answer, schema) is None, (answer, check_answer(answer, schema))


@pytest.mark.parametrize("vocab_name", sorted(VOCABS))
def test_json_object_answers_are_objects(vocab_name: str) -> None:
    vocab = VOCABS[vocab_name]()
    compiled = _compiler(vocab).compile_grammar(json_object_grammar())
    rng = random.Random(1)
    finished = 0
    for _ in range(40):
        answer = sample(compiled, vocab, rng, max_tokens=60)
        if answer is not None:
            finished += 1
            assert check_answer(answer, {"type": "object"}) is None, answer
    assert finished > 0


def test_the_uncorrected_grammar_fails_where_the_corrected_one_holds() -> None:
    """The reason for the module: XGrammar's own grammar for a ``maxLength`` string lets raw
    control characters finish (docs/xgrammar-control-characters.md)."""
    vocab = byte_vocab()
    schema = {"type": "string", "maxLength": 6}
    plain = _compiler(vocab).compile_json_schema(
        '{"type": "string", "maxLength": 6}', any_whitespace=False
    )
    fixed = _compiler(vocab).compile_grammar(json_schema_grammar(schema))
    failures = {"plain": 0, "fixed": 0}
    for name, compiled in (("plain", plain), ("fixed", fixed)):
        rng = random.Random(3)
        for _ in range(50):
            answer = sample(compiled, vocab, rng)
            if answer is not None and check_answer(answer, schema) is not None:
                failures[name] += 1
    assert failures["plain"] > 0
    assert failures["fixed"] == 0


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "integer", "multipleOf": 2, "minimum": 1}, "multipleOf"),
        ({"type": "string", "not": {"const": "a"}}, "not"),
        ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, "allOf"),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
        ({"if": {"type": "string"}, "then": {"maxLength": 1}}, "if"),
        ({"type": "object", "minProperties": 1}, "minProperties"),
        ({"type": "string", "format": "date-ish"}, "format"),
        ({"type": "string", "pattern": "^a\\nb$"}, "U+000A"),
        ({"type": "string", "pattern": '^["]$'}, "U+0022"),
        ({"type": "string", "pattern": "^[\\x00-\\x7f]$"}, "U+0000"),
        ({"type": "string", "pattern": "^[\\s\\S]$"}, "\\S"),
        ({"type": "string", "pattern": "^(?=a)a$"}, "lookarounds"),
        ({"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}, "contains"),
        ({"type": "array", "items": [{"uniqueItems": True}]}, "items"),
        ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength together with pattern"),
        ({"type": "string", "format": "email", "minLength": 3}, "minLength together with format"),
        ({"type": "object", "properties": {}, "required": ["b"]}, "required names 'b'"),
        ({"$ref": "#/$defs/d", "$defs": {"d": {}}, "maxLength": 2}, "maxLength next to $ref"),
        ({"anyOf": [{"type": "string"}], "type": "string"}, "type next to anyOf"),
        ({"const": "abcd", "maxLength": 3}, "no value satisfies"),
        (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
            "additionalProperties next to properties",
        ),
        ({"$defs": {"d": {"not": {}}}, "$ref": "#/$defs/d"}, "not"),
        ({"anyOf": [{"type": "string", "dependentRequired": {}}]}, "dependentRequired"),
    ],
)
def test_unenforceable_schemas_are_refused_by_name(schema: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(named)):
        json_schema_grammar(schema)


def test_patterns_keep_their_meaning_without_surrogates() -> None:
    from serving.constraints.json_schema import exclude_surrogates

    assert exclude_surrogates("^.{0,4}$") == "^[^\\n\\r\\uD800-\\uDFFF]{0,4}$"
    assert exclude_surrogates("^[^]a]\\S$") == "^[^]a\\uD800-\\uDFFF][^\\s\\uD800-\\uDFFF]$"
    assert exclude_surrogates("^[\\w\\s.]+\\.$") == "^[\\w\\s.]+\\.$"
