"""API tokens: shown once, stored hashed, revocable, expiring."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from portal.accounts.models import ApiToken, Role, Team
from portal.accounts.tokens import (
    TokenError,
    authenticate_token,
    issue_token,
    revoke_tokens,
)
from portal.deployments.models import Region

pytestmark = pytest.mark.django_db


def test_only_a_digest_is_stored(team):
    issued = issue_token(team=team, name="ci")
    stored = ApiToken.objects.get(pk=issued.token.pk)
    assert issued.plaintext.startswith(f"mlp_{stored.prefix}_")
    assert stored.digest == hashlib.sha256(issued.plaintext.encode()).hexdigest()
    assert issued.plaintext not in str(ApiToken.objects.values().get(pk=stored.pk))


def test_authenticate_and_last_used(team):
    issued = issue_token(team=team, name="ci", role=Role.VIEWER)
    token = authenticate_token(issued.plaintext)
    assert (token.pk, token.role) == (issued.token.pk, Role.VIEWER)
    first_use = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first_use is not None
    authenticate_token(issued.plaintext)  # within a minute: not written again
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first_use


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda t: "", "Malformed"),
        (lambda t: "Bearer", "Malformed"),
        (lambda t: t.replace("mlp_", "xyz_"), "Malformed"),
        (lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"), "Invalid"),
        (lambda t: "mlp_00000000_" + t.split("_", 2)[2], "Invalid"),
    ],
)
def test_wrong_tokens(team, mangle, message):
    issued = issue_token(team=team, name="ci")
    with pytest.raises(TokenError, match=message):
        authenticate_token(mangle(issued.plaintext))


def test_revoked_and_expired(team):
    revoked = issue_token(team=team, name="a")
    assert revoke_tokens(ApiToken.objects.filter(pk=revoked.token.pk)) == 1
    assert revoke_tokens(ApiToken.objects.filter(pk=revoked.token.pk)) == 0  # already revoked
    with pytest.raises(TokenError, match="revoked"):
        authenticate_token(revoked.plaintext)
    expired = issue_token(team=team, name="b", expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(TokenError, match="expired"):
        authenticate_token(expired.plaintext)
    assert not expired.token.is_active


def test_bootstrap_demo_is_idempotent(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    first, second = io.StringIO(), io.StringIO()
    call_command("bootstrap_demo", stdout=first)
    token_text = (tmp_path / "demo-token").read_text().strip()
    assert f"Token:  {token_text}" in first.getvalue()
    call_command("bootstrap_demo", stdout=second)
    assert token_text not in second.getvalue()  # shown once only
    demo = Team.objects.get(slug="demo")
    assert demo.memberships.get().user.is_superuser
    assert ApiToken.objects.filter(team=demo).count() == 1
    assert authenticate_token(token_text).team == demo


def test_bootstrap_demo_makes_local_regions_for_dev_regions(settings, tmp_path):
    """``DEV_REGIONS=eu-west ./dev run`` passes ``--region eu-west:8081``: a local region whose
    gateway (started by ./dev on that port) follows its own prefix."""
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    call_command("bootstrap_demo", "--no-demo-model", "--region", "eu-west:8081", stdout=out)
    call_command("bootstrap_demo", "--no-demo-model", "--region", "eu-west:8081", stdout=out)
    region = Region.objects.get(name="eu-west")
    assert region.public_gateway_url == "http://127.0.0.1:8081"
    assert region.gateway_prefix == f"{settings.GATEWAY_REDIS_PREFIX}.eu-west"
    assert "Region: eu-west, gateway on http://127.0.0.1:8081" in out.getvalue()
    with pytest.raises(CommandError, match="NAME:PORT"):
        call_command("bootstrap_demo", "--no-demo-model", "--region", "eu-west")
