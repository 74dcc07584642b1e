"""Rows that belong to no domain app: stored answers for idempotent API calls."""

from django.db import models


class IdempotencyRecord(models.Model):
    """The answer to a creating API call made with an ``Idempotency-Key`` header.

    A retried call with the same key (from the same caller) gets this answer again instead of
    creating anything twice; the same key with a different request is refused.
    """

    principal = models.CharField(max_length=64, help_text="token:<id> or user:<id>")
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=512)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    status_code = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="idempotency_unique_key")
        ]

    def __str__(self) -> str:
        return f"{self.principal} {self.key}"
