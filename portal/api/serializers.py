"""Input and output shapes of the API. Inputs reject unknown fields; logic lives in services."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.accounts.models import CallerKey, Team
from portal.cache.models import Materialization
from portal.deployments import costs, limits
from portal.deployments.autoscaling import ScaleMetric, ScalingPolicy
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    Instance,
    InstanceState,
    InstanceType,
    MultiRegionDeployment,
    OnRegionFailure,
    Region,
    Strategy,
)
from portal.deployments.routing import call_endpoints, endpoint_url
from portal.deployments.scaling_policy import POLICY_SETTINGS
from portal.deployments.status import DeploymentStatus, describe
from portal.metrics.services import RANGES as METRIC_RANGES
from portal.registry.models import (
    ApiSurface,
    Backend,
    Model,
    ModelVersion,
    PlatformRelease,
    PluginWheel,
    TaskKind,
    ToolCallParser,
    VersionEvent,
)
from portal.registry.plugins import GENERAL_PLUGINS, LOGITS_PROCESSORS, version_plugins
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


# --- Output --------------------------------------------------------------------------------


class TeamOut(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "slug", "name", "role", "created_at"]

    def get_role(self, team: Team) -> str | None:
        access = self.context.get("access")
        if access is None:
            return None
        return "member" if access.can_write(team.pk) else "viewer"


class ReleaseOut(serializers.ModelSerializer):
    class Meta:
        model = PlatformRelease
        fields = ["id", "name", "triton_image", "vllm_version", "allowed_engine_args", "is_default"]


class InstanceTypeOut(serializers.ModelSerializer):
    price_per_hour = serializers.DecimalField(
        max_digits=10,
        decimal_places=4,
        read_only=True,
        allow_null=True,
        help_text="USD per instance-hour as an operator set it (a decimal string); null when "
        "unset, and then no estimate is given.",
    )
    spec = serializers.CharField(
        source="spec_line",
        read_only=True,
        help_text='One instance in words: "2 \u00d7 nvidia-h100 · 16 vCPU · 200 GiB".',
    )

    class Meta:
        model = InstanceType
        fields = [
            "name", "description", "accelerator", "gpus", "cpus", "memory_gib", "engine",
            "backends", "price_per_hour", "spec",
        ]  # fmt: skip


class RegionOut(serializers.ModelSerializer):
    gateway_url = serializers.CharField(
        source="public_gateway_url",
        read_only=True,
        help_text="The base URL callers in this region use.",
    )
    instance_types: serializers.SlugRelatedField[InstanceType] = serializers.SlugRelatedField(
        slug_field="name",
        many=True,
        read_only=True,
        help_text="The instance types deployments here may use; empty: every active type.",
    )

    class Meta:
        model = Region
        fields = ["name", "description", "is_default", "gateway_url", "instance_types"]


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


class InstanceBriefOut(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number", read_only=True)

    class Meta:
        model = Instance
        fields = ["name", "version", "state", "health_message", "last_health_at"]


class CallEndpointsOut(serializers.Serializer):
    openai = serializers.CharField(allow_null=True)
    kserve_http = serializers.CharField()
    kserve_grpc = serializers.ListField(child=serializers.CharField())


class DeploymentStatusOut(serializers.Serializer):
    """:class:`portal.deployments.status.DeploymentStatus`: its numbers agree with ``traffic``."""

    headline = serializers.CharField(help_text='e.g. "Baking v2 at 50% (stage 2 of 3)".')
    level = serializers.ChoiceField(choices=["ok", "warn", "bad", "idle"])
    badge = serializers.CharField(help_text='The health badge: "2 ready", "rolling back".')
    stage = serializers.IntegerField(
        allow_null=True, help_text="Stage of a staged rollout in progress or paused, else null."
    )
    stage_count = serializers.IntegerField(allow_null=True)
    stage_percent = serializers.IntegerField(
        allow_null=True, help_text="Percent on the target version the stage asks for."
    )
    version = serializers.IntegerField(
        allow_null=True,
        help_text="The version it heads for: the target, or the previous one while rolling back.",
    )
    percent = serializers.IntegerField(help_text="That version's share of the traffic now.")
    progress = serializers.FloatField(help_text="``percent`` as a fraction, 0 to 1.")
    traffic = serializers.CharField(help_text='The split in words: "v2 50% · v1 50%".')
    detail = serializers.CharField(help_text="Why, for a rollback (empty otherwise).")
    rolled_back_from = serializers.IntegerField(
        allow_null=True,
        help_text="After a rollback: the version it rolled back from (deploy it again to roll "
        "forward).",
    )
    bake_ends_at = serializers.DateTimeField(
        allow_null=True, help_text="When the bake under way ends; null when nothing bakes."
    )


#: What each scaling policy setting means, for the input fields and the representation.
POLICY_HELP = {
    "min_replicas": "The fewest instances the autoscaler runs (replicas alone sets "
    "min = max = replicas: a fixed count).",
    "max_replicas": "The most instances the autoscaler runs; greater than min_replicas to "
    "autoscale, equal for a fixed count. Quotas count it.",
    "scale_metric": "The signal the target is per instance of: "
    + "; ".join(f"{value}: {label}" for value, label in ScaleMetric.choices)
    + ".",
    "scale_target": "The signal's target per instance (requests, or the KV-cache fraction "
    "of at most 1). Omitted with a new scale_metric: that signal's default.",
    "scale_up_window_seconds": "Scale up to the lowest count recommended over this window.",
    "scale_down_window_seconds": "Scale down to the highest count recommended over this window.",
    "scale_to_zero_after_seconds": "Stop every instance after this long without a request "
    "(the gateway holds the next one and wakes the deployment); null: never. Not for a "
    "version served over gRPC only.",
}


class ScalingDecisionOut(serializers.Serializer):
    """One decision of the autoscaler that changed the replica count."""

    at = serializers.DateTimeField()
    # "from" and "to" are Python keywords: declared as from_/to_ and renamed in get_fields.
    from_ = serializers.IntegerField(help_text="The replica count before.")
    to_ = serializers.IntegerField(help_text="The replica count after.")
    reason = serializers.CharField(help_text="The rule's numbers in words.")
    metric = serializers.CharField(
        help_text=f"The signal it read: one of {', '.join(ScaleMetric.values)}."
    )
    observed = serializers.FloatField(
        help_text="The signal's mean over the instances that answered (0 when none did)."
    )
    target = serializers.FloatField(help_text="The policy's target for the signal.")

    def get_fields(self) -> dict[str, serializers.Field]:
        renamed = {"from_": "from", "to_": "to"}
        return {renamed.get(name, name): field for name, field in super().get_fields().items()}


class ScalingOut(serializers.Serializer):
    """What the autoscaler did and does: read-only, the controller writes it."""

    autoscales = serializers.BooleanField(
        help_text="Whether load changes the count (min_replicas < max_replicas); a fixed count "
        "otherwise."
    )
    asleep = serializers.BooleanField(
        help_text="Scaled to zero: the gateway holds the next request and wakes it."
    )
    asleep_since = serializers.DateTimeField(
        allow_null=True, help_text="When it scaled to zero; null while awake."
    )
    cold_start_seconds = serializers.FloatField(
        allow_null=True,
        help_text="The last wake's seconds from the wake to the first instance ready; null "
        "before any.",
    )
    decisions = ScalingDecisionOut(
        many=True, help_text="The latest decisions that changed the count, newest first."
    )


def _instant(unix: float | None) -> datetime | None:
    return None if unix is None else datetime.fromtimestamp(unix, tz=UTC)


def scaling_out(deployment: Deployment) -> dict[str, Any]:
    """``ScalingOut`` of ``deployment``: its policy's kind and its stored scaling state."""
    state = deployment.scaling
    return dict(
        ScalingOut(
            {
                "autoscales": ScalingPolicy.of(deployment).autoscales,
                "asleep": state.asleep,
                "asleep_since": _instant(state.asleep_since),
                "cold_start_seconds": state.cold_start_seconds,
                "decisions": [
                    {
                        "at": _instant(d.at),
                        "from": d.replicas_from,
                        "to": d.replicas_to,
                        "reason": d.reason,
                        "metric": d.metric,
                        "observed": d.observed,
                        "target": d.target,
                    }
                    for d in reversed(state.decisions)
                ],
            }
        ).data
    )


class DeploymentOut(serializers.ModelSerializer):
    team = serializers.CharField(source="model.team.slug", read_only=True)
    target_version = serializers.IntegerField(source="target_version.number", read_only=True)
    target_version_id = serializers.IntegerField(read_only=True)
    previous_version = serializers.IntegerField(
        source="previous_version.number", read_only=True, allow_null=True, default=None
    )
    instance_type: serializers.SlugRelatedField[InstanceType] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    region: serializers.SlugRelatedField[Region] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, help_text="Where it runs."
    )
    multi_region: serializers.PrimaryKeyRelatedField[MultiRegionDeployment] = (
        serializers.PrimaryKeyRelatedField(
            read_only=True,
            allow_null=True,
            help_text="The multi-region deployment this is one region's part of (act on that "
            "one: this one refuses actions and new versions); null for a deployment on its own.",
        )
    )
    wave = serializers.IntegerField(
        read_only=True,
        help_text="Its region's place in the multi-region deployment's wave order (1 first); "
        "0 for a deployment on its own.",
    )

    endpoint = serializers.SerializerMethodField(
        help_text="OpenAI base URL of the deployment's stable endpoint (a KServe-only version has "
        "no OpenAI routes: see ``call``)."
    )
    call = serializers.SerializerMethodField(
        help_text="Where callers reach it: ``openai`` (null when the version serves KServe v2 "
        "only), ``kserve_http`` (the KServe v2 HTTP base through the gateway) and "
        "``kserve_grpc`` (the ready instances' own gRPC addresses; the gateway does not proxy "
        "gRPC)."
    )
    status = serializers.SerializerMethodField(
        help_text="What the deployment is doing, derived in one place from its state and "
        "traffic (the page, the dashboard and the admin show the same)."
    )
    current_stage = serializers.SerializerMethodField(
        help_text="The stage of a staged Red-Black rollout in progress or paused (1-based); 0 "
        "when there is none (all at once, Versioned, serving, rolling back). Same as "
        "``status.stage``."
    )
    stage_percent = serializers.SerializerMethodField(
        help_text="Traffic percent on the target version the current stage asks for; null "
        "without a stage. Same as ``status.stage_percent``."
    )
    instances = serializers.SerializerMethodField()
    scaling = serializers.SerializerMethodField(
        help_text="The autoscaler's side: whether it autoscales, whether it is scaled to zero "
        "(since when), the last cold start, and the last decisions that changed ``replicas``."
    )
    estimated_cost_per_hour = serializers.SerializerMethodField(
        help_text="USD per hour for the instances it runs now (its replicas, more during a "
        "rollout; 0 once retired), from its instance type's price; null when the type has "
        "no price. An estimate, not a bill."
    )

    class Meta:
        model = Deployment
        fields = [
            "id", "model", "team", "region", "multi_region", "wave", "strategy", "target_version",
            "target_version_id", "previous_version", "replicas", "min_replicas", "max_replicas",
            "scale_metric", "scale_target", "scale_up_window_seconds", "scale_down_window_seconds",
            "scale_to_zero_after_seconds", "scaling", "instance_type", "stages", "bake_seconds",
            "health_deadline_seconds", "max_error_rate", "allow_io_change",
            "desired_state", "promote_requested", "observed_state", "current_stage",
            "stage_percent", "traffic", "status", "status_message", "endpoint", "call", "instances",
            "estimated_cost_per_hour", "last_reconciled_at", "created_at", "updated_at",
        ]  # fmt: skip
        extra_kwargs = {name: {"help_text": text} for name, text in POLICY_HELP.items()}

    def get_endpoint(self, deployment: Deployment) -> str:
        return endpoint_url(deployment)

    @extend_schema_field(CallEndpointsOut)
    def get_call(self, deployment: Deployment) -> dict[str, Any]:
        return call_endpoints(deployment).as_dict()

    def _status(self, deployment: Deployment) -> DeploymentStatus:
        """One :func:`describe` per deployment row (three fields read it), kept on the row."""
        stamp, cached = getattr(deployment, "_described", (None, None))
        if cached is None or stamp != deployment.updated_at:
            cached = describe(deployment, deployment.instances.all())
            deployment._described = (deployment.updated_at, cached)  # type: ignore[attr-defined]
        return cached

    @extend_schema_field(DeploymentStatusOut)
    def get_status(self, deployment: Deployment) -> dict[str, Any]:
        return self._status(deployment).as_dict()

    def get_current_stage(self, deployment: Deployment) -> int:
        return self._status(deployment).stage or 0

    def get_stage_percent(self, deployment: Deployment) -> int | None:
        return self._status(deployment).stage_percent

    @extend_schema_field(ScalingOut)
    def get_scaling(self, deployment: Deployment) -> dict[str, Any]:
        return scaling_out(deployment)

    @extend_schema_field(serializers.DecimalField(max_digits=16, decimal_places=4, allow_null=True))
    def get_estimated_cost_per_hour(self, deployment: Deployment) -> str | None:
        cost = costs.deployment_estimate(deployment, deployment.instances.all())
        return None if cost is None else str(cost.per_hour)

    @extend_schema_field(InstanceBriefOut(many=True))
    def get_instances(self, deployment: Deployment) -> list[dict[str, Any]]:
        """Instances that run or are stopping (finished ones: see ``/instances/``)."""
        running = [i for i in deployment.instances.all() if i.state not in ("stopped", "failed")]
        return list(InstanceBriefOut(running, many=True).data)


class RegionalDeploymentOut(serializers.Serializer):
    """One region's part of a multi-region deployment: its own Red-Black deployment."""

    region = serializers.CharField(source="region.name")
    wave = serializers.IntegerField(help_text="Its place in the wave order, 1 first.")
    deployment = serializers.IntegerField(source="pk", help_text="The regional deployment's id.")
    observed_state = serializers.CharField()
    desired_state = serializers.CharField()
    current_stage = serializers.SerializerMethodField(
        help_text="The stage of its own staged rollout (1-based); 0 when there is none."
    )
    stage_count = serializers.SerializerMethodField(
        help_text="How many stages its rollout has; null when none is under way."
    )
    traffic = serializers.SerializerMethodField(
        help_text="Its traffic split now: version number → percent."
    )
    replicas = serializers.IntegerField()
    instances_ready = serializers.SerializerMethodField(
        help_text="Its instances passing their health checks now."
    )
    status_message = serializers.CharField()

    def _status(self, deployment: Deployment) -> DeploymentStatus:
        cached = getattr(deployment, "_described", (None, None))[1]
        if cached is None:
            cached = describe(deployment, deployment.instances.all())
            deployment._described = (deployment.updated_at, cached)  # type: ignore[attr-defined]
        return cached

    def get_current_stage(self, deployment: Deployment) -> int:
        return self._status(deployment).stage or 0

    def get_stage_count(self, deployment: Deployment) -> int | None:
        return self._status(deployment).stage_count

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_traffic(self, deployment: Deployment) -> dict[str, int]:
        return {str(number): percent for number, percent in (deployment.traffic or {}).items()}

    def get_instances_ready(self, deployment: Deployment) -> int:
        return sum(1 for i in deployment.instances.all() if i.state == InstanceState.READY)


class WaveOut(serializers.Serializer):
    current = serializers.IntegerField(help_text="The wave under way (1 first); 0 before any.")
    count = serializers.IntegerField(help_text="How many waves: one per region.")
    phase = serializers.CharField(
        help_text="rollout (the wave's region rolls out), bake (the regions moved bake before "
        "the next wave) or empty (no wave under way)."
    )
    bake_ends_at = serializers.DateTimeField(
        allow_null=True, help_text="When the bake between waves ends; null when none bakes."
    )


def regional_of(group: MultiRegionDeployment) -> list[Deployment]:
    """The group's regional deployments in wave order (from its prefetched ``regional``)."""
    return sorted(group.regional.all(), key=lambda deployment: deployment.wave)


class MultiRegionDeploymentOut(serializers.ModelSerializer):
    team = serializers.CharField(source="model.team.slug", read_only=True)
    target_version = serializers.IntegerField(source="target_version.number", read_only=True)
    target_version_id = serializers.IntegerField(read_only=True)
    previous_version = serializers.IntegerField(
        source="previous_version.number", read_only=True, allow_null=True, default=None
    )
    wave_started_at = serializers.SerializerMethodField(
        help_text="When the wave under way started; null before any."
    )
    bake_started_at = serializers.SerializerMethodField(
        help_text="When the bake between waves under way started; null when none bakes."
    )
    regions = serializers.SerializerMethodField(
        help_text="Each region's part, in wave order: its own Red-Black deployment."
    )
    wave = serializers.SerializerMethodField(help_text="Where the waves are.")

    class Meta:
        model = MultiRegionDeployment
        fields = [
            "id", "model", "team", "target_version", "target_version_id", "previous_version",
            "on_region_failure", "wave_bake_seconds", "desired_state", "promote_requested",
            "observed_state", "current_wave", "wave_phase", "wave_started_at", "bake_started_at",
            "promoted", "reason", "failed_region", "status_message", "regions", "wave",
            "last_reconciled_at", "created_at", "updated_at",
        ]  # fmt: skip

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_wave_started_at(self, group: MultiRegionDeployment) -> datetime | None:
        return _instant(group.wave_started_at)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_bake_started_at(self, group: MultiRegionDeployment) -> datetime | None:
        return _instant(group.bake_started_at)

    @extend_schema_field(RegionalDeploymentOut(many=True))
    def get_regions(self, group: MultiRegionDeployment) -> list[dict[str, Any]]:
        return list(RegionalDeploymentOut(regional_of(group), many=True).data)

    @extend_schema_field(WaveOut)
    def get_wave(self, group: MultiRegionDeployment) -> dict[str, Any]:
        return dict(
            WaveOut(
                {
                    "current": group.current_wave,
                    "count": len(regional_of(group)),
                    "phase": group.wave_phase,
                    "bake_ends_at": _instant(group.wave_bake_ends_at),
                }
            ).data
        )


class EventOut(serializers.ModelSerializer):
    class Meta:
        model = DeploymentEvent
        fields = [
            "id", "deployment", "created_at", "kind", "actor_label", "message",
            "from_state", "to_state", "data",
        ]  # fmt: skip


class InstanceOut(serializers.ModelSerializer):
    version = serializers.IntegerField(source="version.number", read_only=True)

    class Meta:
        model = Instance
        fields = [
            "id", "deployment", "version", "launcher", "name", "endpoints", "state",
            "health_message", "last_health_at", "created_at", "updated_at",
        ]  # fmt: skip


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


# --- Input ---------------------------------------------------------------------------------


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


def _stages_field(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.IntegerField(
            min_value=limits.STAGE_PERCENT.min, max_value=limits.STAGE_PERCENT.max
        ),
        required=False,
        min_length=1,
        max_length=limits.MAX_STAGES,
        **kwargs,
    )


def _setting_field(name: str, **kwargs: Any) -> serializers.Field:
    """A rollout setting's field with its bounds from :mod:`portal.deployments.limits`."""
    bounds = limits.BOUNDS[name]
    if isinstance(bounds, limits.IntBounds):
        return serializers.IntegerField(
            min_value=bounds.min, max_value=bounds.max, required=False, **kwargs
        )
    return serializers.FloatField(
        min_value=bounds.min, max_value=bounds.max, required=False, **kwargs
    )


_KEEPS = " Omitted when rolling the model's live Red-Black deployment: it keeps its own."
_POLICY_KEEPS = " Omitted: the deployment keeps its own (the default for a new one)."


class ScalingPolicyIn(StrictInput):
    """The scaling policy's settings (:mod:`portal.deployments.scaling_policy`): only those a
    request contains are passed to the services; ``scale_to_zero_after_seconds: null`` turns
    scale to zero off."""

    min_replicas = _setting_field(
        "min_replicas", help_text=POLICY_HELP["min_replicas"] + _POLICY_KEEPS
    )
    max_replicas = _setting_field(
        "max_replicas", help_text=POLICY_HELP["max_replicas"] + _POLICY_KEEPS
    )
    scale_metric = serializers.ChoiceField(
        choices=ScaleMetric.choices,
        required=False,
        help_text=POLICY_HELP["scale_metric"] + _POLICY_KEEPS,
    )
    scale_target = _setting_field("scale_target", help_text=POLICY_HELP["scale_target"])
    scale_up_window_seconds = _setting_field(
        "scale_up_window_seconds",
        help_text=f"{POLICY_HELP['scale_up_window_seconds']} Default "
        f"{limits.SCALE_UP_WINDOW_SECONDS.default}.{_POLICY_KEEPS}",
    )
    scale_down_window_seconds = _setting_field(
        "scale_down_window_seconds",
        help_text=f"{POLICY_HELP['scale_down_window_seconds']} Default "
        f"{limits.SCALE_DOWN_WINDOW_SECONDS.default}.{_POLICY_KEEPS}",
    )
    scale_to_zero_after_seconds = _setting_field(
        "scale_to_zero_after_seconds",
        allow_null=True,
        help_text=POLICY_HELP["scale_to_zero_after_seconds"] + _POLICY_KEEPS,
    )

    @staticmethod
    def policy_given(data: dict[str, Any]) -> dict[str, Any]:
        """The policy settings the request contained, as the services take them."""
        return {name: data[name] for name in POLICY_SETTINGS if name in data}


class DeploymentCreateIn(ScalingPolicyIn):
    """Deploy a version. Red-Black onto a model whose Red-Black deployment is live rolls that
    deployment onto the version (answered 200, not 201): see ``deploy`` in the services."""

    model = serializers.IntegerField(min_value=1)
    strategy = serializers.ChoiceField(choices=Strategy.choices)
    version = serializers.IntegerField(min_value=1, help_text="Id of the version to serve.")
    replicas = _setting_field(
        "replicas", help_text=f"Default {limits.REPLICAS.default} for a new deployment.{_KEEPS}"
    )
    instance_type = serializers.SlugField(max_length=63)
    region = serializers.SlugField(
        max_length=40,
        required=False,
        help_text="The region's name (see /regions/); omitted: the default region.",
    )
    stages = _stages_field(
        help_text=f"Default {list(limits.DEFAULT_STAGES)} for a new deployment.{_KEEPS}"
    )
    bake_seconds = _setting_field(
        "bake_seconds",
        help_text=f"Default {limits.BAKE_SECONDS.default} for a new deployment.{_KEEPS}",
    )
    health_deadline_seconds = _setting_field(
        "health_deadline_seconds",
        help_text="Each new instance must pass its health check within this long. Default "
        f"{limits.HEALTH_DEADLINE_SECONDS.default} for a new deployment.{_KEEPS}",
    )
    max_error_rate = _setting_field(
        "max_error_rate",
        help_text="Share of failed requests on the new version during a bake that rolls back. "
        f"Default {limits.MAX_ERROR_RATE.default} for a new deployment.{_KEEPS}",
    )
    allow_io_change = serializers.BooleanField(default=False)


class DeploymentUpdateIn(ScalingPolicyIn):
    version = serializers.IntegerField(min_value=1, required=False)
    replicas = _setting_field("replicas")
    stages = _stages_field()
    bake_seconds = _setting_field("bake_seconds")
    health_deadline_seconds = _setting_field("health_deadline_seconds")
    max_error_rate = _setting_field("max_error_rate")
    allow_io_change = serializers.BooleanField(
        required=False,
        help_text="Roll out Red-Black although the new version's interface differs.",
    )


class RegionPartIn(StrictInput):
    """One region of a multi-region deployment: where, and how many instances."""

    region = serializers.SlugField(max_length=40, help_text="The region's name.")
    replicas = _setting_field(
        "replicas", help_text=f"Default {limits.REPLICAS.default}.", allow_null=True
    )
    instance_type = serializers.SlugField(
        max_length=63,
        required=False,
        allow_null=True,
        help_text="Omitted: the multi-region deployment's instance type.",
    )


class MultiRegionCreateIn(StrictInput):
    """Deploy a version Red-Black in several regions, one wave per region in the order given."""

    model = serializers.IntegerField(min_value=1)
    version = serializers.IntegerField(min_value=1, help_text="Id of the version to serve.")
    regions = serializers.ListField(
        child=RegionPartIn(),
        min_length=1,
        max_length=50,
        help_text="The regions in wave order: the first rolls out first.",
    )
    instance_type = serializers.SlugField(max_length=63)
    on_region_failure = serializers.ChoiceField(
        choices=OnRegionFailure.choices, default=OnRegionFailure.ROLL_BACK_ALL
    )
    wave_bake_seconds = serializers.IntegerField(
        min_value=limits.WAVE_BAKE_SECONDS.min,
        max_value=limits.WAVE_BAKE_SECONDS.max,
        required=False,
        help_text="How long the regions moved must stay healthy before the next wave. Default "
        f"{limits.WAVE_BAKE_SECONDS.default}.",
    )
    stages = _stages_field(
        help_text=f"Each region's stages. Default {list(limits.DEFAULT_STAGES)}."
    )
    bake_seconds = _setting_field("bake_seconds")
    health_deadline_seconds = _setting_field("health_deadline_seconds")
    max_error_rate = _setting_field("max_error_rate")

    #: The regional deployments' own rollout settings, passed on when given.
    ROLLOUT = ("stages", "bake_seconds", "health_deadline_seconds", "max_error_rate")


class MultiRegionUpdateIn(StrictInput):
    """Roll every region to another version, one wave at a time (refused while a rollout is
    under way)."""

    version = serializers.IntegerField(
        min_value=1, help_text="Id of the version to roll out, region by region. Required."
    )
    allow_io_change = serializers.BooleanField(
        default=False,
        help_text="Roll out although the new version's interface differs.",
    )


class AdviceQuery(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="Id of the version to roll out.")


class AdviceOut(serializers.Serializer):
    strategy = serializers.CharField()
    reason = serializers.CharField()
    interface_changes = serializers.ListField(child=serializers.CharField())


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


class ActionIn(StrictInput):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


# --- Errors ------------------------------------------------------------------------------------


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


# --- Metrics ------------------------------------------------------------------------------------


class MetricsQuery(serializers.Serializer):
    range = serializers.ChoiceField(
        choices=list(METRIC_RANGES),
        required=False,
        help_text="The window the charts offer (15m, 1h, 6h, 24h); wins over minutes.",
    )
    minutes = serializers.IntegerField(
        min_value=1, max_value=1440, default=60, help_text="How far back, in minutes."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # DRF reads a blank optional query parameter as absent; ``?range=`` or ``?minutes=``
        # is a mistake to report, not a request for the default window.
        if "range" not in attrs and self.initial_data.get("range") == "":
            raise serializers.ValidationError(
                {"range": [f"Choose one of {', '.join(METRIC_RANGES)}."]}
            )
        if self.initial_data.get("minutes") == "":
            raise serializers.ValidationError({"minutes": ["A whole number from 1 to 1440."]})
        if "range" in attrs:
            attrs["minutes"] = METRIC_RANGES[attrs["range"]]
        return attrs


class MetricPointOut(serializers.Serializer):
    """One scrape pass: rates per second, latencies in seconds, fractions within 0..1; null
    where there is nothing to say (no earlier reading, no requests, every source down)."""

    at = serializers.DateTimeField()
    prompt_tokens_per_s = serializers.FloatField(allow_null=True)
    generation_tokens_per_s = serializers.FloatField(allow_null=True)
    requests_per_s = serializers.FloatField(allow_null=True)
    errors_per_s = serializers.FloatField(allow_null=True)
    ttft_p50 = serializers.FloatField(allow_null=True)
    ttft_p99 = serializers.FloatField(allow_null=True)
    e2e_p50 = serializers.FloatField(allow_null=True)
    e2e_p99 = serializers.FloatField(allow_null=True)
    kv_cache_usage = serializers.FloatField(allow_null=True)
    prefix_cache_hit_rate = serializers.FloatField(allow_null=True)
    sources_up = serializers.IntegerField()
    sources_down = serializers.IntegerField()
    ready_instances = serializers.FloatField(
        allow_null=True,
        help_text="Instances ready (a bin's mean); per version, that version's. Null on points "
        "from before replica counts were kept.",
    )
    wanted_replicas = serializers.FloatField(
        allow_null=True,
        help_text="Replicas the deployment wanted, 0 while scaled to zero (a bin's mean); null "
        "per version.",
    )


class MetricSourceOut(serializers.Serializer):
    instance = serializers.CharField()
    version = serializers.IntegerField()
    url = serializers.CharField()
    up = serializers.BooleanField()
    error = serializers.CharField()
    last_scraped_at = serializers.DateTimeField(allow_null=True)


class ChartLineOut(serializers.Serializer):
    field = serializers.CharField(help_text="The point field this line plots.")
    label = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.label


class ChartOut(serializers.Serializer):
    key = serializers.CharField()
    title = serializers.CharField()
    unit = serializers.CharField()
    factor = serializers.FloatField(help_text="Multiply the points' values by it to get unit.")
    lines = serializers.SerializerMethodField()

    @extend_schema_field(ChartLineOut(many=True))
    def get_lines(self, chart: Any) -> list[dict[str, str]]:
        return [{"field": name, "label": label} for name, label in chart.lines]


class VersionSeriesOut(serializers.Serializer):
    version = serializers.IntegerField(help_text="The model version's number.")
    points = MetricPointOut(many=True, help_text="Only the passes that read this version.")


class MarkerOut(serializers.Serializer):
    t = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=["deploy", "stage", "rollback"])
    label = serializers.CharField(help_text="The timeline event's message.")  # type: ignore[assignment]
    deployment = serializers.IntegerField()


class MetricsOut(serializers.Serializer):
    since = serializers.DateTimeField(help_text="The window's start.")
    until = serializers.DateTimeField(help_text="The window's end (now).")
    step = serializers.FloatField(
        allow_null=True,
        help_text="Seconds of scrape passes averaged into each point (stamped with the bin's "
        "start); null when every pass is its own point.",
    )
    points = MetricPointOut(many=True)
    versions = VersionSeriesOut(
        many=True, help_text="The points split by model version, newest version first."
    )
    markers = MarkerOut(many=True, help_text="Deploys, stage changes and rollbacks.")
    sources = MetricSourceOut(many=True)
    charts = ChartOut(many=True)
