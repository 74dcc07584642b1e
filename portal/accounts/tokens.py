"""Issuing, checking and revoking API tokens.

Tokens look like ``mlp_<prefix>_<secret>``. They carry 256 bits of randomness, so a plain
SHA-256 digest is enough to store them (a slow password hash buys nothing against a random
secret and would cost every API call).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from portal.accounts.models import ApiToken, Role, Team
from serving.gateway.keys import SCHEME as CALLER_KEY_SCHEME  # named when presented here

TOKEN_SCHEME = "mlp"
#: ``last_used_at`` is written at most this often per token, not on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenError(Exception):
    """The presented token is malformed, unknown, revoked or expired (the message says which)."""


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    plaintext: str


def _digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def issue_token(
    *,
    team: Team,
    name: str,
    role: str = Role.MEMBER,
    created_by=None,
    expires_at: datetime | None = None,
) -> IssuedToken:
    """Create a token and return its plaintext, which is never retrievable again."""
    prefix = secrets.token_hex(4)
    plaintext = f"{TOKEN_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(
        team=team,
        name=name,
        role=role,
        prefix=prefix,
        digest=_digest(plaintext),
        created_by=created_by,
        expires_at=expires_at,
    )
    return IssuedToken(token=token, plaintext=plaintext)


def authenticate_token(plaintext: str) -> ApiToken:
    """Return the active token matching ``plaintext`` or raise :class:`TokenError`."""
    parts = plaintext.split("_", 2)
    if parts[0] == CALLER_KEY_SCHEME:
        raise TokenError(
            "This is a caller key (mlk_...), for calling models at the gateway; the portal's API "
            "takes a team API token (mlp_...)."
        )
    if len(parts) != 3 or parts[0] != TOKEN_SCHEME or not parts[1]:
        raise TokenError("Malformed API token.")
    token = ApiToken.objects.select_related("team").filter(prefix=parts[1]).first()
    if token is None or not hmac.compare_digest(token.digest, _digest(plaintext)):
        raise TokenError("Invalid API token.")
    now = timezone.now()
    if token.revoked_at is not None:
        raise TokenError("API token has been revoked.")
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenError("API token has expired.")
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def revoke_tokens(tokens) -> int:
    """Revoke every not-yet-revoked token in ``tokens`` (a queryset); return how many."""
    with transaction.atomic():
        return tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
