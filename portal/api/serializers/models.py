"""Models, their versions, plugin wheels and the model cache's copies."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.accounts.models import Team
from portal.api.serializers.base import JSONObjectField, NoOverridesInput, StrictInput
from portal.api.serializers.platform import ReleaseOut
from portal.cache.models import Materialization
from portal.registry.models import (
    ApiSurface,
    Backend,
    Model,
    ModelVersion,
    PluginWheel,
    TaskKind,
    ToolCallParser,
    VersionEvent,
)
from portal.registry.plugins import GENERAL_PLUGINS, LOGITS_PROCESSORS, version_plugins


class ModelOut(serializers.ModelSerializer):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "team", "slug", "task", "description", "latest_version", "created_at"]

    def get_latest_version(self, model: Model) -> int | None:
        number = model.next_version_number - 1
        return number or None


class MaterializationOut(serializers.ModelSerializer):
    """The version's copy in the model cache: live progress while copying, then what is there."""

    rate_bytes_per_second = serializers.FloatField(read_only=True, allow_null=True)
    eta_seconds = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = Materialization
        fields = [
            "state", "bytes_total", "bytes_done", "files_total", "files_done", "bytes_fetched",
            "rate_bytes_per_second", "eta_seconds", "attempts", "through", "source_revision",
            "error",
            "pinned", "started_at", "heartbeat_at", "finished_at", "last_used_at",
        ]  # fmt: skip
        read_only_fields = fields


class PluginWheelOut(serializers.ModelSerializer):
    """An uploaded plugin wheel: what it is and what its entry points register with vLLM."""

    team = serializers.CharField(source="team.slug", read_only=True)
    general_plugins = serializers.SerializerMethodField(
        help_text="``vllm.general_plugins`` entry points: name → module:function."
    )
    logits_processors = serializers.SerializerMethodField(
        help_text="``vllm.logits_processors`` entry points: name → module:Class."
    )

    class Meta:
        model = PluginWheel
        fields = [
            "id", "team", "sha256", "filename", "name", "version", "size", "general_plugins",
            "logits_processors", "requires", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_general_plugins(self, wheel: PluginWheel) -> dict[str, str]:
        return dict((wheel.entry_points or {}).get(GENERAL_PLUGINS, {}))

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_logits_processors(self, wheel: PluginWheel) -> dict[str, str]:
        return dict((wheel.entry_points or {}).get(LOGITS_PROCESSORS, {}))


class VersionPluginOut(serializers.Serializer):
    """A plugin the version ships: uploaded (named at registration) or found under ``plugins/``
    in its artifact (known once packaged)."""

    name = serializers.CharField()
    version = serializers.CharField()
    filename = serializers.CharField()
    sha256 = serializers.CharField()
    size = serializers.IntegerField()
    origin = serializers.ChoiceField(choices=["uploaded", "artifact"])
    general_plugins = serializers.DictField(child=serializers.CharField())
    logits_processors = serializers.DictField(child=serializers.CharField())


class VersionOut(serializers.ModelSerializer):
    team = serializers.CharField(source="model.team.slug", read_only=True)
    model_slug = serializers.CharField(source="model.slug", read_only=True)
    release = ReleaseOut(read_only=True)
    materialization = serializers.SerializerMethodField()
    plugins = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "id", "model", "model_slug", "team", "number", "artifact_uri", "backend",
            "engine_args", "io_spec", "api_surface", "constraint_plugins", "python_model",
            "tool_call_parser", "release", "state", "failure_reason", "materialization", "package_digest",
            "package_manifest", "plugins", "state_changed_at", "created_at",
        ]  # fmt: skip

    @extend_schema_field(VersionPluginOut(many=True))
    def get_plugins(self, version: ModelVersion) -> Any:
        return VersionPluginOut(version_plugins(version), many=True).data

    @extend_schema_field(MaterializationOut(allow_null=True))
    def get_materialization(self, version: ModelVersion) -> dict | None:
        try:
            return MaterializationOut(version.materialization).data
        except ObjectDoesNotExist:
            return None


class VersionEventOut(serializers.ModelSerializer):
    class Meta:
        model = VersionEvent
        fields = ["id", "created_at", "actor_label", "from_state", "to_state", "message"]


class ModelCreateIn(StrictInput):
    team = serializers.SlugField(
        max_length=63, required=False, help_text="Defaults to your only team."
    )
    slug = serializers.SlugField(max_length=63)
    task = serializers.ChoiceField(choices=TaskKind.choices)
    description = serializers.CharField(
        max_length=5000, required=False, allow_blank=True, default=""
    )


class ModelUpdateIn(StrictInput):
    description = serializers.CharField(max_length=5000, allow_blank=True)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            {"type": "integer", "minimum": 1},
        ],
        "description": "An uploaded plugin wheel of the model's team: its sha256 or its id.",
    }
)
class PluginRefField(serializers.Field):
    default_error_messages = {"invalid": "A plugin wheel's sha256 (64 hex digits) or its id."}

    def to_internal_value(self, data: Any) -> str | int:
        if isinstance(data, bool) or not isinstance(data, str | int):
            self.fail("invalid")
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class VersionCreateIn(NoOverridesInput):
    model = serializers.IntegerField(min_value=1)
    artifact_uri = serializers.CharField(max_length=1024)
    backend = serializers.ChoiceField(choices=Backend.choices, default=Backend.VLLM)
    engine_args = JSONObjectField(required=False, default=dict)
    io_spec = JSONObjectField(required=False, default=dict)
    api_surface = serializers.ChoiceField(
        choices=ApiSurface.choices, required=False,
        help_text="Default: the backend's own (openai+grpc for vLLM, grpc for Python).",
    )  # fmt: skip
    constraint_plugins = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, default=list, max_length=20
    )
    python_model = serializers.CharField(
        required=False, default="", allow_blank=True, trim_whitespace=False,
        help_text="The Python backend's model.py source; omit to take it from the artifact.",
    )  # fmt: skip
    tool_call_parser = serializers.ChoiceField(
        choices=ToolCallParser.choices, default=ToolCallParser.HERMES,
        help_text="How the model writes tool calls under tool_choice auto (its chat template's "
        "format).",
    )  # fmt: skip
    plugins = serializers.ListField(
        child=PluginRefField(), required=False, default=list, max_length=20,
        help_text="Uploaded plugin wheels (POST /api/v1/plugins/) the version ships, by sha256 "
        "or id; wheels under plugins/ in the artifact are added at packaging.",
    )  # fmt: skip


class VersionUpdateIn(NoOverridesInput):
    artifact_uri = serializers.CharField(max_length=1024, required=False)
    engine_args = JSONObjectField(required=False)
    io_spec = JSONObjectField(required=False)
    api_surface = serializers.ChoiceField(choices=ApiSurface.choices, required=False)
    constraint_plugins = serializers.ListField(
        child=serializers.CharField(max_length=100), required=False, max_length=20
    )
    python_model = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    tool_call_parser = serializers.ChoiceField(choices=ToolCallParser.choices, required=False)


class PluginWheelUploadIn(StrictInput):
    wheel = serializers.FileField(
        help_text="A .whl (multipart/form-data); sdists are refused: nothing may run at install."
    )
    team = serializers.SlugField(
        max_length=63, required=False, help_text="Defaults to your only team."
    )


class VersionRetryIn(StrictInput):
    artifact_uri = serializers.CharField(
        max_length=1024, required=False,
        help_text="A corrected source to copy from instead (checked as at registration).",
    )  # fmt: skip
