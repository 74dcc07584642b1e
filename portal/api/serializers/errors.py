"""The API's error body."""

from __future__ import annotations

from rest_framework import serializers


class ErrorDetailOut(serializers.Serializer):
    code = serializers.CharField(help_text="Stable, machine-readable: invalid, not_found, ...")
    message = serializers.CharField(help_text="For people; the first field's problem if any.")
    fields = serializers.DictField(  # type: ignore[assignment]  # the error body's key
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="The input fields at fault (``field.sub`` or ``field[0]``) and their problems.",
    )
    detail = serializers.DictField(required=False, help_text="Facts about the refusal.")


class ErrorOut(serializers.Serializer):
    """Every failed call's body (see ``portal.api.errors``)."""

    error = ErrorDetailOut()
