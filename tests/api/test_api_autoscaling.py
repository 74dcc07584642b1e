"""The scaling policy through the API: created, read back, changed by PATCH (an ``updated``
event), refused by field with nothing saved, and the autoscaler's state in the representation."""

from __future__ import annotations

import pytest

from portal.deployments.models import Deployment, DeploymentEvent, EventKind
from portal.deployments.state.autoscaling import Decision, ScalingState
from tests.api.helpers import api_error, nothing_created, ok
from tests.factories import TAGGER_IO, make_deployment, make_python_version, make_version

pytestmark = pytest.mark.django_db

DEPLOYMENTS = "/api/v1/deployments/"
POLICY = {
    "min_replicas": 1,
    "max_replicas": 4,
    "scale_metric": "waiting",
    "scale_target": 2.5,
    "scale_up_window_seconds": 30,
    "scale_down_window_seconds": 600,
    "scale_to_zero_after_seconds": 900,
}
FIXED = {
    "min_replicas": 1,
    "max_replicas": 1,
    "scale_metric": "in_flight",
    "scale_target": 4.0,
    "scale_up_window_seconds": 10,
    "scale_down_window_seconds": 300,
    "scale_to_zero_after_seconds": None,
}
IDLE = {
    "autoscales": False,
    "asleep": False,
    "asleep_since": None,
    "cold_start_seconds": None,
    "decisions": [],
}


@pytest.fixture
def client(api, member_token):
    return api(member_token)


@pytest.fixture
def v1(model, release, artifact_root):
    return make_version(model, artifact_root)


@pytest.fixture
def grpc_version(model, release, artifact_root):
    return make_python_version(model, artifact_root, TAGGER_IO)


@pytest.fixture
def autoscaling(model, v1, cpu_instance_type):
    return make_deployment(model, v1, cpu_instance_type, scaling=dict(POLICY))


def deploy_body(model, version, **overrides) -> dict:
    return {
        "model": model.pk,
        "version": version.pk,
        "strategy": "red_black",
        "instance_type": "cpu-local",
        **overrides,
    }


def policy_of(answer: dict) -> dict:
    return {name: answer[name] for name in POLICY}


def stored_policy(deployment: Deployment) -> dict:
    deployment.refresh_from_db()
    return {name: getattr(deployment, name) for name in POLICY}


def url(deployment: Deployment) -> str:
    return f"{DEPLOYMENTS}{deployment.pk}/"


# --- Create and read back -----------------------------------------------------------------------


def test_create_with_a_policy_and_read_it_back(client, model, v1, cpu_instance_type):
    created = ok(client.post(DEPLOYMENTS, deploy_body(model, v1, **POLICY), format="json"), 201)
    assert policy_of(created) == POLICY
    assert created["replicas"] == 1  # a new autoscaling deployment starts at min_replicas
    assert created["scaling"] == {**IDLE, "autoscales": True}
    assert ok(client.get(url(Deployment.objects.get(pk=created["id"])))) == created

    deployment = Deployment.objects.get(pk=created["id"])
    assert stored_policy(deployment) == POLICY
    [event] = deployment.events.all()
    assert event.kind == EventKind.CREATED
    assert "1-4 replicas on waiting requests per instance 2.5" in event.message
    assert "to zero after 900 s idle" in event.message
    assert event.data["scaling"] == POLICY


def test_create_without_a_policy_is_a_fixed_count(client, model, v1, cpu_instance_type):
    created = ok(client.post(DEPLOYMENTS, deploy_body(model, v1, replicas=3), format="json"), 201)
    assert policy_of(created) == {**FIXED, "min_replicas": 3, "max_replicas": 3}
    assert (created["replicas"], created["scaling"]) == (3, IDLE)


def test_replicas_given_with_bounds_is_where_it_starts(client, model, v1, cpu_instance_type):
    body = deploy_body(model, v1, replicas=2, min_replicas=1, max_replicas=5)
    created = ok(client.post(DEPLOYMENTS, body, format="json"), 201)
    assert (created["replicas"], created["min_replicas"], created["max_replicas"]) == (2, 1, 5)


def test_a_new_signal_without_a_target_takes_its_default(client, model, v1, cpu_instance_type):
    body = deploy_body(model, v1, min_replicas=1, max_replicas=3, scale_metric="kv_cache")
    created = ok(client.post(DEPLOYMENTS, body, format="json"), 201)
    assert (created["scale_metric"], created["scale_target"]) == ("kv_cache", 0.7)


# --- Refusals: by field, nothing saved -----------------------------------------------------------

BAD = [
    pytest.param(
        {"min_replicas": 3, "max_replicas": 2},
        "max_replicas",
        "at least min_replicas (3)",
        id="min>max",
    ),
    pytest.param(
        {"scale_target": 0}, "scale_target", "greater than or equal to 0.01", id="target0"
    ),
    pytest.param({"scale_target": -1.5}, "scale_target", "greater than or equal", id="target<0"),
    pytest.param(
        {"scale_up_window_seconds": 3601},
        "scale_up_window_seconds",
        "less than or equal to 3600",
        id="up-window",
    ),
    pytest.param(
        {"scale_down_window_seconds": -1},
        "scale_down_window_seconds",
        "greater than or equal",
        id="down-window",
    ),
    pytest.param(
        {"scale_metric": "kv_cache", "scale_target": 1.5}, "scale_target", "at most 1", id="kv>1"
    ),
    pytest.param({"scale_metric": "rps"}, "scale_metric", "not a valid choice", id="metric"),
    pytest.param(
        {"scale_to_zero_after_seconds": 5},
        "scale_to_zero_after_seconds",
        "greater than or equal to 10",
        id="zero-too-soon",
    ),
    pytest.param(
        {"min_replicas": 65}, "min_replicas", "less than or equal to 64", id="min-too-many"
    ),
    pytest.param(
        {"min_replicas": 2, "max_replicas": 4, "replicas": 5},
        "replicas",
        "within min_replicas and max_replicas (2 to 4)",
        id="replicas-outside",
    ),
    pytest.param({"max_replicas": 2.5}, "max_replicas", "valid integer", id="max-float"),
]


@pytest.mark.parametrize(("given", "field", "words"), BAD)
def test_bad_policy_on_create_is_a_400_naming_the_field(
    client, model, v1, cpu_instance_type, given, field, words
):
    with nothing_created():
        response = client.post(DEPLOYMENTS, deploy_body(model, v1, **given), format="json")
    fields = api_error(response, 400, "invalid")["fields"]
    assert list(fields) == [field], fields
    assert words in fields[field][0]


@pytest.mark.parametrize(("given", "field", "words"), BAD)
def test_bad_policy_on_patch_is_a_400_and_changes_nothing(client, autoscaling, given, field, words):
    before = stored_policy(autoscaling)
    events = autoscaling.events.count()
    # A valid rollout setting beside it is not saved either: the update is one transaction.
    response = client.patch(url(autoscaling), {"bake_seconds": 7, **given}, format="json")
    fields = api_error(response, 400, "invalid")["fields"]
    assert list(fields) == [field], fields
    assert words in fields[field][0]
    assert stored_policy(autoscaling) == before
    assert (autoscaling.bake_seconds, autoscaling.events.count()) == (60, events)


def test_scale_to_zero_is_refused_for_a_grpc_version(
    client, model, grpc_version, cpu_instance_type
):
    body = deploy_body(model, grpc_version, scale_to_zero_after_seconds=600)
    with nothing_created():
        response = client.post(DEPLOYMENTS, body, format="json")
    error = api_error(response, 400, "invalid")
    assert list(error["fields"]) == ["scale_to_zero_after_seconds"]
    assert "KServe v2 gRPC" in error["fields"]["scale_to_zero_after_seconds"][0]
    assert error["message"].startswith("scale_to_zero_after_seconds: ")

    # Explicitly off is fine for it.
    body["scale_to_zero_after_seconds"] = None
    created = ok(client.post(DEPLOYMENTS, body, format="json"), 201)
    assert created["scale_to_zero_after_seconds"] is None

    deployment = Deployment.objects.get(pk=created["id"])
    response = client.patch(url(deployment), {"scale_to_zero_after_seconds": 60}, format="json")
    assert list(api_error(response, 400, "invalid")["fields"]) == ["scale_to_zero_after_seconds"]
    assert stored_policy(deployment)["scale_to_zero_after_seconds"] is None


def test_unknown_policy_field_is_refused(client, model, v1, cpu_instance_type):
    with nothing_created():
        response = client.post(DEPLOYMENTS, deploy_body(model, v1, scale_max=3), format="json")
    assert list(api_error(response, 400, "invalid")["fields"]) == ["scale_max"]


# --- PATCH ---------------------------------------------------------------------------------------


def test_patch_changes_the_policy_as_an_updated_event(client, autoscaling):
    events = autoscaling.events.count()
    answer = ok(
        client.patch(url(autoscaling), {"max_replicas": 6, "scale_target": 3}, format="json")
    )
    assert policy_of(answer) == {**POLICY, "max_replicas": 6, "scale_target": 3.0}
    assert stored_policy(autoscaling) == policy_of(answer)
    assert autoscaling.events.count() == events + 1
    event = autoscaling.events.latest("id")
    assert event.kind == EventKind.UPDATED
    assert event.actor_label.startswith("token:ci (")
    assert event.data == {"max_replicas": [4, 6], "scale_target": [2.5, 3.0]}
    assert "max_replicas 4 → 6" in event.message.lower()

    # The same again changes nothing and records nothing.
    ok(client.patch(url(autoscaling), {"max_replicas": 6}, format="json"))
    assert autoscaling.events.count() == events + 1


def test_scale_to_zero_omitted_is_kept_and_null_turns_it_off(client, autoscaling):
    answer = ok(client.patch(url(autoscaling), {"scale_target": 2}, format="json"))
    assert answer["scale_to_zero_after_seconds"] == 900
    answer = ok(
        client.patch(url(autoscaling), {"scale_to_zero_after_seconds": None}, format="json")
    )
    assert answer["scale_to_zero_after_seconds"] is None
    event = autoscaling.events.latest("id")
    assert event.data == {"scale_to_zero_after_seconds": [900, None]}


def test_patch_of_replicas_alone_makes_the_count_fixed(client, autoscaling):
    answer = ok(client.patch(url(autoscaling), {"replicas": 3}, format="json"))
    assert (answer["replicas"], answer["min_replicas"], answer["max_replicas"]) == (3, 3, 3)
    assert answer["scaling"]["autoscales"] is False
    event = autoscaling.events.latest("id")
    assert event.kind == EventKind.UPDATED
    assert event.data["max_replicas"] == [4, 3]


def test_patch_turns_a_fixed_count_into_a_policy(client, model, v1, cpu_instance_type):
    deployment = make_deployment(model, v1, cpu_instance_type, replicas=2)
    answer = ok(
        client.patch(url(deployment), {"min_replicas": 1, "max_replicas": 8}, format="json")
    )
    assert (answer["replicas"], answer["min_replicas"], answer["max_replicas"]) == (2, 1, 8)
    assert answer["scaling"]["autoscales"] is True


def test_a_viewer_cannot_change_the_policy(api, viewer_token, autoscaling):
    response = api(viewer_token).patch(url(autoscaling), {"max_replicas": 2}, format="json")
    assert response.status_code == 403
    assert stored_policy(autoscaling) == POLICY


# --- The autoscaler's state ------------------------------------------------------------------------


def test_the_representation_shows_sleep_cold_start_and_decisions_newest_first(client, autoscaling):
    def decision(at: float, before: int, after: int) -> Decision:
        return Decision(
            at=at, replicas_from=before, replicas_to=after, metric="waiting", observed=5.0,
            target=2.5, reporting=before, recommended=after, reason=f"{before} to {after}",
        )  # fmt: skip

    Deployment.objects.filter(pk=autoscaling.pk).update(
        scaling=ScalingState(
            asleep_since=1_800_000_000.0,
            cold_start_seconds=12.5,
            decisions=(decision(1_799_999_000.0, 1, 2), decision(1_799_999_500.5, 2, 4)),
        )
    )
    scaling = ok(client.get(url(autoscaling)))["scaling"]
    assert scaling == {
        "autoscales": True,
        "asleep": True,
        "asleep_since": "2027-01-15T08:00:00Z",
        "cold_start_seconds": 12.5,
        "decisions": [
            {
                "at": "2027-01-15T07:51:40.500000Z",
                "from": 2,
                "to": 4,
                "reason": "2 to 4",
                "metric": "waiting",
                "observed": 5.0,
                "target": 2.5,
            },
            {
                "at": "2027-01-15T07:43:20Z",
                "from": 1,
                "to": 2,
                "reason": "1 to 2",
                "metric": "waiting",
                "observed": 5.0,
                "target": 2.5,
            },
        ],
    }
    assert DeploymentEvent.objects.filter(deployment=autoscaling).count() == 1


def test_the_schema_declares_the_policy_and_the_scaling_object(api, member):
    schema = ok(api(member).get("/api/schema/?format=json"))
    components = schema["components"]["schemas"]
    out = components["DeploymentOut"]["properties"]
    assert set(POLICY) | {"scaling"} <= set(out)
    assert out["scaling"]["allOf"][0]["$ref"].endswith("/ScalingOut") or out["scaling"][
        "$ref"
    ].endswith("/ScalingOut")
    assert out["scale_to_zero_after_seconds"]["nullable"] is True
    scaling = components["ScalingOut"]
    assert set(scaling["required"]) == set(IDLE)
    decision = components["ScalingDecisionOut"]["properties"]
    assert set(decision) == {"at", "from", "to", "reason", "metric", "observed", "target"}
    for request in ("DeploymentCreateInRequest", "PatchedDeploymentUpdateInRequest"):
        given = components[request]["properties"]
        assert set(POLICY) <= set(given), request
        assert given["scale_to_zero_after_seconds"]["nullable"] is True
        assert given["scale_target"]["minimum"] == 0.01
        assert given["max_replicas"]["maximum"] == 64
