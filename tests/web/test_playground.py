"""The deployment page's playground: its panel, the temporary key, and tries sent through a real
gateway process (with the caller keys the portal publishes) to a stand-in instance."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings
from django.urls import reverse

from portal.accounts.models import CallerKey
from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import ObservedState
from portal.deployments.traffic.caller_keys import publish_caller_keys
from serving.gateway import table
from serving.gateway.table import Group, RouteEntry
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import start_gateway, wait_for
from tests.factories import TAGGER_IO, make_deployment, make_python_version
from tests.gateway.conftest import backends  # noqa: F401  (a fixture)
from tests.web.test_pages import page_html, signed_in

pytestmark = pytest.mark.django_db(transaction=True)


def send_url(deployment) -> str:
    return reverse("web:playground_send", args=[deployment.model.team.slug, deployment.pk])


def key_url(deployment) -> str:
    return reverse("web:playground_key", args=[deployment.model.team.slug, deployment.pk])


def post(client, url: str, body: dict | str):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json")


def serving(deployment):
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="starting")
    transition_deployment(
        deployment,
        ObservedState.SERVING,
        reason="serving",
        traffic={deployment.target_version.number: 100},
    )
    return deployment


def test_the_panel_offers_chat_for_an_openai_version(member, team, deployment):
    html = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    assert 'data-testid="playground"' in html and 'data-kind="chat"' in html
    assert 'id="pg-message"' in html and "pg-mint" in html


def test_a_viewer_can_try_but_not_mint_keys(viewer, team, deployment):
    html = page_html(viewer, "web:deployment_detail", team.slug, deployment.pk)
    assert 'data-testid="playground"' in html and "pg-mint" not in html
    assert post(signed_in(viewer), key_url(deployment), {}).status_code == 403


def test_the_infer_form_starts_from_the_io_spec(
    member, team, model, release, artifact_root, cpu_instance_type
):
    version = make_python_version(model, artifact_root, {**TAGGER_IO, "max_batch_size": 8})
    deployment = make_deployment(model, version, cpu_instance_type)
    html = page_html(member, "web:deployment_detail", team.slug, deployment.pk)
    assert 'data-kind="infer"' in html
    sample = json.loads(
        html.split('id="pg-request" rows="8" spellcheck="false">')[1]
        .split("</textarea>")[0]
        .replace("&quot;", '"')
    )
    assert sample == {
        "inputs": [
            {
                "name": "TEXT",
                "shape": [1, 1],
                "datatype": "BYTES",
                "data": ["Hello from the playground"],
            }
        ]
    }


def test_a_temporary_key_is_scoped_to_the_model_and_expires_in_an_hour(member, deployment):
    answer = post(signed_in(member), key_url(deployment), {})
    assert answer.status_code == 201
    key = CallerKey.objects.get()
    assert answer.json()["key"].startswith(f"mlk_{key.prefix}_")
    assert [m.pk for m in key.models.all()] == [deployment.model.pk]
    assert key.name == "playground · mia"
    lifetime = (key.expires_at - key.created_at).total_seconds()
    assert 3590 < lifetime <= 3600


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ("{not json", 400, "Not a JSON request"),
        ("[1, 2]", 400, "Not a JSON object"),
        ({"message": "hi"}, 400, "Give a caller key"),
        ({"key": "mlk_x", "message": "  "}, 400, "Write a message"),
        ({"key": "mlk_x", "message": "hi", "max_tokens": 999}, 400, "Max tokens"),
        ("[" * 100 + "]" * 100, 400, "nests deeper"),
    ],
)
def test_a_bad_try_is_explained(member, deployment, body, status, error):
    serving(deployment)
    answer = post(signed_in(member), send_url(deployment), body)
    assert answer.status_code == status
    assert error in answer.json()["error"]


def test_nothing_is_sent_before_the_deployment_serves(member, deployment):
    answer = post(signed_in(member), send_url(deployment), {"key": "k", "message": "hi"})
    assert answer.status_code == 409 and "Nothing serves" in answer.json()["error"]


@pytest.fixture
def gateway(clean_redis, settings):
    proc, url = start_gateway(settings.REDIS_URL)
    settings.GATEWAY_URL = url
    yield url
    stop_process_group(proc)


def test_a_try_goes_through_the_gateway_with_the_key(
    member,
    deployment,
    gateway,
    backends,  # noqa: F811
):
    serving(deployment)
    client = redis.Redis.from_url(settings.REDIS_URL)
    table.publish(client, [RouteEntry("search/ranker", [Group("v1", 100, [backends("v1")])])])
    browser = signed_in(member)
    key = post(browser, key_url(deployment), {}).json()["key"]
    publish_caller_keys()  # what the commit hook does, done here without waiting

    def answered():
        answer = post(browser, send_url(deployment), {"key": key, "message": "hi"}).json()
        return answer if answer["status"] == 200 else None

    answer = wait_for(answered, 10, "the gateway to take the key")
    echoed = answer["body"]
    assert echoed["path"] == "/v1/chat/completions"
    assert echoed["auth"] == ""  # the gateway keeps the key
    sent = json.loads(echoed["body"])
    assert sent == {
        "model": "search--ranker",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 32,
    }
    # A wrong key is the gateway's 401, passed on as it came.
    wrong = post(browser, send_url(deployment), {"key": "mlk_00000000_nope", "message": "hi"})
    assert wrong.status_code == 200 and wrong.json()["status"] == 401
