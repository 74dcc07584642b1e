"""Deployments across regions and their waves."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.api.serializers.base import StrictInput
from portal.api.serializers.deployments import (
    _instant,
    _setting_field,
    _stages_field,
    canary_analysis_field,
    canary_policy_field,
    deployment_status,
)
from portal.deployments.models import (
    Deployment,
    InstanceState,
    MultiRegionDeployment,
    OnRegionFailure,
)
from portal.deployments.rollout.status import DeploymentStatus
from portal.deployments.services import ROLLOUT_SETTINGS
from portal.deployments.state import rollout_limits


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
        return deployment_status(self.context, deployment)

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


class RegionPartIn(StrictInput):
    """One region of a multi-region deployment: where, and how many instances."""

    region = serializers.SlugField(max_length=40, help_text="The region's name.")
    replicas = _setting_field(
        "replicas", help_text=f"Default {rollout_limits.REPLICAS.default}.", allow_null=True
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
        min_value=rollout_limits.WAVE_BAKE_SECONDS.min,
        max_value=rollout_limits.WAVE_BAKE_SECONDS.max,
        required=False,
        help_text="How long the regions moved must stay healthy before the next wave. Default "
        f"{rollout_limits.WAVE_BAKE_SECONDS.default}.",
    )
    stages = _stages_field(
        help_text=f"Each region's stages. Default {list(rollout_limits.DEFAULT_STAGES)}."
    )
    bake_seconds = _setting_field("bake_seconds")
    health_deadline_seconds = _setting_field("health_deadline_seconds")
    max_error_rate = _setting_field("max_error_rate")
    canary_analysis = canary_analysis_field(" Each region judges its own bakes.")
    canary_policy = canary_policy_field()

    #: The regional deployments' own rollout settings, passed on when given.
    ROLLOUT = ROLLOUT_SETTINGS


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
