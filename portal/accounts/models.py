"""Teams own models; people and API tokens act on a team's behalf with a role."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db import models as django_models  # CallerKey.models shadows the module
from django.utils import timezone


class Role(models.TextChoices):
    """What a member may do within one team."""

    MEMBER = "member", "Member (can register and deploy)"
    VIEWER = "viewer", "Viewer (read only)"


class Team(models.Model):
    """A group of model authors. Every model, version and deployment belongs to exactly one team,
    and the API never shows one team's objects to another."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="teams"
    )
    #: Quotas operators set in the admin, checked when a deploy or a scale is asked for
    #: (:mod:`portal.deployments.quotas`); blank means no limit.
    max_live_deployments = models.PositiveIntegerField(
        null=True, blank=True, help_text="Live deployments at once; blank for no limit."
    )
    max_instances = models.PositiveIntegerField(
        null=True, blank=True, help_text="Replicas over all live deployments; blank for no limit."
    )
    max_gpus = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GPUs over all live deployments (replicas times the instance type's GPUs); blank "
        "for no limit.",
    )
    #: Rate limits operators set in the admin, over all of the team's caller keys together,
    #: enforced by every gateway (:mod:`serving.gateway.ratelimit`); blank means no limit.
    requests_per_second = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="Requests per second to the team's models, over all its caller keys; blank for "
        "no limit.",
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens per minute (prompt estimated, plus max_tokens) over all the team's caller "
        "keys; blank for no limit.",
    )

    class Meta:
        ordering = ["slug"]
        constraints = [
            # The gateways refuse a published key set with a limit of 0 (keys.Limits).
            models.CheckConstraint(
                condition=models.Q(requests_per_second__gt=0), name="team_rps_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiToken(models.Model):
    """A bearer token for CI pipelines, scoped to one team with one role.

    Only a SHA-256 digest of the token is stored: the plaintext is shown once, at creation.
    The short ``prefix`` is stored in clear so a token can be found and recognised in lists.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        now = timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


class CallerKey(models.Model):
    """A key that callers of the team's deployed models present at the gateway (``mlk_…``).

    Not an :class:`ApiToken`: a caller key cannot act on the portal, and a CI token cannot call
    a model. As with tokens only the SHA-256 digest is stored and the plaintext is shown once;
    the portal publishes the digests of the active keys to the gateways
    (:mod:`portal.deployments.traffic.caller_keys`), which check them without asking the database.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="caller_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    requests_per_second = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="Requests per second with this key; blank for no limit (the team's still applies).",
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Tokens per minute with this key; blank for no limit (the team's still applies).",
    )
    # Last: the name shadows django.db.models in the rest of the class body. A string reference,
    # since accounts sits below the registry (pyproject.toml's import contracts).
    models = models.ManyToManyField(
        "registry.Model",
        blank=True,
        related_name="caller_keys",
        help_text="The team's models it may call; none selected for all of them.",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # The gateways refuse a published key set with a limit of 0 (keys.Limits).
            django_models.CheckConstraint(
                condition=django_models.Q(requests_per_second__gt=0),
                name="caller_key_rps_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()
