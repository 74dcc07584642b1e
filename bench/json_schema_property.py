"""JSON-schema structured outputs, before and after the platform's grammar correction.

Samples answers without a model (tests/constraints/json_schemas.py) from random schemas, once
from XGrammar's own ``compile_json_schema`` and once from the corrected grammar
(serving.constraints.json_schema), on the same schemas and seeds, with the byte-level and the
demo vocabularies; counts finished answers and those that are not JSON (UTF-8 included) or not
valid. Also times the two compile paths on a few fixed schemas. Results go to results/json_schema_property.{json,md}.

    python bench/json_schema_property.py [--schemas 300] [--answers 8] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RESULTS = Path(__file__).resolve().parent / "results"


def measure(vocab: Any, schemas: int, answers: int) -> dict[str, Any]:
    """Finished answers and failures for ``schemas`` random schemas on one vocabulary."""
    import xgrammar

    from serving.constraints.json_schema import json_schema_grammar
    from tests.constraints.json_schemas import check_answer, json_schemas, sample

    compiler = xgrammar.GrammarCompiler(vocab.info, cache_enabled=False)
    counts = {p: {"finished": 0, "not_json": 0, "not_valid": 0} for p in ("before", "after")}
    examples: list[str] = []

    @settings(
        max_examples=schemas,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(schema=json_schemas(), seed=st.integers(0, 2**32 - 1))
    def run(schema: dict[str, Any], seed: int) -> None:
        text = json.dumps(schema)
        before = compiler.compile_json_schema(text, any_whitespace=False)
        after = compiler.compile_grammar(json_schema_grammar(text))
        for path, compiled in (("before", before), ("after", after)):
            rng = random.Random(seed)
            for _ in range(answers):
                answer = sample(compiled, vocab, rng)
                if answer is None:
                    continue
                counts[path]["finished"] += 1
                why = check_answer(answer, schema)
                if why is not None:
                    counts[path]["not_json" if why.startswith("not JSON") else "not_valid"] += 1
                    if len(examples) < 10:
                        examples.append(f"{path}: {text} -> {answer!r}: {why}")

    run()
    return {
        "counts": counts,
        "failure_examples": examples,
    }


# Fixed schemas for the compile-time comparison: small, typical, nested with $defs, wide.
COMPILE_SCHEMAS: dict[str, dict[str, Any]] = {
    "string maxLength": {"type": "string", "maxLength": 16},
    "object of 4": {
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
            "size": {"type": "integer", "minimum": 1, "maximum": 9},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
            "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        },
        "required": ["color", "size", "tags", "name"],
        "additionalProperties": False,
    },
    "nested $defs": {
        "$defs": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 40},
                    "email": {"type": "string", "format": "email"},
                    "age": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
                },
                "required": ["name"],
            }
        },
        "type": "object",
        "properties": {
            "owner": {"$ref": "#/$defs/person"},
            "members": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 10},
        },
        "required": ["owner", "members"],
    },
    "40 properties": {
        "type": "object",
        "properties": {
            f"field_{i}": {"type": "string", "maxLength": 20} if i % 2 else {"type": "number"}
            for i in range(40)
        },
        "required": [f"field_{i}" for i in range(40)],
    },
}


def compile_times(vocab: Any, repeats: int) -> dict[str, dict[str, float]]:
    """Best of ``repeats`` (ms) for XGrammar's compile_json_schema and for the corrected path
    (schema check, conversion, class rewrite, compile_grammar), caches off, in turn."""
    import xgrammar

    from serving.constraints import json_schema

    compiler = xgrammar.GrammarCompiler(vocab.info, cache_enabled=False)
    convert = json_schema._grammar.__wrapped__  # the uncached conversion
    out: dict[str, dict[str, float]] = {}
    for name, schema in COMPILE_SCHEMAS.items():
        text = json.dumps(schema)
        best = {"before": float("inf"), "after": float("inf")}
        for _ in range(repeats):
            start = time.perf_counter()
            compiler.compile_json_schema(text, any_whitespace=False)
            best["before"] = min(best["before"], time.perf_counter() - start)
            start = time.perf_counter()
            compiler.compile_grammar(convert(text, False))
            best["after"] = min(best["after"], time.perf_counter() - start)
        out[name] = {k: v * 1e3 for k, v in best.items()}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=int, default=300, help="random schemas per vocabulary")
    parser.add_argument("--answers", type=int, default=8, help="answers sampled per schema")
    parser.add_argument("--repeats", type=int, default=20, help="compile-time repetitions")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tests.constraints.json_schemas import byte_vocab, demo_vocab

    report: dict[str, Any] = {
        "command": "python bench/json_schema_property.py " + " ".join(sys.argv[1:]),
        "schemas_per_vocab": args.schemas,
        "answers_per_schema": args.answers,
    }
    for name, vocab in (("bytes", byte_vocab()), ("demo", demo_vocab())):
        report[name] = measure(vocab, args.schemas, args.answers)
        report[name]["compile_ms_best"] = compile_times(vocab, args.repeats)
        print(name, json.dumps(report[name], indent=1), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "json_schema_property.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        "| vocabulary | grammar | finished answers | not JSON | not valid |",
        "|---|---|---|---|---|",
    ]
    for name in ("bytes", "demo"):
        for path, label in (("before", "XGrammar compile_json_schema"), ("after", "corrected")):
            c = report[name]["counts"][path]
            lines.append(
                f"| {name} | {label} | {c['finished']} | {c['not_json']} | {c['not_valid']} |"
            )
    lines += [
        "",
        "| vocabulary | schema | compile_json_schema (ms, best) | corrected path (ms, best) |",
        "|---|---|---|---|",
    ]
    for name in ("bytes", "demo"):
        for schema, ms in report[name]["compile_ms_best"].items():
            lines.append(f"| {name} | {schema} | {ms['before']:.2f} | {ms['after']:.2f} |")
    (RESULTS / "json_schema_property.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
