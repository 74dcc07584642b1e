"""The API's JSON parser: DRF's, behind a bound on nesting it does not have.

DRF's ``JSONParser`` hands the body to ``json.load``, whose recursion ends in ``RecursionError``
(a 500) on a few kilobytes of nested brackets. Here a document nesting deeper than
:data:`~serving.request_limits.MAX_JSON_DEPTH` is refused before it is parsed, a 400 with the API's JSON
error body, counted the way the serving side counts it (:func:`serving.request_limits.json_depth`). The
body's size is bounded before this runs: DRF reads it through ``request.body``, which Django
refuses past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (a 413, see :mod:`portal.api.errors`).
"""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.parsers import JSONParser

from serving.request_limits import MAX_JSON_DEPTH, json_depth


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        if json_depth(raw) > MAX_JSON_DEPTH:
            raise exceptions.ParseError(
                f"JSON parse error - the document nests deeper than {MAX_JSON_DEPTH} levels"
            )
        stream.seek(0)
        return super().parse(stream, media_type, parser_context)
