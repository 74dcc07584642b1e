from django.contrib import admin, messages

from portal.accounts.models import ApiToken, Membership, Team
from portal.accounts.tokens import issue_token, revoke_tokens


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = [
        "slug", "name", "member_count", "max_live_deployments", "max_instances", "max_gpus",
        "requests_per_second", "tokens_per_minute", "created_at",
    ]  # fmt: skip
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    fieldsets = [
        (None, {"fields": ["slug", "name"]}),
        (
            "Quotas",
            {
                "fields": ["max_live_deployments", "max_instances", "max_gpus"],
                "description": "Checked when a deploy or a scale is asked for; blank for no "
                "limit. During a Red-Black rollout a stage may run more instances than the "
                "replicas these count.",
            },
        ),
        (
            "Rate limits",
            {
                "fields": ["requests_per_second", "tokens_per_minute"],
                "description": "Enforced by the gateways over all the team's caller keys "
                "together (each key may have its own too); blank for no limit. Saving publishes "
                "them to the gateways (portal.deployments.traffic.caller_keys.team_saved).",
            },
        ),
    ]
    inlines = [MembershipInline]

    @admin.display(description="members")
    def member_count(self, team: Team) -> int:
        return team.memberships.count()


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__slug"]
    autocomplete_fields = ["user", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created here by an operator; the plaintext is shown once, in the message."""

    list_display = [
        "name",
        "team",
        "role",
        "prefix",
        "status",
        "created_at",
        "expires_at",
        "last_used_at",
    ]
    list_filter = ["role", "team", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "team__slug"]
    readonly_fields = ["prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
    fields = ["team", "name", "role", "expires_at", *readonly_fields]
    actions = ["revoke"]

    @admin.display(description="status")
    def status(self, token: ApiToken) -> str:
        if token.revoked_at:
            return "revoked"
        return "active" if token.is_active else "expired"

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        issued = issue_token(
            team=obj.team,
            name=obj.name,
            role=obj.role,
            created_by=request.user,
            expires_at=obj.expires_at,
        )
        obj.pk = issued.token.pk
        obj.refresh_from_db()  # the stored row (prefix, digest), for the messages that follow
        self.message_user(
            request,
            f"Token created. Copy it now, it will not be shown again: {issued.plaintext}",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        count = revoke_tokens(queryset)
        self.message_user(request, f"Revoked {count} token(s).")
