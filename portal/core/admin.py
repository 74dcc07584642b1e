from django.contrib import admin

from portal.core.models import IdempotencyRecord


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    list_display = ["created_at", "principal", "key", "method", "path", "status_code"]
    search_fields = ["key", "principal", "path"]
    readonly_fields = [f.name for f in IdempotencyRecord._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
