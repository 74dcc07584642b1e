"""What the portal knows about each version's copy in the model cache."""

from __future__ import annotations

from django.db import models

from portal.registry.models import ModelVersion


class CopyState(models.TextChoices):
    PENDING = "pending", "Waiting for a worker"
    COPYING = "copying", "Copying"
    PRESENT = "present", "In the cache"
    FAILED = "failed", "Failed"
    EVICTED = "evicted", "Evicted"


class Materialization(models.Model):
    """One version's weights in the model cache: live progress while copying, then what is
    there, how big, when it was last deployed (eviction goes by that) and whether an operator
    pinned it. The version's own lifecycle stays in ``ModelVersion.state``; this row also
    covers a ready version whose weights were evicted and are being copied back."""

    version = models.OneToOneField(
        ModelVersion, on_delete=models.CASCADE, related_name="materialization"
    )
    #: The version's tree, relative to ``MODEL_CACHE_ROOT``.
    tree = models.CharField(max_length=512)
    state = models.CharField(max_length=16, choices=CopyState.choices, default=CopyState.PENDING)
    bytes_total = models.BigIntegerField(default=0)
    bytes_done = models.BigIntegerField(default=0)
    files_total = models.PositiveIntegerField(default=0)
    files_done = models.PositiveIntegerField(default=0)
    #: Bytes the last attempt read from the source; resumed and deduplicated bytes are not.
    bytes_fetched = models.BigIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    #: How the last attempt got the bytes: a worker's copy, or an FSx file system's restore.
    through = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    #: The exact revision copied, where the source has one (a Hub commit).
    source_revision = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    pinned = models.BooleanField(
        default=False, help_text="Pinned versions are never evicted, whatever the cache size."
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.version} in the cache ({self.state})"

    @property
    def rate_bytes_per_second(self) -> float | None:
        """Source bytes per second of the running copy, from its last heartbeat."""
        if self.state != CopyState.COPYING or not (self.started_at and self.heartbeat_at):
            return None
        elapsed = (self.heartbeat_at - self.started_at).total_seconds()
        return self.bytes_fetched / elapsed if elapsed > 0 and self.bytes_fetched else None

    @property
    def eta_seconds(self) -> float | None:
        rate = self.rate_bytes_per_second
        if rate is None:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / rate)
