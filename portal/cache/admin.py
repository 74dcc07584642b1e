"""Operators see what is in the model cache, how full it is, and pin or evict versions."""

from __future__ import annotations

import shutil

from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.cache import cleanup, services
from portal.cache.models import Materialization


def _readable_duration(seconds: int) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


@admin.register(Materialization)
class MaterializationAdmin(admin.ModelAdmin):
    list_display = [
        "version",
        "state",
        "size",
        "progress",
        "pinned",
        "last_used_at",
        "finished_at",
        "attempts",
    ]
    list_filter = ["state", "pinned"]
    search_fields = ["version__model__slug", "version__model__team__slug", "tree"]
    list_select_related = ["version__model__team"]
    actions = ["pin", "unpin", "request_copy"]
    readonly_fields = [f.name for f in Materialization._meta.fields if f.name != "pinned"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rows are created by registration and the copy tasks

    @admin.display(description="size")
    def size(self, record: Materialization) -> str:
        return f"{record.bytes_total / 2**20:,.1f} MiB"

    @admin.display(description="progress")
    def progress(self, record: Materialization) -> str:
        if not record.bytes_total:
            return "-"
        return (
            f"{100 * record.bytes_done / record.bytes_total:.0f}% "
            f"({record.files_done}/{record.files_total} files)"
        )

    def changelist_view(self, request, extra_context=None):
        store = services.content_store()
        root = store.root
        root.mkdir(parents=True, exist_ok=True)
        usage = store.usage()
        extra_context = {
            **(extra_context or {}),
            "usage": usage,
            "used_bytes": usage.blob_bytes + usage.staging_bytes,
            "partial_downloads": cleanup.partial_downloads(),
            "staging_grace": _readable_duration(settings.MODEL_CACHE_STAGING_GRACE_SECONDS),
            "capacity": settings.MODEL_CACHE_MAX_BYTES,
            "cache_root": root,
            "free": shutil.disk_usage(root).free,
        }
        return super().changelist_view(request, extra_context)

    @admin.action(description="Pin: never evict these versions")
    def pin(self, request: HttpRequest, queryset: QuerySet[Materialization]) -> None:
        count = queryset.update(pinned=True)
        self.message_user(request, f"Pinned {count} version(s).")

    @admin.action(description="Unpin: let eviction consider these versions")
    def unpin(self, request: HttpRequest, queryset: QuerySet[Materialization]) -> None:
        count = queryset.update(pinned=False)
        self.message_user(request, f"Unpinned {count} version(s).")

    @admin.action(description="Copy back into the cache (evicted or failed copies)")
    def request_copy(self, request: HttpRequest, queryset: QuerySet[Materialization]) -> None:
        count = sum(services.copy_back(record.version) for record in queryset)
        self.message_user(request, f"Requested {count} copy(ies).", messages.INFO)
