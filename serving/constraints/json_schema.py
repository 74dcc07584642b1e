"""JSON schema → an XGrammar EBNF grammar whose every finished output is valid JSON.

XGrammar 0.2.9 converts a schema into a grammar, but some of its string rules let characters
through that JSON forbids unescaped inside a string (see ``docs/xgrammar-control-characters.md``),
and it ignores some keywords. This module is the one place both engines take a JSON schema
(and ``json_object``) through: the OpenAI front end sends vLLM the grammar text it returns as
``structured_outputs.grammar``, and the CPU engine compiles the same text. So the CPU engine and
vLLM constrain identically, and neither silently drops a constraint: an unenforceable schema is
refused by keyword instead.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

from serving.sampling.types import InvalidRequestError, StructuredOutput

# What ``json_object`` promises (OpenAI's JSON mode): an object, not any JSON value.
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}

# Keywords that only annotate a schema: nothing to enforce.
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "strict",
    }
)

# Keywords XGrammar 0.2.9 enforces, checked by tests/constraints/test_json_schema_property.py.
_ENFORCED = frozenset(
    {
        "type",
        "enum",
        "const",
        "anyOf",
        "$ref",
        "$defs",
        "definitions",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "multipleOf",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "format",
    }
)

_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})

# Formats whose XGrammar rules produce only characters that need no escape in a JSON string.
FORMATS = frozenset(
    {"date", "time", "date-time", "duration", "email", "ipv4", "ipv6", "hostname", "uuid", "uri"}
)

# Characters a JSON string must escape: the quote, the backslash and U+0000-U+001F.
_MUST_ESCAPE = frozenset([0x22, 0x5C, *range(0x20)])

# The character classes XGrammar 0.2.9 writes for one unescaped character of a string: with
# ``minLength`` or ``maxLength`` (admits control characters), and without (admits the UTF-8
# encodings of surrogates, which are not UTF-8). Both become the class JSON allows.
_FLAWED_CLASSES = (r"[^\"\\\r\n]", r"[^\0-\x1f\"\\\r\n]")
_STRING_CLASS = r"[^\0-\x1f\"\\\ud800-\udfff]"
# Surrogates, to leave out of what a pattern's wildcards and negated classes match.
_SURROGATES = r"\uD800-\uDFFF"


def structured_grammar(structured: StructuredOutput) -> str:
    """The EBNF grammar a ``json``, ``json_object`` or ``grammar`` structured output compiles
    to: what the front end sends vLLM and what the CPU engine compiles."""
    spaces = not structured.disable_any_whitespace
    if structured.json_schema is not None:
        return json_schema_grammar(structured.json_schema, any_whitespace=spaces)
    if structured.json_object:
        return json_object_grammar(any_whitespace=spaces)
    if structured.grammar is None:
        raise InvalidRequestError("structured_outputs has no json, json_object or grammar")
    return structured.grammar


def as_grammar_params(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM ``StructuredOutputsParams`` (as a dict) with a ``json`` or ``json_object``
    constraint replaced by its corrected ``grammar``; anything else, or anything the engine's
    parser refuses (it is named later, by that parser), comes back as given."""
    if params is None or not ({"json", "json_object"} & set(params)):
        return params
    from serving.sampling.params import parse_structured_outputs

    try:
        structured = parse_structured_outputs(params)
    except InvalidRequestError:
        return params
    return {"grammar": structured_grammar(structured)}


def json_schema_grammar(schema: dict[str, Any] | str, *, any_whitespace: bool = False) -> str:
    """The corrected EBNF grammar for ``schema``; raises :class:`InvalidRequestError` naming the
    first keyword that cannot be enforced (or XGrammar's own error)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return _grammar(text, any_whitespace)


def json_object_grammar(*, any_whitespace: bool = False) -> str:
    return json_schema_grammar(JSON_OBJECT_SCHEMA, any_whitespace=any_whitespace)


@functools.lru_cache(maxsize=256)
def _grammar(schema_text: str, any_whitespace: bool) -> str:
    import xgrammar

    try:
        schema = json.loads(schema_text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"structured_outputs.json: {exc.msg}") from None
    if not isinstance(schema, dict):
        raise InvalidRequestError("structured_outputs.json must be a JSON schema object")
    check_enforceable(schema)
    schema_text = json.dumps(_rewritten(schema))
    try:
        grammar = xgrammar.Grammar.from_json_schema(schema_text, any_whitespace=any_whitespace)
    except (RuntimeError, ValueError) as exc:
        raise InvalidRequestError(f"structured_outputs.json: {exc}") from None
    return fix_string_classes(str(grammar))


def fix_string_classes(ebnf: str) -> str:
    """Replace XGrammar's string-character classes by one that admits exactly the characters a
    JSON string may hold unescaped."""
    for flawed in _FLAWED_CLASSES:
        ebnf = ebnf.replace(flawed, _STRING_CLASS)
    return ebnf


def check_enforceable(schema: dict[str, Any]) -> None:
    """Refuse, naming it, the first keyword (or pattern, or format) the grammar would not enforce
    or could enforce only by emitting invalid JSON."""
    for path, node in _subschemas(schema, "schema"):
        _check_combinations(node, path)
        for key, value in node.items():
            where = f"{path}.{key}"
            if key in _ANNOTATIONS:
                continue
            if key not in _ENFORCED:
                raise InvalidRequestError(
                    f"structured_outputs.json: {where} is not supported: the grammar engine "
                    "cannot enforce it"
                )
            if key in ("items", "additionalProperties") and not isinstance(value, dict | bool):
                raise InvalidRequestError(
                    f"structured_outputs.json: {where} must be a schema (an object or a boolean)"
                )
            if key == "format" and value not in FORMATS:
                raise InvalidRequestError(
                    f"structured_outputs.json: {where} {value!r} is not supported "
                    f"(supported: {', '.join(sorted(FORMATS))})"
                )
            if key == "multipleOf" and not (
                node.get("type") == "integer" and type(value) is int and not _BOUNDS & set(node)
            ):
                raise InvalidRequestError(
                    f"structured_outputs.json: {where} is only supported as a whole number on "
                    'a schema of "type": "integer" without minimum or maximum'
                )
            if key == "pattern" and isinstance(value, str):
                _check_pattern(value, where)


def _check_combinations(node: dict[str, Any], path: str) -> None:
    """Keywords XGrammar accepts alone but drops in company (see the upstream report)."""
    constraints = set(node) - _ANNOTATIONS - {"$defs", "definitions"}
    for alone in ("$ref", "anyOf"):
        if alone in node and constraints - {alone}:
            other = sorted(constraints - {alone})[0]
            raise InvalidRequestError(
                f"structured_outputs.json: {path}.{other} next to {alone} is not supported: "
                f"the grammar engine enforces only the {alone}"
            )
    shaped = sorted({"pattern", "format"} & constraints)
    if shaped:
        for other in ("minLength", "maxLength", "pattern", "format"):
            if other in constraints and other != shaped[0]:
                raise InvalidRequestError(
                    f"structured_outputs.json: {path}.{other} together with {shaped[0]} is not "
                    "supported: the grammar engine enforces only the "
                    f"{shaped[0]} (write the length into a pattern instead)"
                )
    if node.get("properties") and node.get("additionalProperties", False) is not False:
        raise InvalidRequestError(
            f"structured_outputs.json: {path}.additionalProperties next to properties is only "
            "supported as false: an extra key written with escapes (\\u0061 for a) can repeat a "
            "property with a value its schema does not allow"
        )
    required = node.get("required")
    if isinstance(required, list):
        properties = node.get("properties")
        defined = properties if isinstance(properties, dict) else {}
        missing = [name for name in required if name not in defined]
        if missing:
            raise InvalidRequestError(
                f"structured_outputs.json: {path}.required names {missing[0]!r}, which "
                "properties does not define"
            )


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object inside ``node`` (a boolean schema has no keywords), with its path."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in ("properties", "$defs", "definitions"):
        children = node.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _subschemas(child, f"{path}.{key}.{name}")
    for key in ("items", "additionalProperties"):
        yield from _subschemas(node.get(key), f"{path}.{key}")
    children = node.get("anyOf")
    if isinstance(children, list):
        for i, child in enumerate(children):
            yield from _subschemas(child, f"{path}.anyOf[{i}]")


def _check_pattern(pattern: str, where: str) -> None:
    """XGrammar matches ``pattern`` against the string's raw text and never escapes: a pattern
    that names a character JSON must escape (as a literal or inside a class) yields a string
    that is not JSON. Classes built only from ``\\d \\w \\s`` (and their negations), negated
    classes and ``.`` are safe: XGrammar leaves those characters out."""
    import re._parser as sre  # type: ignore[import-not-found]

    try:
        parsed = sre.parse(pattern)
    except re.error as exc:
        raise InvalidRequestError(
            f"structured_outputs.json: {where} is not a regex: {exc}"
        ) from None
    try:
        bad = _escaped_chars(parsed)
    except ValueError:
        raise InvalidRequestError(
            f"structured_outputs.json: {where}: lookarounds and back-references are not supported"
        ) from None
    if bad is not None:
        raise InvalidRequestError(
            f"structured_outputs.json: {where} can match U+{bad:04X}, a character a JSON string "
            "must escape, which the grammar engine cannot generate inside a pattern; leave it out "
            "(e.g. with a negated class)"
        )


def _escaped_chars(items: Any) -> int | None:
    """The first must-escape code point that ``items`` (an sre parse tree) names, if any."""
    import re._constants as c  # type: ignore[import-not-found]

    for op, arg in items:
        if op is c.LITERAL and arg in _MUST_ESCAPE:
            return int(arg)
        if op is c.IN:
            negated = any(o is c.NEGATE for o, _ in arg)
            if negated:
                continue
            for o, a in arg:
                if o is c.LITERAL and a in _MUST_ESCAPE:
                    return int(a)
                if o is c.RANGE and a[0] <= 0x5C and any(a[0] <= x <= a[1] for x in _MUST_ESCAPE):
                    return next(x for x in sorted(_MUST_ESCAPE) if a[0] <= x <= a[1])
        if op is c.BRANCH:
            for branch in arg[1]:
                found = _escaped_chars(branch)
                if found is not None:
                    return found
        if op is c.SUBPATTERN:
            found = _escaped_chars(arg[-1])
            if found is not None:
                return found
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            found = _escaped_chars(arg[2])
            if found is not None:
                return found
        if op in (c.ASSERT, c.ASSERT_NOT, c.GROUPREF, c.GROUPREF_EXISTS):
            raise ValueError(op)
    return None


def _rewritten(node: Any, path: str = "schema") -> Any:
    """The schema ``node`` (already checked) as XGrammar is given it: every ``pattern``
    rewritten by :func:`exclude_surrogates`, and every ``enum`` or ``const`` narrowed to the
    values its sibling keywords allow (XGrammar ignores those siblings). Walks the same keywords
    as :func:`_subschemas`."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(node.get("pattern"), str):
        out["pattern"] = exclude_surrogates(node["pattern"])
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            out[key] = {
                name: _rewritten(child, f"{path}.{key}.{name}") for name, child in node[key].items()
            }
    for key in ("items", "additionalProperties"):
        if key in node:
            out[key] = _rewritten(node[key], f"{path}.{key}")
    if isinstance(node.get("anyOf"), list):
        out["anyOf"] = [_rewritten(c, f"{path}.anyOf[{i}]") for i, c in enumerate(node["anyOf"])]
    if "enum" in node or "const" in node:
        out = _narrowed(out, node, path)
    return out


def _narrowed(out: dict[str, Any], node: dict[str, Any], path: str) -> dict[str, Any]:
    """``out`` with its listed values reduced to those valid under the other keywords."""
    import jsonschema

    key = "enum" if "enum" in node else "const"
    values = node["enum"] if key == "enum" else [node["const"]]
    rest = {k: v for k, v in node.items() if k not in ("enum", "const") and k not in _ANNOTATIONS}
    if not rest:
        return out
    try:
        validator = jsonschema.Draft202012Validator(
            rest, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        kept = [v for v in values if validator.is_valid(v)]
    except jsonschema.exceptions.JsonSchemaException as exc:
        raise InvalidRequestError(
            f"structured_outputs.json: {path}.{key} with {sorted(rest)[0]} cannot be checked: {exc}"
        ) from None
    if not kept:
        raise InvalidRequestError(
            f"structured_outputs.json: {path}.{key}: no value satisfies the schema's other keywords"
        )
    return {k: v for k, v in out.items() if k not in rest and k != "const"} | {"enum": kept}


def exclude_surrogates(pattern: str) -> str:
    """``pattern`` with surrogates left out of ``.``, ``\\S``, ``\\W``, ``\\D`` and negated
    classes: XGrammar lets those match the UTF-8 encoding of a surrogate, which is not UTF-8.
    A positive class holding ``\\S``, ``\\W`` or ``\\D`` cannot be narrowed this way and
    is refused."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = negated = False
    class_start = 0
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            escape = pattern[i : i + 2]
            if escape in ("\\S", "\\W", "\\D"):
                if not in_class:
                    escape = f"[^\\{escape[1].lower()}{_SURROGATES}]"
                elif not negated:
                    raise InvalidRequestError(
                        f"structured_outputs.json: pattern class with {escape} is not supported "
                        "(write the class as a negated one)"
                    )
            out.append(escape)
            i += 2
            continue
        if in_class:
            if ch == "]" and i > class_start:
                in_class = False
                if negated:
                    out.append(_SURROGATES)
            out.append(ch)
        elif ch == "[":
            in_class = True
            negated = pattern.startswith("^", i + 1)
            out.append("[^" if negated else "[")
            i += 2 if negated else 1
            class_start = i
            continue
        elif ch == ".":
            out.append(f"[^\\n\\r{_SURROGATES}]")
        else:
            out.append(ch)
        i += 1
    return "".join(out)
