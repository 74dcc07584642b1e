from django.contrib import admin, messages

from portal.registry.display import engine_args_html, io_spec_html
from portal.registry.models import Model, ModelVersion, PlatformRelease, PluginWheel, VersionEvent
from portal.registry.services import set_default_release


@admin.register(PlatformRelease)
class PlatformReleaseAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "triton_image",
        "vllm_version",
        "is_default",
        "version_count",
        "created_at",
    ]
    list_filter = ["is_default", "vllm_version"]
    search_fields = ["name", "triton_image", "vllm_version"]
    readonly_fields = ["is_default", "created_at"]
    actions = ["make_default"]

    @admin.display(description="versions")
    def version_count(self, release: PlatformRelease) -> int:
        return release.versions.count()

    def get_readonly_fields(self, request, obj=None):
        # A release that packaged versions is history: its pinned pair may not change under them.
        if obj is not None and obj.versions.exists():
            return [
                *self.readonly_fields,
                "name",
                "triton_image",
                "vllm_version",
                "allowed_engine_args",
            ]
        return self.readonly_fields

    @admin.action(description="Make the selected release the default")
    def make_default(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one release.", messages.ERROR)
            return
        release = queryset.get()
        set_default_release(release)
        self.message_user(
            request, f"{release.name} is now the default; existing versions keep theirs."
        )


class VersionInline(admin.TabularInline):
    model = ModelVersion
    fields = readonly_fields = (
        "number",
        "backend",
        "api_surface",
        "state",
        "release",
        "created_at",
    )
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["slug", "team", "task", "latest_version", "created_at"]
    list_filter = ["task", "team"]
    search_fields = ["slug", "description", "team__slug"]
    readonly_fields = ["next_version_number", "created_by", "created_at"]
    inlines = [VersionInline]

    @admin.display(description="latest")
    def latest_version(self, model: Model) -> int | None:
        return (model.next_version_number - 1) or None


class VersionEventInline(admin.TabularInline):
    """The version's lifecycle, read-only: events are an audit trail."""

    model = VersionEvent
    fields = readonly_fields = ("created_at", "actor_label", "from_state", "to_state", "message")
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    """Operators inspect versions here. Authors register them through the API or the forms,
    which run the validation service; lifecycle moves belong to the workers, so all is read-only."""

    list_display = ["__str__", "backend", "api_surface", "state", "release", "state_changed_at"]
    list_filter = ["state", "backend", "api_surface", "release"]
    search_fields = ["model__slug", "model__team__slug", "artifact_uri"]
    readonly_fields = [
        "model", "number", "artifact_uri", "backend", "engine_arguments", "io_spec_table", "api_surface",
        "tool_call_parser", "constraint_plugins", "python_model", "release", "state", "failure_reason",
        "package_digest", "package_manifest", "state_changed_at", "created_by", "created_at",
    ]  # fmt: skip

    inlines = [VersionEventInline]

    @admin.display(description="engine arguments")
    def engine_arguments(self, version: ModelVersion) -> str:
        return engine_args_html(version.engine_args)

    @admin.display(description="I/O spec")
    def io_spec_table(self, version: ModelVersion) -> str:
        return io_spec_html(version.io_spec)

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(PluginWheel)
class PluginWheelAdmin(admin.ModelAdmin):
    """Read-only: wheels arrive by upload (the API), inspected; the admin only lists them."""

    list_display = ["filename", "team", "name", "version", "size", "sha256", "created_at"]
    list_filter = ["team"]
    search_fields = ["filename", "name", "sha256"]
    readonly_fields = [
        "team", "sha256", "filename", "name", "version", "entry_points", "requires", "size",
        "created_by", "created_at",
    ]  # fmt: skip

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
