"""The OpenAPI schema says what the server does: request bodies refuse unknown fields as the input
serializers do, and every operation lists the errors it can answer, with their one body shape
(``portal.api.errors``), so a generated client or a contract test knows them all."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse

from portal.api import serializers as s

API_PREFIX = "/api/v1/"
ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}


def error(description: str) -> OpenApiResponse:
    """An error answer for ``extend_schema(responses=...)``: the shared body, described."""
    return OpenApiResponse(s.ErrorOut, description=description)


CONFLICT = error("The object's current state does not allow this (``code`` says why).")


class AutoSchema(SpectacularAutoSchema):
    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(serializer, s.StrictInput):
            schema["additionalProperties"] = False
        return schema


def _errors(method: str, operation: dict[str, Any]) -> dict[str, str]:
    """The status codes of the errors any operation of this kind can answer, and why."""
    parameters = operation.get("parameters", [])
    in_path = any(p["in"] == "path" for p in parameters)
    validated = {p["name"] for p in parameters if p["in"] in ("query", "header")}
    listed = "page" in validated
    errors = {"401": "No credentials, or a token that is unknown, revoked or expired."}
    if "requestBody" in operation or validated:
        errors["400"] = "The input is invalid (``fields`` names each field at fault)."
    if "requestBody" in operation:
        errors["413"] = "The request body is larger than the portal accepts."
    if method != "get":
        errors["403"] = "Your role in the team is viewer (or a signed-in session lacks CSRF)."
    if in_path or listed:
        errors["404"] = (
            "No such object among your teams' (or no such page)." if in_path else "No such page."
        )
    return errors


def declare_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: adds the errors every API operation shares (the
    operation-specific ones, e.g. 409, are declared on the views)."""
    for path, item in result.get("paths", {}).items():
        if not path.startswith(API_PREFIX):
            continue
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for code, description in _errors(method, operation).items():
                operation["responses"].setdefault(
                    code,
                    {
                        "content": {"application/json": {"schema": ERROR_REF}},
                        "description": description,
                    },
                )
            operation["responses"] = dict(sorted(operation["responses"].items()))
    return result
