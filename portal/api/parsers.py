"""The API's JSON parser: DRF's, behind a bound on nesting it does not have.

DRF's ``JSONParser`` hands the body to ``json.load``, whose recursion ends in ``RecursionError``
(a 500) on a few kilobytes of nested brackets. Here a document nesting deeper than
:data:`MAX_JSON_DEPTH` is refused before it is parsed, a 400 with the API's JSON error body.
The body's size is bounded before this runs: DRF reads it through ``request.body``, which
Django refuses past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (a 413, see :mod:`portal.api.errors`).
"""

from __future__ import annotations

import re

from rest_framework import exceptions
from rest_framework.parsers import JSONParser

#: Deeper than any request body of this API (engine arguments are the deepest, a few levels).
MAX_JSON_DEPTH = 64

# A JSON string, escapes included (unrolled, so a long string is one fast run of the regex).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(raw: bytes, stop_above: int | None = None) -> int:
    """How deeply ``raw`` nests arrays and objects, counted without parsing it (brackets inside
    strings do not count), stopping early once past ``stop_above``."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub(b"", raw)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if stop_above is not None and deepest > stop_above:
                break
        else:
            depth -= 1
    return deepest


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        if json_depth(raw, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
            raise exceptions.ParseError(
                f"JSON parse error - the document nests deeper than {MAX_JSON_DEPTH} levels"
            )
        stream.seek(0)
        return super().parse(stream, media_type, parser_context)
