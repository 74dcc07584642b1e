"""Caller keys: issuing, revoking, and publishing the active ones to the gateways.

A caller key (``mlk_<prefix>_<secret>``) lets a program call a team's deployed models at the
gateway, all of them or a chosen few, and nothing else; the portal's CI tokens
(:mod:`portal.accounts.tokens`) act on the portal and call no model. Only a SHA-256 digest is
stored, the plaintext is shown once.

The gateways never ask the database: :func:`publish_caller_keys` writes the whole set of
active keys, and the teams' limits, to Redis (:mod:`serving.gateway.keys`) after every change
is committed, and each gateway swaps the new set in within about a second. The whole set is
rebuilt from the database each time (about 250 bytes a key: 1,000 keys are 250 kB), so a
publication that failed or was lost is simply replaced by the next one: beat publishes every
minute, and ``redrive_deployments`` every few seconds when Redis lost the set (a restart
without persistence), so gateways do not refuse every caller for long.

Team limits are set by operators in the admin; a Team saved there publishes through the
``post_save`` hook :func:`team_saved`, and a key or a model deleted through :func:`key_deleted`
and :func:`model_deleted` (connected in ``DeploymentsConfig.ready``: the accounts app sits below
this one and cannot call it). Keys themselves are changed through this module or the admin
(``CallerKeyAdmin``, in this app's admin for the same reason), which publish explicitly.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from portal.accounts.models import CallerKey, Team
from portal.core.errors import ApplicationError
from portal.core.redis_clients import redis_client
from portal.deployments.models import gateway_prefixes
from portal.registry.models import Model
from serving.gateway import keys as gateway_keys

log = logging.getLogger(__name__)

PUBLISH_LOCK = "caller_keys:publish"
PUBLISH_LOCK_SECONDS = 30


class CallerKeyError(ApplicationError, ValueError):
    """A key that cannot be issued as asked; ``field`` names the input at fault."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class IssuedCallerKey:
    key: CallerKey
    plaintext: str


def team_models(team: Team, slugs: Iterable[str]) -> list[Model]:
    """The team's models named by ``slugs``; a slug that names none of them is refused (another
    team's model reads as unknown, as everywhere in the API)."""
    wanted = list(dict.fromkeys(slugs))
    found = {m.slug: m for m in Model.objects.filter(team=team, slug__in=wanted)}
    missing = [slug for slug in wanted if slug not in found]
    if missing:
        raise CallerKeyError(
            f"Team {team.slug} has no model {', '.join(repr(s) for s in missing)}.",
            field="models",
        )
    return [found[slug] for slug in wanted]


def check_key(
    *,
    team: Team,
    models: Iterable[Model] = (),
    expires_at: datetime | None = None,
    requests_per_second: float | None = None,
    tokens_per_minute: int | None = None,
) -> None:
    """Refuse (:class:`CallerKeyError`) a key that could not work as asked: scoped to another
    team's model, with a limit no request could pass, or already expired."""
    chosen = list(models)
    foreign = sorted(str(m) for m in chosen if m.team_id != team.pk)
    if foreign:
        raise CallerKeyError(
            f"A key of team {team.slug} can only call its own models, not {', '.join(foreign)}.",
            field="models",
        )
    if requests_per_second is not None and not requests_per_second > 0:
        raise CallerKeyError(
            "Requests per second must be above 0 (blank for no limit).",
            field="requests_per_second",
        )
    if tokens_per_minute is not None and tokens_per_minute < 1:
        raise CallerKeyError(
            "Tokens per minute must be at least 1 (blank for no limit).", field="tokens_per_minute"
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise CallerKeyError("The expiry is already past.", field="expires_at")


def issue_caller_key(
    *,
    team: Team,
    name: str,
    models: Iterable[Model] | None = None,
    expires_at: datetime | None = None,
    requests_per_second: float | None = None,
    tokens_per_minute: int | None = None,
    created_by=None,
) -> IssuedCallerKey:
    """Create a key for ``team``'s ``models`` (None or empty: all of them) and return its
    plaintext, which is never retrievable again. Gateways accept it once the transaction
    commits and the set is published."""
    chosen = list(models or [])
    check_key(
        team=team,
        models=chosen,
        expires_at=expires_at,
        requests_per_second=requests_per_second,
        tokens_per_minute=tokens_per_minute,
    )
    prefix = secrets.token_hex(4)
    plaintext = f"{gateway_keys.SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        key = CallerKey.objects.create(
            team=team,
            name=name,
            prefix=prefix,
            digest=gateway_keys.digest(plaintext),
            expires_at=expires_at,
            requests_per_second=requests_per_second,
            tokens_per_minute=tokens_per_minute,
            created_by=created_by,
        )
        key.models.set(chosen)
        publish_after_commit()
    return IssuedCallerKey(key=key, plaintext=plaintext)


def revoke_caller_keys(queryset: QuerySet[CallerKey]) -> int:
    """Revoke every not-yet-revoked key in ``queryset``; return how many. Gateways refuse them
    once the set without them is published, about a second after the commit."""
    with transaction.atomic():
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        if count:
            publish_after_commit()
    return count


def publish_after_commit() -> None:
    """Publish once the current transaction commits (at once outside one). A failure is logged,
    not raised: the change is stored, and beat publishes it within a minute."""
    transaction.on_commit(publish_caller_keys, robust=True)


def active_entries() -> list[gateway_keys.KeyEntry]:
    """Every key a gateway should accept, as it knows them. Expired ones are left out (the
    gateway would refuse them anyway by their time)."""
    now = timezone.now()
    active = (
        CallerKey.objects.filter(revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .select_related("team")
        .prefetch_related("models")
        .order_by("prefix")
    )
    return [
        gateway_keys.KeyEntry(
            prefix=key.prefix,
            digest=key.digest,
            team=key.team.slug,
            models=tuple(sorted(m.slug for m in key.models.all())) or None,
            expires_at=key.expires_at.timestamp() if key.expires_at is not None else None,
            limits=gateway_keys.Limits(key.requests_per_second, key.tokens_per_minute),
        )
        for key in active
    ]


def team_limits() -> dict[str, gateway_keys.Limits]:
    """The limits of every team that has any, by slug."""
    limited = Team.objects.filter(
        Q(requests_per_second__isnull=False) | Q(tokens_per_minute__isnull=False)
    )
    return {
        team.slug: gateway_keys.Limits(team.requests_per_second, team.tokens_per_minute)
        for team in limited
    }


def keys_key(prefix: str | None = None) -> str:
    return f"{prefix or settings.GATEWAY_REDIS_PREFIX}:keys"


def publish_caller_keys() -> int:
    """Publish the active keys and the teams' limits, built from the database, to every
    region's gateways; return the key set's new generation at the platform's own prefix. The
    lock makes the build and the write one step, so a publication built before a revocation
    can never overwrite one built after it."""
    client = redis_client()
    with client.lock(PUBLISH_LOCK, timeout=PUBLISH_LOCK_SECONDS, blocking_timeout=10):
        text = gateway_keys.document(active_entries(), team_limits())
        generations = [
            gateway_keys.publish(client, text, prefix=prefix) for prefix in gateway_prefixes()
        ]
        return generations[0]


def republish_if_lost() -> bool:
    """Publish when Redis holds no key set for some region's gateways (it restarted without
    its data, or a region was just added): until then they refuse every caller. One
    ``EXISTS`` per region when nothing is missing."""
    prefixes = gateway_prefixes()
    if redis_client().exists(*[keys_key(p) for p in prefixes]) == len(prefixes):
        return False
    publish_caller_keys()
    return True


def last_used(keys: Iterable[CallerKey]) -> dict[str, datetime]:
    """When the gateways last accepted each key, by prefix (keys never used are absent). Read
    from what the gateways record in Redis; for a page, so Redis being away shows nothing rather
    than failing it."""
    prefixes = [key.prefix for key in keys]
    if not prefixes:
        return {}
    latest: dict[str, float] = {}
    try:
        for gateways in gateway_prefixes():  # each region's gateways record their own
            times = redis_client().hmget(f"{gateways}:key_last_used", prefixes)
            for prefix, at in zip(prefixes, times, strict=True):
                if at is not None:
                    latest[prefix] = max(latest.get(prefix, 0.0), float(at))
    except RedisError:
        log.warning("could not read the caller keys' last use from Redis", exc_info=True)
        return {}
    return {prefix: datetime.fromtimestamp(at, tz=UTC) for prefix, at in latest.items()}


# --- Signal receivers (connected in DeploymentsConfig.ready) -----------------------------------


def team_saved(sender, instance: Team, created: bool, **kwargs) -> None:
    """A team edited (its limits or its slug may have changed) publishes; a new team does only
    when it starts with limits, so creating teams costs no publication."""
    if (
        not created
        or instance.requests_per_second is not None
        or instance.tokens_per_minute is not None
    ):
        publish_after_commit()


def model_deleted(sender, instance: Model, **kwargs) -> None:
    """A model going away takes itself out of the keys scoped to it. A key scoped to it alone
    would be left with no models, which means all of the team's: it is revoked instead."""
    scoped = list(CallerKey.objects.filter(models=instance).values_list("pk", flat=True))
    if not scoped:
        return
    alone = CallerKey.objects.filter(pk__in=scoped).annotate(scope=Count("models")).filter(scope=1)
    revoke_caller_keys(CallerKey.objects.filter(pk__in=list(alone.values_list("pk", flat=True))))
    publish_after_commit()


def key_deleted(sender, instance: CallerKey, **kwargs) -> None:
    """A key deleted outright (in the admin, or with its team) is no longer published."""
    publish_after_commit()
