"""vLLM 0.24 takes the corrected grammar as EBNF and parses it as XGrammar does.

vLLM's structured-output utilities import llguidance at module level (not installed here), so
the one function that decides Lark vs EBNF is read from vLLM's own source and run alone."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import xgrammar

from serving.constraints.json_schema import json_object_grammar, json_schema_grammar

SCHEMAS: list[dict[str, Any]] = [
    {"type": "string", "maxLength": 5},
    {"type": "string", "format": "email"},
    {"type": "string", "format": "uri"},
    {"type": "object", "properties": {"a#b//c": {"type": "string", "pattern": "^[#/]+$"}}},
]


def _vllm_function(relative: str, name: str) -> Any:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    source = (Path(spec.origin).parent / relative).read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {"re": re}
    exec(compile(ast.Module([node], []), relative, "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: str(s)[:40])
def test_vllm_reads_the_grammar_as_ebnf(schema: dict[str, Any]) -> None:
    is_lark = _vllm_function("v1/structured_output/utils.py", "grammar_is_likely_lark")
    for grammar in (json_schema_grammar(schema), json_object_grammar()):
        assert not is_lark(grammar)
        xgrammar.Grammar.from_ebnf(grammar)  # vLLM's validation of a grammar request
