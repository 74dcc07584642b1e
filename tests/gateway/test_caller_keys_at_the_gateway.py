"""Caller keys from the portal to a real gateway: issued, scoped, limited and revoked through
the service the pages and API use, in force at the gateway without it ever reading the
database."""

from __future__ import annotations

import time

import httpx
import pytest
from django.conf import settings

from portal.deployments.tasks import redrive_deployments
from portal.deployments.traffic import caller_keys
from serving.gateway.table import Group
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import start_gateway, wait_for
from tests.factories import make_model
from tests.gateway.test_gateway import publish, route

pytestmark = pytest.mark.django_db(transaction=True)  # keys publish once their commit happens


@pytest.fixture
def gateway(clean_redis):
    proc, url = start_gateway(settings.REDIS_URL)
    yield url
    stop_process_group(proc)


def status(url: str, path: str, key: str, **body) -> int:
    answer = httpx.post(
        f"{url}/models/{path}/v1/completions",
        json=body or {"prompt": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    return answer.status_code


def test_a_key_issued_and_revoked_in_the_portal_is_in_force_at_the_gateway(
    team, other_team, gateway, backends, redis_client
):
    url = gateway
    make_model(team, "summarizer")
    ranker = make_model(team, "ranker")
    b = backends("b")
    publish(
        redis_client,
        url,
        route(f"{team.slug}/ranker", Group("v1", 100, [b])),
        route(f"{team.slug}/summarizer", Group("v1", 100, [b])),
        route(f"{other_team.slug}/ranker", Group("v1", 100, [b])),
    )
    everything = caller_keys.issue_caller_key(team=team, name="all").plaintext
    only_ranker = caller_keys.issue_caller_key(team=team, name="one", models=[ranker]).plaintext
    wait_for(lambda: status(url, f"{team.slug}/ranker", everything) == 200, 5, "the new keys")
    assert status(url, f"{team.slug}/summarizer", everything) == 200
    assert status(url, f"{team.slug}/ranker", only_ranker) == 200
    assert status(url, f"{team.slug}/summarizer", only_ranker) == 403
    assert status(url, f"{other_team.slug}/ranker", everything) == 403

    caller_keys.revoke_caller_keys(team.caller_keys.filter(name="all"))
    revoked = time.monotonic()
    wait_for(
        lambda: all(status(url, f"{team.slug}/ranker", everything) == 401 for _ in range(4)),
        5,
        "the revocation at the gateway",
        interval=0.05,
    )
    assert time.monotonic() - revoked < 2
    assert status(url, f"{team.slug}/ranker", only_ranker) == 200  # the other key still works

    # An operator sets the team's limit in the admin (a Team save): it reaches the gateway too.
    team.tokens_per_minute = 300
    team.save()
    wait_for(
        lambda: status(url, f"{team.slug}/ranker", only_ranker, prompt="hi", max_tokens=250) == 429,
        5,
        "the team's limit",
    )

    # Redis loses everything: the gateway keeps its keys, and beat's re-drive publishes them
    # again from the database.
    redis_client.flushdb()
    assert status(url, f"{team.slug}/ranker", only_ranker, max_tokens=1) == 200
    redrive_deployments()
    assert redis_client.exists(f"{settings.GATEWAY_REDIS_PREFIX}:keys")
