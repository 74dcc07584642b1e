from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from portal.accounts.models import CallerKey
from portal.core.actors import Actor
from portal.core.errors import Conflict
from portal.deployments.lifecycle import Action
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    Instance,
    InstanceType,
    MultiRegionDeployment,
    Region,
    RegionalCopy,
    StageAnalysis,
)
from portal.deployments.regions import multi_region
from portal.deployments.rollout.status import describe, traffic_text
from portal.deployments.runtime.launchers import region_config
from portal.deployments.services import act, policy_words
from portal.deployments.traffic.caller_keys import (
    CallerKeyError,
    check_key,
    issue_caller_key,
    publish_after_commit,
    revoke_caller_keys,
)
from portal.registry.models import Backend


class InstanceTypeForm(forms.ModelForm):
    """The backends as checkboxes rather than a JSON box."""

    backends = forms.MultipleChoiceField(
        choices=Backend.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text=InstanceType._meta.get_field("backends").help_text,
    )

    class Meta:
        model = InstanceType
        fields = "__all__"  # noqa: DJ007 -- every field an operator sets, as the default form


@admin.register(InstanceType)
class InstanceTypeAdmin(admin.ModelAdmin):
    form = InstanceTypeForm
    list_display = [
        "name", "accelerator", "gpus", "cpus", "memory_gib", "price_per_hour", "engine",
        "backends", "is_active",
    ]  # fmt: skip
    list_filter = ["is_active", "accelerator"]
    search_fields = ["name", "description"]


class StageAnalysisInline(admin.TabularInline):
    """Each bake's canary analysis, read-only: the verdict per metric in a line each."""

    model = StageAnalysis
    fields = readonly_fields = (
        "created_at",
        "stage",
        "percent",
        "canary_version",
        "baseline_version",
        "decision",
        "score",
        "action",
        "metrics",
    )
    extra = 0
    can_delete = False

    @admin.display(description="metrics (canary vs baseline)")
    def metrics(self, analysis: StageAnalysis) -> str:
        return format_html_join(
            "",
            "<div>{} <b>{}</b>: {}</div>",
            ((v["name"], v["verdict"], v["reason"]) for v in analysis.verdicts),
        )

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class EventInline(admin.TabularInline):
    """The timeline, read-only: events are an audit trail."""

    model = DeploymentEvent
    fields = readonly_fields = (
        "created_at",
        "actor_label",
        "kind",
        "from_state",
        "to_state",
        "message",
    )
    extra = 0
    can_delete = False
    ordering = ["-created_at", "-id"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class InstanceInline(admin.TabularInline):
    model = Instance
    fields = readonly_fields = (
        "name", "version", "launcher", "state", "ready_at", "last_health_at", "health_message",
    )  # fmt: skip
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


def _when(unix: float) -> str:
    return datetime.fromtimestamp(unix, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class RolloutActionsAdmin(admin.ModelAdmin):
    """Pause, resume, promote, abort and rollback as admin actions on the selected rows,
    through the service that validates and records them (``act``; ``noun`` names a row)."""

    act: Callable[..., Any]
    noun = "Deployment"
    actions = [
        "request_pause", "request_resume", "request_promote", "request_abort", "request_rollback",
    ]  # fmt: skip

    def _request(self, request, queryset, what: Action) -> None:
        actor = Actor.operator(request.user)
        for obj in queryset:
            try:
                type(self).act(
                    obj, what, actor=actor, reason="requested by an operator in the admin"
                )
            except Conflict as exc:
                self.message_user(request, f"{self.noun} {obj.pk}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"{self.noun} {obj.pk}: {what} requested.")

    @admin.action(description="Pause the rollout in progress")
    def request_pause(self, request, queryset):
        self._request(request, queryset, Action.PAUSE)

    @admin.action(description="Resume a paused rollout")
    def request_resume(self, request, queryset):
        self._request(request, queryset, Action.RESUME)

    @admin.action(description="Promote: finish the rollout now (no more stages or bakes)")
    def request_promote(self, request, queryset):
        self._request(request, queryset, Action.PROMOTE)

    @admin.action(description="Request a rollback to the previous version")
    def request_rollback(self, request, queryset):
        self._request(request, queryset, Action.ROLLBACK)

    @admin.action(description="Abort the rollout in progress")
    def request_abort(self, request, queryset):
        self._request(request, queryset, Action.ABORT)


class RegionalCopyInline(admin.TabularInline):
    """The versions copied into the region's own model cache (written by the copy task)."""

    model = RegionalCopy
    fields = readonly_fields = (
        "version",
        "state",
        "reason",
        "bytes_copied",
        "attempts",
        "updated_at",
    )
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    """Operators define regions here: where a region's instances run (its launcher and its
    settings), the gateways that serve it and the instance types it offers."""

    list_display = [
        "name", "is_default", "launcher_used", "gateway_prefix", "public_gateway_url",
        "is_active",
    ]  # fmt: skip
    list_filter = ["is_active"]
    search_fields = ["name", "description"]
    filter_horizontal = ["instance_types"]
    inlines = [RegionalCopyInline]

    @admin.display(description="launcher")
    def launcher_used(self, region: Region) -> str:
        config = region_config(region)
        kind = region.launcher or f"{settings.INSTANCE_LAUNCHER} (the platform's)"
        where = (
            f"context {config.kubernetes_context or '(current)'}, namespace "
            f"{config.kubernetes_namespace}"
            if kind.startswith("kubernetes")
            else f"run directory {config.run_root}"
        )
        return f"{kind}; {where}"

    def has_delete_permission(self, request, obj=None) -> bool:
        # A region that ever held a deployment is history (PROTECT keeps it); it is retired by
        # unticking is_active instead.
        return obj is None or not obj.deployments.exists()


@admin.register(MultiRegionDeployment)
class MultiRegionDeploymentAdmin(RolloutActionsAdmin):
    """Read-only like deployments: operators act on the whole rollout through the actions."""

    list_display = [
        "id", "model", "target_version", "observed_state", "current_wave", "wave_phase",
        "on_region_failure", "status_message", "updated_at",
    ]  # fmt: skip
    list_filter = ["observed_state", "on_region_failure"]
    search_fields = ["model__slug", "model__team__slug", "status_message"]
    readonly_fields = [f.name for f in MultiRegionDeployment._meta.fields]
    act = staticmethod(multi_region.act)  # every region follows
    noun = "Multi-region deployment"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Deployment)
class DeploymentAdmin(RolloutActionsAdmin):
    list_display = [
        "id", "model", "region", "strategy", "target_version", "replicas", "policy",
        "instance_type", "desired_state", "observed_state", "status", "traffic_split",
        "updated_at",
    ]  # fmt: skip
    list_filter = ["strategy", "observed_state", "desired_state", "region", "instance_type"]
    search_fields = ["model__slug", "model__team__slug", "status_message"]
    readonly_fields = [
        "model", "region", "multi_region", "wave", "strategy", "target_version",
        "previous_version", "desired_state",
        "promote_requested", "observed_state", "status", "traffic_split", "status_message",
        "stages", "bake_seconds", "health_deadline_seconds", "max_error_rate",
        "canary_analysis", "canary_policy", "allow_io_change", "last_reconciled_at", "created_by", "created_at", "updated_at",
        # The scaling policy (changed only through the services, as the rest) and what the
        # autoscaler did, in words instead of its stored JSON.
        "replicas", "min_replicas", "max_replicas", "scale_metric", "scale_target",
        "scale_up_window_seconds", "scale_down_window_seconds", "scale_to_zero_after_seconds",
        "scaling_summary",
    ]  # fmt: skip
    exclude = ["scaling"]
    inlines = [InstanceInline, StageAnalysisInline, EventInline]
    act = staticmethod(act)

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .select_related(
                "model__team", "target_version", "previous_version", "instance_type", "region"
            )
            .prefetch_related("instances")
        )

    @admin.display(description="status")
    def status(self, deployment: Deployment) -> str:
        """The headline the pages and the API show (:func:`.status.describe`)."""
        return describe(deployment, deployment.instances.all()).headline

    @admin.display(description="traffic")
    def traffic_split(self, deployment: Deployment) -> str:
        return traffic_text(deployment.traffic, deployment.target_version.number)

    @admin.display(description="scaling")
    def policy(self, deployment: Deployment) -> str:
        return policy_words(deployment)

    @admin.display(description="scaling")
    def scaling_summary(self, deployment: Deployment) -> str:
        """The policy in words, sleep and the last cold start, and the last decisions."""
        state = deployment.scaling
        lines = [policy_words(deployment)]
        if state.asleep_since is not None:
            lines.append(f"Scaled to zero since {_when(state.asleep_since)}.")
        if state.cold_start_seconds is not None:
            lines.append(f"Last cold start: {state.cold_start_seconds:.1f} s.")
        decisions = format_html_join(
            "",
            "<li>{}: {} → {} ({})</li>",
            (
                (_when(d.at), d.replicas_from, d.replicas_to, d.reason)
                for d in reversed(state.decisions)
            ),
        )
        return format_html(
            "{}{}",
            format_html_join("", "<p>{}</p>", ((line,) for line in lines)),
            format_html("<p>Last decisions, newest first:</p><ul>{}</ul>", decisions)
            if state.decisions
            else format_html("<p>{}</p>", "No scaling decision yet."),
        )

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        # Desired state changes only through the services, which validate it and record an
        # event; a plain admin form would bypass both. Operators act through the actions.
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        # A live deployment is stopped through the controller (abort), never deleted under its
        # instances; an ended one is history its append-only timeline belongs to.
        return False


@admin.register(DeploymentEvent)
class DeploymentEventAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "deployment",
        "actor_label",
        "kind",
        "from_state",
        "to_state",
        "message",
    ]
    list_filter = ["kind"]
    search_fields = ["message", "actor_label"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["name", "deployment", "version", "launcher", "state", "last_health_at"]
    list_filter = ["state", "launcher"]
    search_fields = ["name", "deployment__model__slug"]
    readonly_fields = [f.name for f in Instance._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


class CallerKeyForm(forms.ModelForm):
    """Refuses, next to the field, what :func:`check_key` refuses (another team's model, a limit
    of 0, and, for a new key, an expiry already past: an operator may expire an existing key
    by setting one)."""

    class Meta:
        model = CallerKey
        fields = [
            "team", "name", "models", "expires_at", "requests_per_second", "tokens_per_minute",
        ]  # fmt: skip

    def clean(self):
        super().clean()
        data = self.cleaned_data
        if data.get("team") is None:
            return data
        try:
            check_key(
                team=data["team"],
                models=data.get("models") or (),
                expires_at=data.get("expires_at") if self.instance.pk is None else None,
                requests_per_second=data.get("requests_per_second"),
                tokens_per_minute=data.get("tokens_per_minute"),
            )
        except CallerKeyError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return data


# Registered here, not beside ApiTokenAdmin: keys go through .caller_keys, which the accounts app
# sits below (pyproject.toml's import contracts).
@admin.register(CallerKey)
class CallerKeyAdmin(admin.ModelAdmin):
    """Caller keys are created here by an operator; the plaintext is shown once, in the message.
    Every change is published to the gateways once saved."""

    form = CallerKeyForm
    list_display = [
        "name", "team", "prefix", "scope", "expires_at", "revoked_at", "limits", "created_at",
    ]  # fmt: skip
    list_filter = ["team", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "team__slug"]
    readonly_fields = ["prefix", "created_by", "created_at", "revoked_at"]
    fields = [*CallerKeyForm.Meta.fields, *readonly_fields]
    filter_horizontal = ["models"]
    actions = ["revoke"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("team").prefetch_related("models")

    @admin.display(description="models")
    def scope(self, key: CallerKey) -> str:
        return ", ".join(sorted(m.slug for m in key.models.all())) or "all"

    @admin.display(description="limits")
    def limits(self, key: CallerKey) -> str:
        parts = []
        if key.requests_per_second is not None:
            parts.append(f"{key.requests_per_second:g} req/s")
        if key.tokens_per_minute is not None:
            parts.append(f"{key.tokens_per_minute} tokens/min")
        return ", ".join(parts) or "-"

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        issued = issue_caller_key(  # the form checked what it refuses
            team=obj.team,
            name=obj.name,
            models=form.cleaned_data["models"],
            expires_at=obj.expires_at,
            requests_per_second=obj.requests_per_second,
            tokens_per_minute=obj.tokens_per_minute,
            created_by=request.user,
        )
        obj.pk = issued.key.pk
        obj.refresh_from_db()  # the stored row (prefix, digest), for the messages that follow
        self.message_user(
            request,
            f"Caller key created. Copy it now, it will not be shown again: {issued.plaintext}",
            messages.WARNING,
        )

    def save_related(self, request, form, formsets, change):
        if change:  # a new key's models were set by issue_caller_key
            super().save_related(request, form, formsets, change)
            publish_after_commit()

    @admin.action(description="Revoke selected caller keys")
    def revoke(self, request, queryset):
        count = revoke_caller_keys(queryset)
        self.message_user(request, f"Revoked {count} caller key(s).")
