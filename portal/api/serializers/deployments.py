"""Deployments, their status, scaling, instances and events, and what creating or changing one
takes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.api.serializers.base import StrictInput
from portal.deployments import costs
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    Instance,
    InstanceType,
    MultiRegionDeployment,
    Region,
    StageAnalysis,
    Strategy,
)
from portal.deployments.rollout.status import DeploymentStatus, describe
from portal.deployments.scaling_policy import POLICY_SETTINGS
from portal.deployments.state import rollout_limits
from portal.deployments.state.autoscaling import ScaleMetric, ScalingPolicy
from portal.deployments.traffic.routing import call_endpoints, endpoint_url


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
    """:class:`portal.deployments.rollout.status.DeploymentStatus`: its numbers agree with ``traffic``."""

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


def deployment_status(context: Mapping[str, Any], deployment: Deployment) -> DeploymentStatus:
    """The deployment's status, described once per answer however many fields read it: kept in
    the serializers' context (one dict, shared by every serializer of the answer), keyed by the
    row and its version (``updated_at``), never on the model instance."""
    # DRF types the context as a Mapping; it is the root serializer's dict, shared on purpose.
    statuses = cast(dict[str, Any], context).setdefault("deployment_statuses", {})
    key = (deployment.pk, deployment.updated_at)
    if key not in statuses:
        statuses[key] = describe(deployment, deployment.instances.all())
    return statuses[key]


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
            "health_deadline_seconds", "max_error_rate", "canary_analysis", "canary_policy",
            "allow_io_change", "desired_state", "promote_requested", "observed_state", "current_stage",
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
        return deployment_status(self.context, deployment)

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


class StageAnalysisOut(serializers.ModelSerializer):
    """One canary analysis of a bake (see ``GET .../deployments/{id}/analysis/``)."""

    verdicts = serializers.JSONField(
        help_text="Per metric: its verdict (pass, marginal, fail, nodata), the numbers behind it "
        "for both versions (medians, p99s, rates, counts), the effect, the p-value and why."
    )
    sample = serializers.JSONField(
        help_text="Requests read per version, from which instances, and whether an instance's "
        "record no longer reached back to the window's start (``truncated``)."
    )
    policy = serializers.JSONField(help_text="The policy the bake was judged by.")

    class Meta:
        model = StageAnalysis
        fields = [
            "id", "created_at", "stage", "percent", "baseline_version", "canary_version",
            "window_start", "window_end", "decision", "action", "score", "reason", "verdicts",
            "sample", "policy",
        ]  # fmt: skip


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


def _stages_field(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.IntegerField(
            min_value=rollout_limits.STAGE_PERCENT.min, max_value=rollout_limits.STAGE_PERCENT.max
        ),
        required=False,
        min_length=1,
        max_length=rollout_limits.MAX_STAGES,
        **kwargs,
    )


def _setting_field(name: str, **kwargs: Any) -> serializers.Field:
    """A rollout setting's field with its bounds from :mod:`portal.deployments.state.rollout_limits`."""
    bounds = rollout_limits.BOUNDS[name]
    if isinstance(bounds, rollout_limits.IntBounds):
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
        f"{rollout_limits.SCALE_UP_WINDOW_SECONDS.default}.{_POLICY_KEEPS}",
    )
    scale_down_window_seconds = _setting_field(
        "scale_down_window_seconds",
        help_text=f"{POLICY_HELP['scale_down_window_seconds']} Default "
        f"{rollout_limits.SCALE_DOWN_WINDOW_SECONDS.default}.{_POLICY_KEEPS}",
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


def canary_analysis_field(keeps: str = "") -> serializers.BooleanField:
    return serializers.BooleanField(
        required=False,
        help_text="Judge each bake below 100% by comparing the new version's requests with the "
        "old version's over the same minutes (latency, tokens, errors, empty, length-stopped "
        "and schema-invalid answers), and promote, hold or roll back on the verdict. Default "
        f"false for a new deployment.{keeps}",
    )


def canary_policy_field(keeps: str = "") -> serializers.JSONField:
    return serializers.JSONField(
        required=False,
        help_text='How bakes are judged: ``{"metrics": [{"name": "latency_s", "max_change": '
        '0.2}, ...], "pass_score": 95, "marginal_score": 75}``. Fields left out take the '
        "platform default's; ``{}`` is the default policy. Errors name the field, e.g. "
        f"``canary_policy.metrics[0].alpha``.{keeps}",
    )


class DeploymentCreateIn(ScalingPolicyIn):
    """Deploy a version. Red-Black onto a model whose Red-Black deployment is live rolls that
    deployment onto the version (answered 200, not 201): see ``deploy`` in the services."""

    model = serializers.IntegerField(min_value=1)
    strategy = serializers.ChoiceField(choices=Strategy.choices)
    version = serializers.IntegerField(min_value=1, help_text="Id of the version to serve.")
    replicas = _setting_field(
        "replicas",
        help_text=f"Default {rollout_limits.REPLICAS.default} for a new deployment.{_KEEPS}",
    )
    instance_type = serializers.SlugField(max_length=63)
    region = serializers.SlugField(
        max_length=40,
        required=False,
        help_text="The region's name (see /regions/); omitted: the default region.",
    )
    stages = _stages_field(
        help_text=f"Default {list(rollout_limits.DEFAULT_STAGES)} for a new deployment.{_KEEPS}"
    )
    bake_seconds = _setting_field(
        "bake_seconds",
        help_text=f"Default {rollout_limits.BAKE_SECONDS.default} for a new deployment.{_KEEPS}",
    )
    health_deadline_seconds = _setting_field(
        "health_deadline_seconds",
        help_text="Each new instance must pass its health check within this long. Default "
        f"{rollout_limits.HEALTH_DEADLINE_SECONDS.default} for a new deployment.{_KEEPS}",
    )
    max_error_rate = _setting_field(
        "max_error_rate",
        help_text="Share of failed requests on the new version during a bake that rolls back. "
        f"Default {rollout_limits.MAX_ERROR_RATE.default} for a new deployment.{_KEEPS}",
    )
    canary_analysis = canary_analysis_field(_KEEPS)
    canary_policy = canary_policy_field(_KEEPS)
    allow_io_change = serializers.BooleanField(default=False)


class DeploymentUpdateIn(ScalingPolicyIn):
    version = serializers.IntegerField(min_value=1, required=False)
    replicas = _setting_field("replicas")
    stages = _stages_field()
    bake_seconds = _setting_field("bake_seconds")
    health_deadline_seconds = _setting_field("health_deadline_seconds")
    max_error_rate = _setting_field("max_error_rate")
    canary_analysis = canary_analysis_field()
    canary_policy = canary_policy_field()
    allow_io_change = serializers.BooleanField(
        required=False,
        help_text="Roll out Red-Black although the new version's interface differs.",
    )


class AdviceQuery(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="Id of the version to roll out.")


class AdviceOut(serializers.Serializer):
    strategy = serializers.CharField()
    reason = serializers.CharField()
    interface_changes = serializers.ListField(child=serializers.CharField())


class ActionIn(StrictInput):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
