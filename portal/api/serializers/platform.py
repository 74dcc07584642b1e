"""Teams, platform releases, instance types and regions."""

from __future__ import annotations

from rest_framework import serializers

from portal.accounts.models import Team
from portal.deployments.models import (
    InstanceType,
    Region,
)
from portal.registry.models import (
    PlatformRelease,
)


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
