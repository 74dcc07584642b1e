"""What the metrics task keeps: each instance's last reading, and per-deployment points.

Points hold rates over one scrape interval rather than cumulative counts, so a chart is a plain
query; the latency histograms are kept as the interval's bucket deltas so that several
instances or deployments can be merged exactly before a quantile is taken.
"""

from __future__ import annotations

from django.db import models

from portal.deployments.models import Deployment, Instance


class MetricSource(models.Model):
    """One instance's ``/metrics`` as the scraper last saw it.

    ``snapshot`` is the last reading that succeeded: a failed scrape leaves it, so the next
    good one measures the whole gap instead of restarting from nothing.
    """

    instance = models.OneToOneField(
        Instance, on_delete=models.CASCADE, related_name="metric_source"
    )
    url = models.URLField(max_length=500)
    up = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    last_scraped_at = models.DateTimeField(null=True, blank=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)
    snapshot = models.JSONField(null=True, blank=True)
    snapshot_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.url} ({'up' if self.up else 'down'})"


class MetricPoint(models.Model):
    """A deployment over one scrape interval ending at ``at``: rates per second, latency
    quantiles in seconds, fractions within 0..1. None where there is nothing to say (no
    earlier reading yet, no request in the interval, every source down)."""

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="metric_points"
    )
    #: The scrape pass's start, shared by every deployment in the pass so points line up.
    at = models.DateTimeField(db_index=True)
    prompt_tokens_per_s = models.FloatField(null=True, blank=True)
    generation_tokens_per_s = models.FloatField(null=True, blank=True)
    requests_per_s = models.FloatField(null=True, blank=True)
    errors_per_s = models.FloatField(null=True, blank=True)
    ttft_p50 = models.FloatField(null=True, blank=True)
    ttft_p99 = models.FloatField(null=True, blank=True)
    e2e_p50 = models.FloatField(null=True, blank=True)
    e2e_p99 = models.FloatField(null=True, blank=True)
    kv_cache_usage = models.FloatField(null=True, blank=True)
    prefix_cache_hit_rate = models.FloatField(null=True, blank=True)
    sources_up = models.PositiveIntegerField(default=0)
    sources_down = models.PositiveIntegerField(default=0)
    #: The deployment's instances ready at the pass, and the replicas it wanted then (its
    #: ``replicas``; 0 while scaled to zero). None on points written before they were kept.
    ready_instances = models.PositiveIntegerField(null=True, blank=True)
    wanted_replicas = models.PositiveIntegerField(null=True, blank=True)
    #: The interval's new observations per bucket (cumulative by bound, ``"+Inf"`` included),
    #: summed over the deployment's instances.
    ttft_buckets = models.JSONField(default=dict, blank=True)
    e2e_buckets = models.JSONField(default=dict, blank=True)
    #: The same interval per model version, keyed by version number (``"2"``): each entry has
    #: the value fields above, ``sources_up``/``sources_down`` and the two bucket deltas.
    versions = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["deployment", "at"], name="metric_point_deployment_at")]

    def __str__(self) -> str:
        return f"{self.deployment_id} @ {self.at:%Y-%m-%d %H:%M:%S}"
