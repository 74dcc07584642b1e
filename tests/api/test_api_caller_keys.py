"""Caller keys through the API: the plaintext once, scoping by team and role, refused input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.accounts.models import CallerKey, Role
from portal.accounts.tokens import issue_token
from portal.deployments.traffic.caller_keys import issue_caller_key
from serving.gateway import keys as gateway_keys
from tests.api.helpers import api_error, ok
from tests.factories import make_model

pytestmark = pytest.mark.django_db

KEYS = "/api/v1/caller-keys/"


@pytest.fixture
def models(team):
    return [make_model(team, "ranker"), make_model(team, "summarizer")]


def test_create_answers_the_plaintext_once_and_stores_only_its_digest(api, member, models):
    expires = timezone.now() + timedelta(days=7)
    created = ok(
        api(member).post(
            KEYS,
            {
                "name": "search-app",
                "models": ["summarizer"],
                "expires_at": expires.isoformat(),
                "requests_per_second": 5,
                "tokens_per_minute": 20000,
            },
            format="json",
        ),
        201,
    )
    key = CallerKey.objects.get(pk=created["id"])
    plaintext = created.pop("key")
    assert plaintext.startswith(f"mlk_{key.prefix}_")
    assert key.digest == gateway_keys.digest(plaintext)
    assert created | {"created_at": None, "expires_at": None} == {
        "id": key.pk,
        "team": "search",
        "name": "search-app",
        "prefix": key.prefix,
        "models": ["summarizer"],
        "expires_at": None,
        "revoked_at": None,
        "active": True,
        "requests_per_second": 5.0,
        "tokens_per_minute": 20000,
        "created_by": "mia",
        "created_at": None,
    }
    assert key.expires_at == expires

    # Never again: not in the list, not in the detail.
    listed = ok(api(member).get(KEYS))
    assert [k["id"] for k in listed["results"]] == [key.pk]
    detail = api(member).get(f"{KEYS}{key.pk}/")
    for body in (listed, ok(detail)):
        assert plaintext not in str(body) and "key" not in body.get("results", [body])[0]


def test_an_api_token_creates_keys_for_its_team_calling_all_its_models(api, team, member):
    token = issue_token(team=team, name="ci", created_by=member).plaintext
    created = ok(api(token).post(KEYS, {"name": "batch"}, format="json"), 201)
    assert (created["team"], created["models"], created["created_by"]) == ("search", [], "mia")
    assert created["key"].startswith("mlk_")


def test_a_model_slug_not_of_the_team_is_a_400_and_creates_nothing(api, member, other_team, models):
    make_model(other_team, "ads-ranker")
    for slugs in (["ads-ranker"], ["ranker", "nope"]):
        error = api_error(
            api(member).post(KEYS, {"name": "x", "models": slugs}, format="json"), 400, "invalid"
        )
        assert "has no model" in " ".join(error["fields"]["models"]), error
    error = api_error(
        api(member).post(
            KEYS,
            {"name": "x", "expires_at": (timezone.now() - timedelta(days=1)).isoformat()},
            format="json",
        ),
        400,
        "invalid",
    )
    assert error["fields"] == {"expires_at": ["The expiry is already past."]}
    for body in ({"name": "x", "requests_per_second": 0}, {"name": "x", "unknown": 1}):
        api_error(api(member).post(KEYS, body, format="json"), 400, "invalid")
    assert not CallerKey.objects.exists()


def test_viewers_read_but_cannot_create_or_revoke(api, team, member, viewer):
    key = issue_caller_key(team=team, name="app").key  # by an operator, say: nobody's
    [listed] = ok(api(viewer).get(KEYS))["results"]
    assert (listed["id"], listed["created_by"]) == (key.pk, None)
    mine = {"team": "search", "name": "mine"}
    api_error(api(viewer).post(KEYS, mine, format="json"), 403, "permission_denied")
    api_error(api(viewer).delete(f"{KEYS}{key.pk}/"), 403, "permission_denied")
    viewer_token = issue_token(team=team, name="dash", role=Role.VIEWER).plaintext
    api_error(api(viewer_token).post(KEYS, mine, format="json"), 403, "permission_denied")
    key.refresh_from_db()
    assert key.revoked_at is None
    assert CallerKey.objects.count() == 1


def test_other_teams_see_nothing_and_cannot_name_the_team(api, team, member, outsider):
    key = issue_caller_key(team=team, name="app", created_by=member).key
    assert ok(api(outsider).get(KEYS))["results"] == []
    api_error(api(outsider).get(f"{KEYS}{key.pk}/"), 404, "not_found")
    api_error(api(outsider).delete(f"{KEYS}{key.pk}/"), 404, "not_found")
    error = api_error(
        api(outsider).post(KEYS, {"team": "search", "name": "sneaky"}, format="json"),
        400,
        "invalid",
    )
    assert error["fields"] == {"team": ["No team 'search'."]}
    key.refresh_from_db()
    assert key.revoked_at is None


def test_delete_revokes_and_keeps_the_key_listed(
    api, team, member, clean_redis, django_capture_on_commit_callbacks
):
    issued = issue_caller_key(team=team, name="app", created_by=member)
    with django_capture_on_commit_callbacks(execute=True):
        revoked = ok(api(member).delete(f"{KEYS}{issued.key.pk}/"))
    assert revoked["active"] is False and revoked["revoked_at"] is not None
    assert ok(api(member).delete(f"{KEYS}{issued.key.pk}/"))["revoked_at"] == revoked["revoked_at"]
    table = gateway_keys.parse(clean_redis.get("gateway:keys"))
    with pytest.raises(gateway_keys.Refused):
        table.authenticate(issued.plaintext, "search/ranker")


def test_a_caller_key_presented_to_the_api_is_refused_saying_what_it_is(api, team):
    plaintext = issue_caller_key(team=team, name="app").plaintext
    error = api_error(api(plaintext).get("/api/v1/models/"), 401, "authentication_failed")
    assert "caller key" in error["message"] and "mlp_" in error["message"]
