"""Metric points and charts."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.metrics.services import RANGES as METRIC_RANGES


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
