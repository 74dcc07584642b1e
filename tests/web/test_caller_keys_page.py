"""The caller keys page: the plaintext once, the list with scope, limits and last use, revoking,
and what viewers and other teams may not do."""

from __future__ import annotations

import re
import time

import pytest
from django.test import Client
from django.urls import reverse

from portal.accounts.models import CallerKey
from portal.deployments.traffic.caller_keys import issue_caller_key
from serving.gateway import keys as gateway_keys
from tests.factories import make_model
from tests.web.test_pages import has_error, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def models(team):
    return [make_model(team, "ranker"), make_model(team, "summarizer")]


def test_a_key_is_shown_once_listed_and_revoked(
    member, team, models, clean_redis, django_capture_on_commit_callbacks
):
    client = signed_in(member)
    url = reverse("web:caller_keys", args=[team.slug])
    with django_capture_on_commit_callbacks(execute=True):
        created = client.post(
            url,
            {
                "name": "search-app",
                "models": [models[1].pk],
                "expires_in_days": 30,
                "requests_per_second": "2.5",
                "tokens_per_minute": "6000",
            },
        )
    assert created.status_code == 201
    page = created.content.decode()
    plaintext = re.search(r"mlk_[0-9a-f]{8}_[\w-]+", page).group(0)
    assert "it is not stored" in page
    key = CallerKey.objects.get(name="search-app")
    assert [m.slug for m in key.models.all()] == ["summarizer"]
    assert (key.requests_per_second, key.tokens_per_minute) == (2.5, 6000)
    assert key.expires_at is not None and key.created_by == member
    table = gateway_keys.parse(clean_redis.get("gateway:keys"))
    assert table.authenticate(plaintext, "search/summarizer").key.prefix == key.prefix

    clean_redis.hset("gateway:key_last_used", key.prefix, time.time())
    listing = client.get(url).content.decode()
    assert plaintext not in listing and f"mlk_{key.prefix}_" in listing
    assert "2.5 req/s, 6000 tokens/min" in listing and "<code>summarizer</code>" in listing
    assert "never" not in listing.split('data-testid="caller-keys"')[1]  # its last use shows

    with django_capture_on_commit_callbacks(execute=True):
        revoked = client.post(reverse("web:caller_key_revoke", args=[team.slug, key.pk]))
    assert revoked.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert gateway_keys.parse(clean_redis.get("gateway:keys")).keys == {}
    assert "badge-failed" in client.get(url).content.decode()


def test_the_form_says_what_is_wrong(member, team, models):
    client = signed_in(member)
    url = reverse("web:caller_keys", args=[team.slug])
    assert has_error(client.post(url, {"name": ""}), "required")
    assert has_error(client.post(url, {"name": "x", "requests_per_second": "0"}), "greater")
    assert has_error(client.post(url, {"name": "x", "models": [999999]}), "valid choice")
    assert not CallerKey.objects.exists()


def test_another_teams_models_are_not_offered_or_accepted(member, team, other_team, models):
    theirs = make_model(other_team, "secret-model")
    client = signed_in(member)
    url = reverse("web:caller_keys", args=[team.slug])
    assert "secret-model" not in client.get(url).content.decode()
    assert has_error(client.post(url, {"name": "x", "models": [theirs.pk]}), "valid choice")
    assert not CallerKey.objects.exists()


def test_viewers_see_keys_but_cannot_create_or_revoke(viewer, member, team):
    key = issue_caller_key(team=team, name="app", created_by=member).key
    client = signed_in(viewer)
    url = reverse("web:caller_keys", args=[team.slug])
    page = client.get(url).content.decode()
    assert f"mlk_{key.prefix}_" in page
    assert "Create a caller key" not in page and "/revoke/" not in page
    assert client.post(url, {"name": "mine"}).status_code == 403
    revoke = reverse("web:caller_key_revoke", args=[team.slug, key.pk])
    assert client.post(revoke).status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None and CallerKey.objects.count() == 1


def test_another_teams_keys_are_out_of_reach(member, team, other_team):
    theirs = issue_caller_key(team=other_team, name="theirs").key
    client = signed_in(member)
    assert client.get(reverse("web:caller_keys", args=[other_team.slug])).status_code == 404
    # Through one's own team's URL, another team's key is not found either.
    client.post(reverse("web:caller_key_revoke", args=[team.slug, theirs.pk]))
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert Client().get(reverse("web:caller_keys", args=[team.slug])).status_code == 302
