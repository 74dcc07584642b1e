"""``Authorization: Bearer mlp_...`` authentication with team API tokens."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from portal.accounts.tokens import TokenError, authenticate_token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        credentials = credentials.strip()
        if not credentials or " " in credentials:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: use 'Bearer <token>'."
            )
        try:
            token = authenticate_token(credentials)
        except TokenError as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from exc
        # A token acts for its team, not as the person who made it; views read ``request.auth``.
        user = token.created_by if token.created_by is not None else AnonymousUser()
        return (TokenUser(user), token)

    def authenticate_header(self, request) -> str:
        return f'{self.keyword} realm="api"'


class TokenUser:
    """Wraps the token creator so DRF's ``IsAuthenticated`` passes even when the creator is gone,
    while nothing can use the token to act with that person's own memberships."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    is_staff = False

    def __init__(self, creator):
        self.creator = creator

    def get_username(self) -> str:
        return getattr(self.creator, "username", "") or "token"

    @property
    def pk(self):
        return None


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "A team API token (mlp_...)."}
