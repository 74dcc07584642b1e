"""Caller keys: issued once in plaintext, stored hashed, scoped to a team's models, and published
whole to the gateways (read back here with the gateway's own parser and checker)."""

from __future__ import annotations

import hashlib
import io
import json
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from portal.accounts.models import CallerKey
from portal.deployments.tasks import publish_caller_keys, redrive_deployments
from portal.deployments.traffic import caller_keys as ck
from serving.gateway import keys as gateway_keys
from tests.factories import make_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def models(team):
    return [make_model(team, "ranker"), make_model(team, "summarizer")]


def published(redis_client) -> gateway_keys.KeyTable:
    raw = redis_client.get(f"{settings.GATEWAY_REDIS_PREFIX}:keys")
    assert raw is not None, "no key set published"
    return gateway_keys.parse(raw)


def test_only_a_digest_is_stored_and_the_plaintext_has_the_gateways_format(team, member):
    issued = ck.issue_caller_key(team=team, name="app", created_by=member)
    stored = CallerKey.objects.get(pk=issued.key.pk)
    assert issued.plaintext.startswith(f"mlk_{stored.prefix}_")
    assert len(stored.prefix) == 8 and int(stored.prefix, 16) >= 0
    assert gateway_keys.split_key(issued.plaintext) == stored.prefix
    assert stored.digest == hashlib.sha256(issued.plaintext.encode()).hexdigest()
    assert issued.plaintext not in str(CallerKey.objects.values().get(pk=stored.pk))
    assert (stored.team, stored.created_by, list(stored.models.all())) == (team, member, [])


def test_a_key_cannot_name_another_teams_model(team, other_team):
    theirs = make_model(other_team, "ads-ranker")
    with pytest.raises(ck.CallerKeyError, match="only call its own models") as caught:
        ck.issue_caller_key(team=team, name="app", models=[theirs])
    assert isinstance(caught.value, ValueError) and caught.value.field == "models"
    assert not CallerKey.objects.exists()


def test_model_slugs_resolve_only_among_the_teams_models(team, other_team, models):
    make_model(other_team, "ads-ranker")
    assert ck.team_models(team, ["summarizer", "ranker"]) == [models[1], models[0]]
    with pytest.raises(ck.CallerKeyError, match="no model 'ads-ranker'"):
        ck.team_models(team, ["ranker", "ads-ranker"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("requests_per_second", 0.0), ("tokens_per_minute", 0), ("expires_at", "past")],
)
def test_limits_and_expiry_must_make_sense(team, field, value):
    if value == "past":
        value = timezone.now() - timedelta(minutes=1)
    with pytest.raises(ck.CallerKeyError) as caught:
        ck.issue_caller_key(team=team, name="app", **{field: value})
    assert caught.value.field == field


def test_publish_writes_exactly_the_active_keys_and_the_teams_limits(
    team, other_team, models, clean_redis
):
    team.requests_per_second, team.tokens_per_minute = 50.0, 100_000
    team.save()
    expires = timezone.now() + timedelta(days=30)
    scoped = ck.issue_caller_key(
        team=team,
        name="scoped",
        models=models,
        expires_at=expires,
        requests_per_second=2.5,
        tokens_per_minute=6000,
    )
    everything = ck.issue_caller_key(team=other_team, name="all")
    revoked = ck.issue_caller_key(team=team, name="gone")
    ck.revoke_caller_keys(CallerKey.objects.filter(pk=revoked.key.pk))
    expired = ck.issue_caller_key(team=team, name="old")
    CallerKey.objects.filter(pk=expired.key.pk).update(expires_at=timezone.now())

    generation = ck.publish_caller_keys()

    prefix = settings.GATEWAY_REDIS_PREFIX
    assert clean_redis.get(f"{prefix}:keys").decode() == gateway_keys.document(
        [
            gateway_keys.KeyEntry(
                prefix=scoped.key.prefix,
                digest=scoped.key.digest,
                team="search",
                models=("ranker", "summarizer"),
                expires_at=expires.timestamp(),
                limits=gateway_keys.Limits(2.5, 6000),
            ),
            gateway_keys.KeyEntry(
                prefix=everything.key.prefix, digest=everything.key.digest, team="ads"
            ),
        ],
        {"search": gateway_keys.Limits(50.0, 100_000)},
    )
    assert int(clean_redis.get(f"{prefix}:keys:generation")) == generation
    assert ck.publish_caller_keys() == generation + 1

    # What the gateway makes of it: each plaintext calls what it is scoped to, and only that.
    table = published(clean_redis)
    caller = table.authenticate(scoped.plaintext, "search/ranker")
    assert caller.team_limits == gateway_keys.Limits(50.0, 100_000)
    assert table.authenticate(everything.plaintext, "ads/anything/versions/2").key.models is None
    with pytest.raises(gateway_keys.Refused) as refused:
        table.authenticate(scoped.plaintext, "search/other")
    assert refused.value.status == 403
    for gone in (revoked, expired):
        with pytest.raises(gateway_keys.Refused) as refused:
            table.authenticate(gone.plaintext, "search/ranker")
        assert refused.value.status == 401


def test_issuing_and_revoking_publish_once_committed(
    team, clean_redis, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        issued = ck.issue_caller_key(team=team, name="app")
    assert published(clean_redis).authenticate(issued.plaintext, "search/ranker")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert ck.revoke_caller_keys(CallerKey.objects.filter(team=team)) == 1
    assert len(callbacks) == 1
    assert published(clean_redis).keys == {}
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert ck.revoke_caller_keys(CallerKey.objects.filter(team=team)) == 0
    assert callbacks == []  # nothing changed, nothing to publish


def test_a_team_edited_publishes_its_limits(team, clean_redis, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        team.tokens_per_minute = 1000
        team.save()
    assert published(clean_redis).teams == {"search": gateway_keys.Limits(None, 1000)}
    with django_capture_on_commit_callbacks(execute=True):
        team.tokens_per_minute = None
        team.save()
    assert published(clean_redis).teams == {}


def test_deleting_a_keys_only_model_revokes_the_key_rather_than_widening_it(
    team, models, django_capture_on_commit_callbacks, clean_redis
):
    alone = ck.issue_caller_key(team=team, name="alone", models=[models[0]])
    both = ck.issue_caller_key(team=team, name="both", models=models)
    with django_capture_on_commit_callbacks(execute=True):
        models[0].delete()
    alone.key.refresh_from_db()
    assert alone.key.revoked_at is not None
    assert [m.slug for m in both.key.models.all()] == ["summarizer"]
    table = published(clean_redis)
    assert set(table.keys) == {both.key.prefix}
    assert table.keys[both.key.prefix].models == ("summarizer",)


def test_beat_publishes_and_redrive_restores_a_key_set_redis_lost(team, clean_redis):
    issued = ck.issue_caller_key(team=team, name="app")
    publish_caller_keys()
    assert published(clean_redis).authenticate(issued.plaintext, "search/ranker")

    clean_redis.flushdb()  # Redis restarted without its data
    redrive_deployments()
    assert published(clean_redis).authenticate(issued.plaintext, "search/ranker")

    generation = clean_redis.get(f"{settings.GATEWAY_REDIS_PREFIX}:keys:generation")
    redrive_deployments()  # the set is there: nothing published again
    assert clean_redis.get(f"{settings.GATEWAY_REDIS_PREFIX}:keys:generation") == generation


def test_last_used_reads_what_the_gateways_record(team, clean_redis):
    used = ck.issue_caller_key(team=team, name="used").key
    unused = ck.issue_caller_key(team=team, name="unused").key
    at = time.time() - 30
    clean_redis.hset(f"{settings.GATEWAY_REDIS_PREFIX}:key_last_used", used.prefix, json.dumps(at))

    seen = ck.last_used([used, unused])

    assert list(seen) == [used.prefix]
    assert abs(seen[used.prefix].timestamp() - at) < 1e-3
    assert seen[used.prefix].tzinfo is not None
    assert ck.last_used([]) == {}


def test_bootstrap_demo_saves_a_caller_key_once_and_replaces_one_revoked(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    first, second, third = io.StringIO(), io.StringIO(), io.StringIO()
    call_command("bootstrap_demo", "--no-demo-model", stdout=first)
    saved = tmp_path / "demo-caller-key"
    plaintext = saved.read_text().strip()
    assert f"Key:    {plaintext}" in first.getvalue()
    assert saved.stat().st_mode & 0o777 == 0o600
    key = CallerKey.objects.get(prefix=gateway_keys.split_key(plaintext))
    assert (key.team.slug, list(key.models.all()), key.is_active) == ("demo", [], True)
    assert key.digest == gateway_keys.digest(plaintext)

    call_command("bootstrap_demo", "--no-demo-model", stdout=second)
    assert plaintext not in second.getvalue()  # shown once only, and kept
    assert saved.read_text().strip() == plaintext and CallerKey.objects.count() == 1

    ck.revoke_caller_keys(CallerKey.objects.all())
    call_command("bootstrap_demo", "--no-demo-model", stdout=third)
    replaced = saved.read_text().strip()
    assert replaced != plaintext and f"Key:    {replaced}" in third.getvalue()
    assert CallerKey.objects.get(prefix=gateway_keys.split_key(replaced)).is_active
