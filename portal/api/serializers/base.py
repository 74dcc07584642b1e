"""What every input shape shares: unknown fields refused, JSON types not coerced, no overrides of
what the platform sets."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.registry.models import (
    PlatformRelease,
)
from portal.registry.validation import find_version_overrides, override_message

#: The JSON type each kind of field takes. DRF would coerce ``0`` into ``"0"`` or ``"5"`` into
#: 5; the schema promises a string or a number, and a caller who sends the other kind has a bug.
_JSON_TYPES: tuple[tuple[type[serializers.Field], tuple[type, ...]], ...] = (
    (serializers.BooleanField, (bool,)),
    (serializers.CharField, (str,)),
    (serializers.IntegerField, (int,)),
    (serializers.FloatField, (int, float)),
)


def _json_type_error(field: serializers.Field, value: Any) -> str | None:
    if value is None:  # each field's allow_null decides
        return None
    if isinstance(field, serializers.ListField):
        items = value if isinstance(value, list) else []
        return next(filter(None, (_json_type_error(field.child, item) for item in items)), None)
    for kind, types in _JSON_TYPES:
        if isinstance(field, kind):
            fits = isinstance(value, types) and (bool in types or not isinstance(value, bool))
            if not fits:
                return str(field.error_messages["invalid"])
    # As sent, before whitespace is trimmed: the schema's maxLength is of the JSON string.
    limit = getattr(field, "max_length", None)
    if isinstance(field, serializers.CharField) and limit is not None and len(value) > limit:
        return str(field.error_messages["max_length"]).format(max_length=limit)
    return None


class StrictInput(serializers.Serializer):
    """Refuses fields it does not know, so a typo is an error instead of being silently dropped,
    and values of another JSON type than the field's, instead of converting them."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {
                        name: [f"Unknown field. Known fields: {', '.join(self.fields)}."]
                        for name in unknown
                    }
                )
            wrong = {
                name: [message]
                for name, value in data.items()
                if (message := _json_type_error(self.fields[name], value))
            }
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """A JSON object (never null, a list or a scalar), as the schema declares it."""

    default_error_messages = {"not_an_object": "Must be a JSON object."}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_an_object")
        return value


class NoOverridesInput(StrictInput):
    """Gives attempts to pin the vLLM version or image their own message, before anything else."""

    def to_internal_value(self, data: Any) -> Any:
        # The artifact source is a location and model.py is code, not settings: a repository
        # named "...-vllm@rev" is no version pin. Both have their own validation.
        unscanned = {"artifact_uri", "python_model"}
        scanned = (
            {k: v for k, v in data.items() if k not in unscanned} if isinstance(data, dict) else {}
        )
        paths = find_version_overrides(scanned)
        if paths:
            field = paths[0].split(".")[0].split("[")[0]
            release = PlatformRelease.objects.filter(is_default=True).first()
            raise serializers.ValidationError({field: [override_message(paths, release)]})
        return super().to_internal_value(data)
