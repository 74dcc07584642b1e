"""``Idempotency-Key``: a retried create or action does its work once and replays the answer."""

from __future__ import annotations

import pytest

from portal.accounts.models import Role
from portal.accounts.tokens import issue_token
from portal.core.models import IdempotencyRecord
from tests.api.helpers import row_counts
from tests.factories import make_deployment

pytestmark = pytest.mark.django_db

API = "/api/v1"
KEY = "ci-run-1234"


def post(client, path: str, body, key: str | None = KEY):
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post(f"{API}/{path}", body, format="json", headers=headers)


@pytest.fixture
def calls(team, model, version, cpu_instance_type, artifact_root):
    """name → (path, body, status, rows the first call adds, another body for the same path)."""

    def new_deployment():
        return make_deployment(model, version, cpu_instance_type)

    return {
        "create model": (
            "models/",
            {"slug": "embedder", "task": "embedding"},
            201,
            {"Model": 1},
            {"slug": "other", "task": "embedding"},
        ),
        "create version": (
            "versions/",
            {"model": model.pk, "artifact_uri": f"file://{artifact_root}/w"},
            201,
            {"ModelVersion": 1},
            {"model": model.pk, "artifact_uri": f"file://{artifact_root}/other"},
        ),
        "create deployment": (
            "deployments/",
            {
                "model": model.pk,
                "version": version.pk,
                "strategy": "versioned",
                "instance_type": "cpu-local",
            },
            201,
            {"Deployment": 1, "DeploymentEvent": 1},
            {
                "model": model.pk,
                "version": version.pk,
                "strategy": "versioned",
                "instance_type": "cpu-local",
                "replicas": 2,
            },
        ),
        "pause": (
            lambda: f"deployments/{new_deployment().pk}/pause/",
            {"reason": "look"},
            200,
            {"DeploymentEvent": 1},
            {"reason": "look again"},
        ),
    }


def _resolve(path) -> str:
    return path() if callable(path) else path


CALLS = ["create model", "create version", "create deployment", "pause"]


def _growth(before: dict, after: dict) -> dict:
    return {name: after[name] - before[name] for name in after if after[name] != before[name]}


@pytest.mark.parametrize("name", CALLS)
def test_retry_replays_the_first_answer(api, member_token, calls, name):
    path, body, status, adds, _ = calls[name]
    path = _resolve(path)
    client = api(member_token)
    before = row_counts()
    first = post(client, path, body)
    assert first.status_code == status, first.content
    assert "Idempotent-Replayed" not in first
    assert _growth(before, row_counts()) == {**adds, "IdempotencyRecord": 1}

    after_first = row_counts()
    for _ in range(2):
        retry = post(client, path, body)
        assert retry.status_code == status
        assert retry["Idempotent-Replayed"] == "true"
        assert retry.json() == first.json()
    assert row_counts() == after_first


@pytest.mark.parametrize("name", CALLS)
def test_same_key_with_another_body_is_refused(api, member_token, calls, name):
    path, body, status, _, other_body = calls[name]
    path = _resolve(path)
    client = api(member_token)
    assert post(client, path, body).status_code == status
    before = row_counts()
    response = post(client, path, other_body)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert (
        f"'{KEY}' was already used for a different request (POST /api/v1/{path})"
        in error["message"]
    )
    assert row_counts() == before


def test_same_key_on_another_endpoint_is_refused(api, member_token, deployment):
    client = api(member_token)
    assert post(client, f"deployments/{deployment.pk}/pause/", {}).status_code == 200
    before = row_counts()
    response = post(client, f"deployments/{deployment.pk}/resume/", {})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert row_counts() == before
    deployment.refresh_from_db()
    assert deployment.desired_state == "paused"


def test_without_a_key_every_call_acts(api, member_token, team):
    client = api(member_token)
    first = post(client, "models/", {"slug": "a", "task": "chat"}, key=None)
    assert first.status_code == 201
    second = post(client, "models/", {"slug": "a", "task": "chat"}, key=None)
    assert second.status_code == 400  # the duplicate is really attempted
    assert IdempotencyRecord.objects.count() == 0


def test_different_callers_use_the_same_key_independently(
    api, team, member, member_token, outsider, model
):
    second_token = issue_token(team=team, name="ci-2", role=Role.MEMBER).plaintext
    callers = [member_token, second_token, member, outsider]
    created = []
    for index, who in enumerate(callers):
        response = post(api(who), "models/", {"slug": f"m{index}", "task": "chat"})
        assert response.status_code == 201, response.content
        assert "Idempotent-Replayed" not in response
        created.append(response.json()["id"])
    assert len(set(created)) == len(callers)
    assert IdempotencyRecord.objects.filter(key=KEY).count() == len(callers)
    # Each caller's own retry still replays its own answer.
    replay = post(api(outsider), "models/", {"slug": "m3", "task": "chat"})
    assert (replay["Idempotent-Replayed"], replay.json()["id"]) == ("true", created[3])
    assert replay.json()["team"] == "ads"


@pytest.mark.parametrize(
    ("path", "bad", "good", "status"),
    [
        ("models/", {"slug": "ranker", "task": "chat"}, {"slug": "ranker-2", "task": "chat"}, 400),
        ("models/", {"slug": "x", "task": "poem"}, {"slug": "x", "task": "chat"}, 400),
        (
            "models/",
            {"team": "ads", "slug": "x", "task": "chat"},
            {"slug": "x", "task": "chat"},
            400,
        ),
    ],
    ids=["duplicate-slug", "bad-task", "other-team"],
)
def test_a_failed_call_stores_nothing_so_a_fixed_retry_works(
    api, member_token, model, path, bad, good, status
):
    client = api(member_token)
    before = row_counts()
    failed = post(client, path, bad)
    assert failed.status_code == status, failed.content
    assert row_counts() == before
    fixed = post(client, path, good)
    assert fixed.status_code == 201, fixed.content
    assert "Idempotent-Replayed" not in fixed
    assert post(client, path, good)["Idempotent-Replayed"] == "true"


def test_a_refusal_stores_nothing(api, member_token, model, version, deployment):
    client = api(member_token)
    # Deploying onto the live Red-Black deployment on another instance type is refused.
    body = {
        "model": model.pk,
        "version": version.pk,
        "strategy": "red_black",
        "instance_type": "gpu-a10g-1",
    }
    before = row_counts()
    refused = post(client, "deployments/", body)
    assert refused.status_code == 400, refused.content
    assert row_counts() == before
    # The refused action with a key is not stored either: once allowed, the same key acts.
    assert post(client, f"deployments/{deployment.pk}/resume/", {}).status_code == 409
    assert post(client, f"deployments/{deployment.pk}/pause/", {}, key="k2").status_code == 200
    response = post(client, f"deployments/{deployment.pk}/resume/", {})
    assert response.status_code == 200, response.content
    assert "Idempotent-Replayed" not in response
    deployment.refresh_from_db()
    assert deployment.desired_state == "active"


def test_a_viewer_refusal_stores_nothing(api, viewer_token, model):
    before = row_counts()
    response = post(api(viewer_token), "models/", {"team": "search", "slug": "x", "task": "chat"})
    assert response.status_code == 403
    assert row_counts() == before


@pytest.mark.parametrize(
    "key", ["", "k" * 256, "tab\there"], ids=["empty", "too-long", "unprintable"]
)
def test_malformed_keys_are_refused(api, member_token, team, key):
    before = row_counts()
    response = post(api(member_token), "models/", {"slug": "x", "task": "chat"}, key=key)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["message"]) == (
        "invalid",
        "Idempotency-Key must be 1 to 255 printable characters.",
    )
    assert row_counts() == before


def test_longest_key_is_accepted(api, member_token, team):
    response = post(api(member_token), "models/", {"slug": "x", "task": "chat"}, key="k" * 255)
    assert response.status_code == 201, response.content
