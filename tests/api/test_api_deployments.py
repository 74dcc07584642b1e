"""Deployments through the API: strategies, new rollouts by PATCH, the actions and their events."""

from __future__ import annotations

import pytest

from portal.accounts.models import ApiToken
from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    Instance,
    InstanceType,
    ObservedState,
)
from portal.deployments.rollout.judge import CanaryPolicy
from portal.registry.lifecycle import transition_version
from portal.registry.models import VersionState
from tests.api.helpers import api_error, nothing_created, ok
from tests.factories import (
    TAGGER_IO,
    make_deployment,
    make_model,
    make_python_version,
    make_version,
)

pytestmark = pytest.mark.django_db

DEPLOYMENTS = "/api/v1/deployments/"


def serve(deployment) -> None:
    """What the rollout controller does for a healthy rollout."""
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="stage 1")
    transition_deployment(deployment, ObservedState.SERVING, reason="all traffic on target")


@pytest.fixture
def v1(model, release, artifact_root):
    return make_version(model, artifact_root)


@pytest.fixture
def v2(model, release, artifact_root):
    return make_version(model, artifact_root)


@pytest.fixture
def client(api, member_token):
    return api(member_token)


@pytest.fixture(params=["member", "member_token"])
def acting(request, api):
    """(client, the actor_label its events must carry) for a signed-in member and for a token."""
    who = request.getfixturevalue(request.param)
    if isinstance(who, str):
        token = ApiToken.objects.get(prefix=who.split("_")[1])
        return api(who), f"token:ci ({token.prefix})"
    return api(who), "user:mia"


def deploy_body(model, version, strategy: str = "red_black", **overrides) -> dict:
    return {
        "model": model.pk,
        "version": version.pk,
        "strategy": strategy,
        "instance_type": "cpu-local",
        **overrides,
    }


@pytest.fixture
def red_black(model, v1, cpu_instance_type):
    return make_deployment(model, v1, cpu_instance_type)


def events_of(deployment) -> list[DeploymentEvent]:
    return list(DeploymentEvent.objects.filter(deployment=deployment).order_by("id"))


def act(client, deployment, action: str, **body):
    return client.post(f"{DEPLOYMENTS}{deployment.pk}/{action}/", body, format="json")


# --- Create, list, retrieve -------------------------------------------------------------------


def test_create_list_retrieve(acting, model, v1, cpu_instance_type):
    client, label = acting
    body = deploy_body(model, v1, replicas=2, stages=[25, 100], bake_seconds=30)
    created = ok(client.post(DEPLOYMENTS, body, format="json"), 201)
    deployment = Deployment.objects.get(pk=created["id"])
    assert {k: v for k, v in created.items() if k not in ("id", "created_at", "updated_at")} == {
        "model": model.pk,
        "team": "search",
        "region": "local",  # the default region, made on first use
        "multi_region": None,
        "wave": 0,
        "strategy": "red_black",
        "target_version": 1,
        "target_version_id": v1.pk,
        "previous_version": None,
        "replicas": 2,
        # replicas alone: a fixed count (the policy: tests/api/test_api_autoscaling.py)
        "min_replicas": 2,
        "max_replicas": 2,
        "scale_metric": "in_flight",
        "scale_target": 4.0,
        "scale_up_window_seconds": 10,
        "scale_down_window_seconds": 300,
        "scale_to_zero_after_seconds": None,
        "scaling": {
            "autoscales": False,
            "asleep": False,
            "asleep_since": None,
            "cold_start_seconds": None,
            "decisions": [],
        },
        "instance_type": "cpu-local",
        "stages": [25, 100],
        "bake_seconds": 30,
        "health_deadline_seconds": 600,
        "max_error_rate": 0.05,
        "canary_analysis": False,
        "canary_policy": CanaryPolicy.default().to_dict(),
        "allow_io_change": False,
        "desired_state": "active",
        "promote_requested": False,
        "observed_state": "pending",
        "current_stage": 0,
        "stage_percent": None,
        "traffic": {},
        "status": {
            "headline": "Waiting for v1 to be ready (registered)",
            "level": "warn",
            "badge": "waiting",
            "stage": None,
            "stage_count": None,
            "stage_percent": None,
            "version": 1,
            "percent": 0,
            "progress": 0.0,
            "traffic": "no traffic",
            "detail": "",
            "rolled_back_from": None,
            "bake_ends_at": None,
        },
        "status_message": "",
        "endpoint": "http://127.0.0.1:8080/models/search/ranker",
        "call": {
            "openai": "http://127.0.0.1:8080/models/search/ranker",
            "kserve_http": "http://127.0.0.1:8080/models/search/ranker",
            "kserve_grpc": [],
        },
        "instances": [],
        "estimated_cost_per_hour": None,  # cpu-local has no price
        "last_reconciled_at": None,
    }
    [event] = events_of(deployment)
    assert (event.kind, event.actor_label, event.to_state) == ("created", label, "pending")
    assert event.data == {"version": 1, "replicas": 2, "stages": [25, 100], "region": "local"}

    assert [d["id"] for d in ok(client.get(DEPLOYMENTS))["results"]] == [deployment.pk]
    assert ok(client.get(f"{DEPLOYMENTS}{deployment.pk}/")) == created


def test_a_kserve_only_deployment_says_where_to_call_it(
    client, model, release, artifact_root, cpu_instance_type
):
    version = make_python_version(model, artifact_root, TAGGER_IO)
    created = ok(client.post(DEPLOYMENTS, deploy_body(model, version), format="json"), 201)
    deployment = Deployment.objects.get(pk=created["id"])
    for name, state, address in (
        ("a", "ready", "10.0.0.1:8001"),
        ("b", "starting", "10.0.0.2:8001"),
    ):
        Instance.objects.create(
            deployment=deployment,
            version=version,
            name=name,
            state=state,
            endpoints={"kserve_grpc": address},
        )
    assert ok(client.get(f"{DEPLOYMENTS}{deployment.pk}/"))["call"] == {
        "openai": None,
        "kserve_http": "http://127.0.0.1:8080/models/search/ranker",
        "kserve_grpc": ["10.0.0.1:8001"],  # only ready instances take calls
    }


def test_create_defaults(client, model, v1, cpu_instance_type):
    created = ok(client.post(DEPLOYMENTS, deploy_body(model, v1), format="json"), 201)
    assert (created["replicas"], created["stages"], created["bake_seconds"]) == (
        1,
        [10, 50, 100],
        60,
    )


def test_one_live_red_black_per_model(client, model, v1, v2, red_black):
    # Deploying Red-Black onto the model's live Red-Black deployment rolls that one (see
    # tests/deployments/test_deploy_rule.py); while its own rollout is under way, that is a conflict.
    with nothing_created():
        response = client.post(DEPLOYMENTS, deploy_body(model, v2), format="json")
    error = api_error(response, 409, "conflict")
    assert f"Cannot roll deployment {red_black.pk}, this model's live Red-Black" in error["message"]
    assert "already under way (pending)" in error["message"]

    serve(red_black)
    rolled = ok(client.post(DEPLOYMENTS, deploy_body(model, v2), format="json"), 200)
    assert (rolled["id"], rolled["target_version"], rolled["previous_version"]) == (
        red_black.pk,
        2,
        1,
    )
    assert Deployment.objects.count() == 1

    # Once the first is no longer live, a new one may be created.
    transition_deployment(red_black, ObservedState.ABORTED, reason="gone")
    ok(client.post(DEPLOYMENTS, deploy_body(model, v2), format="json"), 201)


def test_versioned_one_live_per_version(client, model, v1, v2, cpu_instance_type, red_black):
    first = ok(client.post(DEPLOYMENTS, deploy_body(model, v1, "versioned"), format="json"), 201)
    ok(client.post(DEPLOYMENTS, deploy_body(model, v2, "versioned"), format="json"), 201)
    with nothing_created():
        response = client.post(DEPLOYMENTS, deploy_body(model, v1, "versioned"), format="json")
    error = api_error(response, 409, "conflict")
    assert "version 1 already has a live Versioned deployment" in error["message"]
    assert f"deployment {first['id']}" in error["message"]


@pytest.fixture
def other_model(team, release, artifact_root):
    model = make_model(team, "embedder", task="embedding")
    make_version(model, artifact_root)
    return model


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"instance_type": "gpu-huge"}, "instance_type", "No instance type 'gpu-huge'."),
        ({"instance_type": "retired"}, "instance_type", "Instance type retired is retired."),
        ({"strategy": "blue_green"}, "strategy", '"blue_green" is not a valid choice.'),
        ({"replicas": 0}, "replicas", "greater than or equal to 1"),
        ({"replicas": 65}, "replicas", "less than or equal to 64"),
        ({"replicas": "many"}, "replicas", "A valid integer is required."),
        ({"stages": [50, 10, 100]}, "stages", "increasing traffic percentages ending at 100"),
        ({"stages": [10, 50]}, "stages", "ending at 100"),
        ({"stages": [0, 100]}, "stages.0", "greater than or equal to 1"),
        ({"stages": [*range(1, 12), 100]}, "stages", "no more than 10"),
        ({"bake_seconds": -1}, "bake_seconds", "greater than or equal to 0"),
        ({"version": None}, "version", "may not be null"),
        ({"version": 999999}, "version", "No version with id 999999."),
        ({"model": "ranker"}, "model", "A valid integer is required."),
        ({"model": 999999}, "model", "No model with id 999999."),
        ({"desired_state": "paused"}, "desired_state", "Unknown field."),
    ],
)
def test_create_validation(client, model, v1, cpu_instance_type, overrides, field, needle):
    InstanceType.objects.create(name="retired", is_active=False)
    with nothing_created():
        response = client.post(DEPLOYMENTS, {**deploy_body(model, v1), **overrides}, format="json")
    error = api_error(response, 400, "invalid")
    assert needle in " ".join(error["fields"][field]), error


def test_version_must_belong_to_the_model(client, model, v1, other_model, cpu_instance_type):
    with nothing_created():
        response = client.post(DEPLOYMENTS, deploy_body(other_model, v1), format="json")
    assert api_error(response, 400, "invalid")["fields"] == {
        "version": [f"Version {v1.pk} does not belong to search/embedder."]
    }


def test_failed_version_cannot_be_deployed(client, model, v1, cpu_instance_type):
    transition_version(v1, VersionState.FAILED, reason="no weights")
    with nothing_created():
        response = client.post(DEPLOYMENTS, deploy_body(model, v1), format="json")
    assert "failed (no weights)" in api_error(response, 400, "invalid")["fields"]["version"][0]


def test_malformed_json(client, model, v1, cpu_instance_type):
    with nothing_created():
        response = client.post(DEPLOYMENTS, "{", content_type="application/json")
    api_error(response, 400, "malformed_request")


# --- PATCH ------------------------------------------------------------------------------------


def test_new_red_black_rollout_by_patch(acting, red_black, v1, v2):
    client, label = acting
    url = f"{DEPLOYMENTS}{red_black.pk}/"

    with nothing_created():
        response = client.patch(url, {"version": v2.pk}, format="json")
    assert "already under way (pending)" in api_error(response, 409, "conflict")["message"]
    red_black.refresh_from_db()
    assert red_black.target_version == v1

    serve(red_black)
    seen = DeploymentEvent.objects.count()
    body = ok(client.patch(url, {"version": v2.pk}, format="json"))
    assert (body["target_version"], body["previous_version"], body["observed_state"]) == (
        2,
        1,
        "pending",
    )
    red_black.refresh_from_db()
    assert (red_black.target_version, red_black.previous_version) == (v2, v1)
    [event] = DeploymentEvent.objects.filter(id__gt=0).order_by("id")[seen:]
    assert (event.kind, event.actor_label, event.from_state, event.to_state) == (
        "state", label, "serving", "pending",
    )  # fmt: skip
    assert event.message == "New rollout v1 → v2."

    # The new rollout can be rolled back at once, before its first stage, to the version that
    # served before it.
    body = ok(act(client, red_black, "rollback", reason="latency regression"))
    assert body["desired_state"] == "rollback"
    event = events_of(red_black)[-1]
    assert (event.kind, event.actor_label) == ("action", label)
    assert event.data == {"action": "rollback", "reason": "latency regression"}


def test_patch_replicas_records_an_update(acting, red_black):
    client, label = acting
    body = ok(client.patch(f"{DEPLOYMENTS}{red_black.pk}/", {"replicas": 3}, format="json"))
    assert body["replicas"] == 3
    event = events_of(red_black)[-1]
    assert (event.kind, event.actor_label, event.message) == ("updated", label, "Replicas 1 → 3.")
    assert event.data == {"replicas": [1, 3]}


def test_patch_rollout_settings_records_an_update(acting, red_black):
    client, label = acting
    body = ok(
        client.patch(
            f"{DEPLOYMENTS}{red_black.pk}/",
            {"stages": [20, 100], "bake_seconds": 5, "max_error_rate": 0.1},
            format="json",
        )
    )
    assert (body["stages"], body["bake_seconds"], body["max_error_rate"]) == ([20, 100], 5, 0.1)
    event = events_of(red_black)[-1]
    assert (event.kind, event.actor_label) == ("updated", label)
    assert event.message == (
        "Rollout settings: stages [10, 50, 100] → [20, 100], bake_seconds 60 → 5, "
        "max_error_rate 0.05 → 0.1."
    )


def test_an_interface_change_is_refused_red_black_and_advice_says_versioned(
    client, team, release, artifact_root, cpu_instance_type
):
    model = make_model(team, "tagger")
    v1 = make_python_version(model, artifact_root, TAGGER_IO)
    v2_io = {**TAGGER_IO, "outputs": [{"name": "TAGS", "data_type": "TYPE_INT32", "dims": [-1]}]}
    v2 = make_python_version(model, artifact_root, v2_io)
    deployment = make_deployment(model, v1, cpu_instance_type)
    serve(deployment)

    advice = ok(client.get(f"{DEPLOYMENTS}advice/", {"version": v2.pk}))
    assert advice["strategy"] == "versioned"
    assert advice["interface_changes"] == ["I/O spec (tensor names, types or shapes) differs"]
    assert "Versioned serves it on its own endpoint" in advice["reason"]
    assert ok(client.get(f"{DEPLOYMENTS}advice/", {"version": v1.pk}))["strategy"] == "red_black"

    url = f"{DEPLOYMENTS}{deployment.pk}/"
    with nothing_created():
        response = client.patch(url, {"version": v2.pk}, format="json")
    message = " ".join(api_error(response, 400, "invalid")["fields"]["version"])
    assert "changes the model's interface" in message and "deploy it Versioned" in message
    body = ok(client.patch(url, {"version": v2.pk, "allow_io_change": True}, format="json"))
    assert (body["target_version"], body["allow_io_change"]) == (2, True)


def test_advice_is_team_scoped(client, other_team, release, artifact_root):
    theirs = make_version(make_model(other_team, "secret"), artifact_root)
    response = client.get(f"{DEPLOYMENTS}advice/", {"version": theirs.pk})
    assert api_error(response, 400, "invalid")["fields"] == {
        "version": [f"No version with id {theirs.pk}."]
    }


def test_patch_without_change_records_nothing(client, red_black, v1):
    with nothing_created():
        body = ok(
            client.patch(
                f"{DEPLOYMENTS}{red_black.pk}/", {"replicas": 1, "version": v1.pk}, format="json"
            )
        )
    assert body["replicas"] == 1


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"replicas": 0}, "replicas", "greater than or equal to 1"),
        ({"version": "two"}, "version", "A valid integer is required."),
        ({"version": 999999}, "version", "No version with id 999999."),
        ({"strategy": "versioned"}, "strategy", "Unknown field."),
        ({"observed_state": "serving"}, "observed_state", "Unknown field."),
        ({"stages": [50, 20]}, "stages", "increasing traffic percentages ending at 100"),
        ({"max_error_rate": 1.5}, "max_error_rate", "less than or equal to 1"),
        ({"health_deadline_seconds": 0}, "health_deadline_seconds", "greater than or equal to 1"),
    ],
)
def test_patch_validation(client, red_black, body, field, needle):
    serve(red_black)
    before = Deployment.objects.values().get(pk=red_black.pk)
    with nothing_created():
        response = client.patch(f"{DEPLOYMENTS}{red_black.pk}/", body, format="json")
    assert needle in " ".join(api_error(response, 400, "invalid")["fields"][field])
    assert Deployment.objects.values().get(pk=red_black.pk) == before


def test_patch_version_of_another_model_is_refused(client, red_black, other_model):
    serve(red_black)
    other_version = other_model.versions.get()
    with nothing_created():
        response = client.patch(
            f"{DEPLOYMENTS}{red_black.pk}/", {"version": other_version.pk}, format="json"
        )
    assert "does not belong" in api_error(response, 400, "invalid")["fields"]["version"][0]


def test_finished_deployment_cannot_change(client, red_black):
    transition_deployment(red_black, ObservedState.ABORTED, reason="stopped")
    with nothing_created():
        response = client.patch(f"{DEPLOYMENTS}{red_black.pk}/", {"replicas": 2}, format="json")
    assert "aborted and can no longer change" in api_error(response, 409, "conflict")["message"]


# --- Versioned deployments --------------------------------------------------------------------


@pytest.fixture
def versioned(model, v1, cpu_instance_type):
    deployment = make_deployment(model, v1, cpu_instance_type, strategy="versioned")
    serve(deployment)
    return deployment


def test_versioned_serves_one_version(client, versioned, v2):
    with nothing_created():
        response = client.patch(f"{DEPLOYMENTS}{versioned.pk}/", {"version": v2.pk}, format="json")
    assert "create a new deployment" in api_error(response, 400, "invalid")["fields"]["version"][0]
    versioned.refresh_from_db()
    assert versioned.target_version.number == 1


@pytest.mark.parametrize(
    ("action", "needle"),
    [("rollback", "a Versioned deployment serves one version"), ("promote", "only Red-Black")],
)
def test_versioned_has_no_rollback_or_promote(client, versioned, action, needle):
    with nothing_created():
        response = act(client, versioned, action)
    assert needle in api_error(response, 409, "invalid_transition")["message"]
    versioned.refresh_from_db()
    assert (versioned.desired_state, versioned.promote_requested) == ("active", False)


# --- Actions ----------------------------------------------------------------------------------


def test_actions_record_events_with_the_actor(acting, red_black):
    client, label = acting

    def step(action: str, expected_desired: str) -> dict:
        before = events_of(red_black)
        body = ok(act(client, red_black, action, reason=f"{action} it"))
        assert body["desired_state"] == expected_desired
        [event] = events_of(red_black)[len(before) :]
        assert (event.kind, event.actor_label, event.to_state) == (
            "action",
            label,
            expected_desired,
        )
        assert event.message == f"{action.capitalize()} requested. Reason: {action} it"
        assert event.data == {"action": action, "reason": f"{action} it"}
        return body

    step("pause", "paused")
    step("resume", "active")
    transition_deployment(red_black, ObservedState.PROGRESSING, reason="stage 1")
    assert step("promote", "active")["promote_requested"] is True
    step("abort", "aborted")
    red_black.refresh_from_db()
    assert (red_black.desired_state, red_black.promote_requested) == ("aborted", True)


@pytest.mark.parametrize(
    ("setup", "action", "needle"),
    [
        ([], "resume", "it is not paused"),
        ([], "promote", "it is pending"),
        ([], "rollback", "no previous version"),
        (["pause"], "pause", "already asked to paused"),
        (["abort"], "abort", "already asked to aborted"),
    ],
)
def test_actions_refused_in_the_wrong_state(client, red_black, setup, action, needle):
    for earlier in setup:
        ok(act(client, red_black, earlier))
    before = Deployment.objects.values().get(pk=red_black.pk)
    with nothing_created():
        response = act(client, red_black, action)
    error = api_error(response, 409, "invalid_transition")
    assert f"Cannot {action} this deployment" in error["message"]
    assert needle in error["message"]
    assert Deployment.objects.values().get(pk=red_black.pk) == before


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"reason": "r" * 501}, "reason", "no more than 500 characters"),
        ({"reason": ["x"]}, "reason", "Not a valid string."),
        ({"force": True}, "force", "Unknown field."),
    ],
)
def test_action_body_validation(client, red_black, body, field, needle):
    with nothing_created():
        response = client.post(f"{DEPLOYMENTS}{red_black.pk}/pause/", body, format="json")
    assert needle in " ".join(api_error(response, 400, "invalid")["fields"][field])
    red_black.refresh_from_db()
    assert red_black.desired_state == "active"


def test_action_without_body(client, red_black):
    response = client.post(f"{DEPLOYMENTS}{red_black.pk}/pause/")
    assert ok(response)["desired_state"] == "paused"


# --- Events and instances ---------------------------------------------------------------------


def test_events_and_instances_are_readable(client, red_black, v1):
    serve(red_black)
    instance = Instance.objects.create(
        deployment=red_black, version=v1, name="pod-0", endpoints={"grpc": "10.0.0.1:8001"}
    )
    events = ok(client.get(f"/api/v1/events/?deployment={red_black.pk}"))["results"]
    assert [(e["kind"], e["to_state"]) for e in events] == [
        ("created", "pending"),
        ("state", "progressing"),
        ("state", "serving"),
    ]
    assert events[-1]["actor_label"] == "controller"
    assert ok(client.get(f"/api/v1/events/{events[0]['id']}/")) == events[0]

    [listed] = ok(client.get(f"/api/v1/instances/?deployment={red_black.pk}"))["results"]
    assert (listed["id"], listed["version"], listed["endpoints"]) == (
        instance.pk, 1, {"grpc": "10.0.0.1:8001"},
    )  # fmt: skip
    assert ok(client.get(f"/api/v1/instances/{instance.pk}/")) == listed


@pytest.mark.parametrize("collection", ["events", "instances"])
def test_events_and_instances_are_read_only(client, red_black, collection):
    with nothing_created():
        response = client.post(
            f"/api/v1/{collection}/", {"deployment": red_black.pk}, format="json"
        )
    api_error(response, 405, "method_not_allowed")
