"""Rows and bases that belong to no domain app: stored answers for idempotent API calls, and
the append-only base of the audit trails."""

from django.core.exceptions import ValidationError
from django.db import models


class AppendOnlyModel(models.Model):
    """An audit-trail row: written once, never updated or deleted through the ORM."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValidationError(f"{self._meta.verbose_name_plural} are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValidationError(f"{self._meta.verbose_name_plural} are append-only.")


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
