"""Who may read and change what through ``/api/v1/``: the authorization matrix.

Own team member (signed in or with a token) reads and writes; own team viewer reads and gets 403
on writes; another team's objects do not exist (404 in the URL, 400 in a body); anonymous,
revoked, expired and malformed credentials get 401 with a Bearer challenge; operators see all.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model

from portal.accounts.models import Membership, Role
from portal.deployments.models import Deployment, Instance, InstanceType
from portal.registry.models import Model, ModelVersion
from tests.api.helpers import api_error, nothing_created, row_counts
from tests.factories import make_deployment, make_model, make_version

pytestmark = pytest.mark.django_db

API = "/api/v1"


def _build(team, slug, instance_type, artifact_root) -> SimpleNamespace:
    model = make_model(team, slug)
    version = make_version(model, artifact_root)
    deployment = make_deployment(model, version, instance_type)
    return SimpleNamespace(
        team=team,
        model=model,
        version=version,
        deployment=deployment,
        event=deployment.events.get(),
        instance=Instance.objects.create(deployment=deployment, version=version, name=f"{slug}-0"),
    )


@pytest.fixture
def world(team, other_team, release, cpu_instance_type, artifact_root):
    """One model, version, Red-Black deployment, event and instance in each of the two teams."""
    return SimpleNamespace(
        ours=_build(team, "ranker", cpu_instance_type, artifact_root),
        theirs=_build(other_team, "bidder", cpu_instance_type, artifact_root),
    )


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")


@pytest.fixture
def caller(request, api):
    """An API client for the fixture named by the test's ``caller`` parameter."""
    return api(request.getfixturevalue(request.param))


MEMBERS = ["member", "member_token"]
VIEWERS = ["viewer", "viewer_token"]

#: collection → how an object of a team's world is addressed in the URL.
SCOPED = {
    "teams": lambda side: side.team.slug,
    "models": lambda side: side.model.pk,
    "versions": lambda side: side.version.pk,
    "deployments": lambda side: side.deployment.pk,
    "events": lambda side: side.event.pk,
    "instances": lambda side: side.instance.pk,
}


def _ids(response, key: str) -> set:
    assert response.status_code == 200, response.content
    return {item[key] for item in response.json()["results"]}


# --- Reads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("caller", MEMBERS + VIEWERS, indirect=True)
@pytest.mark.parametrize("collection", SCOPED)
def test_own_team_reads(caller, world, collection):
    lookup = SCOPED[collection]
    key = "slug" if collection == "teams" else "id"
    listed = _ids(caller.get(f"{API}/{collection}/"), key)
    assert lookup(world.ours) in listed
    assert lookup(world.theirs) not in listed

    detail = caller.get(f"{API}/{collection}/{lookup(world.ours)}/")
    assert detail.status_code == 200, detail.content
    assert detail.json()[key] == lookup(world.ours)


@pytest.mark.parametrize("caller", MEMBERS + VIEWERS, indirect=True)
@pytest.mark.parametrize("collection", SCOPED)
def test_other_teams_objects_are_not_found(caller, world, collection):
    response = caller.get(f"{API}/{collection}/{SCOPED[collection](world.theirs)}/")
    api_error(response, 404, "not_found")


@pytest.mark.parametrize(
    ("caller", "role"),
    [
        ("member", "member"),
        ("member_token", "member"),
        ("viewer", "viewer"),
        ("viewer_token", "viewer"),
    ],
    indirect=["caller"],
)
def test_team_list_shows_the_callers_role(caller, world, role):
    results = caller.get(f"{API}/teams/").json()["results"]
    assert [(t["slug"], t["role"]) for t in results] == [("search", role)]


@pytest.mark.parametrize("caller", MEMBERS + VIEWERS + ["outsider"], indirect=True)
def test_releases_and_instance_types_are_shared(caller, release, cpu_instance_type):
    releases = caller.get(f"{API}/releases/")
    assert _ids(releases, "name") == {"triton-26.07"}
    detail = caller.get(f"{API}/releases/{release.pk}/").json()
    assert (detail["vllm_version"], detail["is_default"]) == ("0.24.0", True)

    InstanceType.objects.create(name="retired-gpu", is_active=False)
    names = _ids(caller.get(f"{API}/instance-types/"), "name")
    assert "cpu-local" in names
    assert "retired-gpu" not in names
    assert caller.get(f"{API}/instance-types/cpu-local/").json()["gpus"] == 0
    api_error(caller.get(f"{API}/instance-types/no-such/"), 404, "not_found")


# --- Writes -----------------------------------------------------------------------------------

#: (method, collection, object, action, body) of every write on an object named in the URL.
URL_WRITES = [
    ("patch", "models", "model", None, {"description": "changed"}),
    ("patch", "versions", "version", None, {"engine_args": {"dtype": "half"}}),
    ("patch", "deployments", "deployment", None, {"replicas": 2}),
    *[
        ("post", "deployments", "deployment", action, {"reason": "test"})
        for action in ("pause", "resume", "abort", "promote", "rollback")
    ],
]
URL_WRITE_IDS = [f"{m} {c}{'/' + a if a else ''}" for m, c, _, a, _ in URL_WRITES]


def _write(client, side, method, collection, obj, action, body):
    url = f"{API}/{collection}/{getattr(side, obj).pk}/" + (f"{action}/" if action else "")
    return getattr(client, method)(url, body, format="json")


def _snapshot(side) -> tuple:
    model = Model.objects.get(pk=side.model.pk)
    version = ModelVersion.objects.get(pk=side.version.pk)
    deployment = Deployment.objects.get(pk=side.deployment.pk)
    return (model.description, version.engine_args, deployment.replicas, deployment.desired_state)


@pytest.mark.parametrize("caller", VIEWERS, indirect=True)
@pytest.mark.parametrize(
    ("method", "collection", "obj", "action", "body"), URL_WRITES, ids=URL_WRITE_IDS
)
def test_viewer_writes_are_forbidden(caller, world, method, collection, obj, action, body):
    before = _snapshot(world.ours)
    with nothing_created():
        response = _write(caller, world.ours, method, collection, obj, action, body)
    error = api_error(response, 403, "permission_denied")
    assert "viewer" in error["message"]
    assert _snapshot(world.ours) == before


@pytest.mark.parametrize("caller", MEMBERS + VIEWERS, indirect=True)
@pytest.mark.parametrize(
    ("method", "collection", "obj", "action", "body"), URL_WRITES, ids=URL_WRITE_IDS
)
def test_writes_to_other_teams_objects_are_not_found(
    caller, world, method, collection, obj, action, body
):
    before = _snapshot(world.theirs)
    with nothing_created():
        response = _write(caller, world.theirs, method, collection, obj, action, body)
    api_error(response, 404, "not_found")
    assert _snapshot(world.theirs) == before


def _create_bodies(world, artifact_root) -> dict[str, tuple[str, dict]]:
    ours = world.ours
    return {
        "model": ("models", {"team": "search", "slug": "new-model", "task": "chat"}),
        "version": (
            "versions",
            {"model": ours.model.pk, "artifact_uri": f"file://{artifact_root}/w"},
        ),
        "deployment": (
            "deployments",
            {
                "model": ours.model.pk,
                "version": ours.version.pk,
                "strategy": "versioned",
                "instance_type": "cpu-local",
            },
        ),
    }


@pytest.mark.parametrize("caller", VIEWERS, indirect=True)
@pytest.mark.parametrize("what", ["model", "version", "deployment"])
def test_viewer_creates_are_forbidden(caller, world, artifact_root, what):
    collection, body = _create_bodies(world, artifact_root)[what]
    with nothing_created():
        response = caller.post(f"{API}/{collection}/", body, format="json")
    api_error(response, 403, "permission_denied")


@pytest.mark.parametrize("caller", MEMBERS, indirect=True)
@pytest.mark.parametrize("what", ["model", "version", "deployment"])
def test_member_creates(caller, world, artifact_root, what):
    collection, body = _create_bodies(world, artifact_root)[what]
    before = row_counts()
    response = caller.post(f"{API}/{collection}/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["team"] == "search"
    grown = {name for name, count in row_counts().items() if count != before[name]}
    expected = {
        "model": {"Model"},
        "version": {"ModelVersion"},
        "deployment": {"Deployment", "DeploymentEvent"},
    }[what]
    assert grown == expected


@pytest.mark.parametrize("caller", MEMBERS + VIEWERS, indirect=True)
@pytest.mark.parametrize(
    ("collection", "field", "body"),
    [
        (
            "versions",
            "model",
            lambda w, root: {"model": w.theirs.model.pk, "artifact_uri": f"file://{root}/w"},
        ),
        (
            "deployments",
            "model",
            lambda w, root: {
                "model": w.theirs.model.pk,
                "version": w.theirs.version.pk,
                "strategy": "versioned",
                "instance_type": "cpu-local",
            },
        ),
        (
            "deployments",
            "version",
            lambda w, root: {
                "model": w.ours.model.pk,
                "version": w.theirs.version.pk,
                "strategy": "versioned",
                "instance_type": "cpu-local",
            },
        ),
    ],
    ids=["version-of-their-model", "deployment-of-their-model", "deployment-of-their-version"],
)
def test_body_reference_to_other_team_reads_as_unknown(
    caller, world, artifact_root, collection, field, body, request
):
    payload = body(world, artifact_root)
    with nothing_created():
        response = caller.post(f"{API}/{collection}/", payload, format="json")
    if (
        payload["model"] == world.ours.model.pk
        and request.node.callspec.params["caller"] in VIEWERS
    ):
        # The viewer's own model is readable, so it is refused for the role first.
        api_error(response, 403, "permission_denied")
        return
    error = api_error(response, 400, "invalid")
    assert error["fields"] == {field: [f"No {field} with id {payload[field]}."]}


@pytest.mark.parametrize("caller", MEMBERS, indirect=True)
def test_patch_to_other_teams_version_reads_as_unknown(caller, world):
    deployment = world.ours.deployment
    with nothing_created():
        response = caller.patch(
            f"{API}/deployments/{deployment.pk}/",
            {"version": world.theirs.version.pk},
            format="json",
        )
    error = api_error(response, 400, "invalid")
    assert error["fields"] == {"version": [f"No version with id {world.theirs.version.pk}."]}
    assert Deployment.objects.get(pk=deployment.pk).target_version_id == world.ours.version.pk


@pytest.mark.parametrize("caller", MEMBERS + VIEWERS, indirect=True)
def test_creating_a_model_in_another_team_reads_as_unknown_team(caller, world):
    with nothing_created():
        response = caller.post(
            f"{API}/models/", {"team": "ads", "slug": "x", "task": "chat"}, format="json"
        )
    assert api_error(response, 400, "invalid")["fields"] == {"team": ["No team 'ads'."]}


def test_token_acts_for_its_team_not_for_its_creator(api, world, member, other_team, member_token):
    """The creator is also a member of the other team; their token still sees only its own."""
    Membership.objects.create(team=other_team, user=member, role=Role.MEMBER)
    assert _ids(api(member).get(f"{API}/models/"), "slug") == {"ranker", "bidder"}
    assert _ids(api(member_token).get(f"{API}/models/"), "slug") == {"ranker"}
    api_error(api(member_token).get(f"{API}/models/{world.theirs.model.pk}/"), 404, "not_found")


def test_user_in_two_teams_must_name_the_team(api, world, member, other_team):
    Membership.objects.create(team=other_team, user=member, role=Role.MEMBER)
    client = api(member)
    with nothing_created():
        response = client.post(f"{API}/models/", {"slug": "x", "task": "chat"}, format="json")
    assert "team" in api_error(response, 400, "invalid")["fields"]
    response = client.post(
        f"{API}/models/", {"team": "ads", "slug": "x", "task": "chat"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["team"] == "ads"


# --- Operators --------------------------------------------------------------------------------


def test_superuser_sees_and_changes_every_team(api, world, operator):
    client = api(operator)
    teams = client.get(f"{API}/teams/").json()["results"]
    assert [(t["slug"], t["role"]) for t in teams] == [("ads", "member"), ("search", "member")]
    for collection, lookup in SCOPED.items():
        key = "slug" if collection == "teams" else "id"
        listed = _ids(client.get(f"{API}/{collection}/"), key)
        assert {lookup(world.ours), lookup(world.theirs)} <= listed, collection
        assert client.get(f"{API}/{collection}/{lookup(world.theirs)}/").status_code == 200

    response = client.patch(
        f"{API}/models/{world.theirs.model.pk}/", {"description": "by ops"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert Model.objects.get(pk=world.theirs.model.pk).description == "by ops"
    # An operator is in every team, so a create must say which.
    response = client.post(f"{API}/models/", {"slug": "x", "task": "chat"}, format="json")
    assert "team" in api_error(response, 400, "invalid")["fields"]


# --- Authentication failures ------------------------------------------------------------------

REQUESTS = [
    ("get", "models/"),
    ("get", "teams/search/"),
    ("get", "releases/"),
    ("post", "models/"),
    ("post", "deployments/1/pause/"),
]


@pytest.mark.parametrize(("method", "path"), REQUESTS)
@pytest.mark.parametrize(
    ("authorization", "code", "message"),
    [
        (None, "not_authenticated", "credentials were not provided"),
        ("revoked_token", "authentication_failed", "revoked"),
        ("expired_token", "authentication_failed", "expired"),
        ("Bearer", "authentication_failed", "Malformed Authorization header"),
        ("Bearer two parts", "authentication_failed", "Malformed Authorization header"),
        ("Bearer not-a-token", "authentication_failed", "Malformed API token"),
        ("Bearer mlp_00000000_forged", "authentication_failed", "Invalid API token"),
        ("Token abc", "not_authenticated", "credentials were not provided"),
    ],
    ids=[
        "anonymous",
        "revoked",
        "expired",
        "no-token",
        "two-parts",
        "not-a-token",
        "forged",
        "other-scheme",
    ],
)
def test_unauthenticated_calls_get_401_with_bearer_challenge(
    api, world, request, method, path, authorization, code, message
):
    client = api()
    if authorization is not None:
        if authorization.endswith("_token"):
            authorization = f"Bearer {request.getfixturevalue(authorization)}"
        client.credentials(HTTP_AUTHORIZATION=authorization)
    with nothing_created():
        response = getattr(client, method)(
            f"{API}/{path}", {"slug": "x", "task": "chat"}, format="json"
        )
    error = api_error(response, 401, code)
    assert message in error["message"]
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
