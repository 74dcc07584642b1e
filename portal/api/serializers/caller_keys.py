"""Caller keys (the gateway's credentials, not the API's)."""

from __future__ import annotations

from rest_framework import serializers

from portal.accounts.models import CallerKey, Team
from portal.api.serializers.base import StrictInput


class CallerKeyOut(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    models = serializers.SlugRelatedField(  # type: ignore[var-annotated]
        slug_field="slug",
        many=True,
        read_only=True,
        help_text="The team's models it may call; empty for all of them.",
    )
    active = serializers.BooleanField(
        source="is_active", read_only=True, help_text="Neither revoked nor expired."
    )
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = CallerKey
        fields = [
            "id", "team", "name", "prefix", "models", "expires_at", "revoked_at", "active",
            "requests_per_second", "tokens_per_minute", "created_by", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class CallerKeyCreatedOut(CallerKeyOut):
    key = serializers.SerializerMethodField(
        help_text="The key's plaintext: shown in this answer only, never again (only a digest "
        "is stored)."
    )

    class Meta(CallerKeyOut.Meta):
        fields = [*CallerKeyOut.Meta.fields, "key"]
        read_only_fields = fields

    def get_key(self, key: CallerKey) -> str:
        return self.context["plaintext"]


class CallerKeyCreateIn(StrictInput):
    team = serializers.SlugField(
        max_length=63, required=False, help_text="Defaults to your only team."
    )
    name = serializers.CharField(max_length=100, help_text="What calls with it, e.g. search-app.")
    models = serializers.ListField(
        child=serializers.SlugField(max_length=63),
        required=False,
        default=list,
        max_length=200,
        help_text="Slugs of the team's models it may call; omitted or empty for all of them.",
    )
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, default=None, help_text="Omitted: never expires."
    )
    requests_per_second = serializers.FloatField(
        min_value=0.001,
        max_value=1_000_000,
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted: no limit of its own (the team's still applies).",
    )
    tokens_per_minute = serializers.IntegerField(
        min_value=1,
        max_value=2**31 - 1,
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted: no limit of its own (the team's still applies).",
    )
