"""Deploying through the web form and through ``POST /api/v1/deployments/`` is one service
(``deploy``): the same request has the same outcome through both. Each scenario runs once
through each channel against one expectation."""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import dataclass

import pytest
from django.test import Client
from django.urls import reverse

from portal.deployments.lifecycle import transition_deployment
from portal.deployments.models import Deployment, DeploymentEvent, InstanceType, ObservedState
from tests.factories import make_deployment, make_version

pytestmark = pytest.mark.django_db


@dataclass
class Outcome:
    deployment: int | None  # the deployment the request created or rolled
    errors: dict[str, str]  # field (or "" for the whole request) → the refusal's text


@dataclass
class World:
    team: object
    model: object
    versions: list
    cpu: InstanceType
    gpu: InstanceType


def _web(world: World, member, request: dict) -> Outcome:
    client = Client()
    client.force_login(member)
    response = client.post(
        reverse("web:deploy", args=[world.team.slug, world.model.slug]),
        {
            **request,
            "instance_type": request["instance_type"].pk,
            "stages": ", ".join(str(s) for s in request["stages"]),
        },
    )
    if response.status_code == 302:
        return Outcome(int(re.findall(r"/deployments/(\d+)/", response["Location"])[0]), {})
    assert response.status_code == 200
    html = response.content.decode()
    errors = {}
    for name in (*request, ""):
        # A field's errors are rendered just before its input; form-level ones at the top.
        if name:
            found = re.findall(
                rf'<ul class="errors" id="id_{name}_errors"[^>]*>(.*?)</ul>', html, re.S
            )
        else:
            found = re.findall(r'<div class="form-errors"[^>]*>(.*?)</div>', html, re.S)
        if found:
            errors[name] = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", f)) for f in found)
    assert errors, html
    return Outcome(None, errors)


def _api(world: World, member, request: dict) -> Outcome:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(member)
    response = client.post(
        "/api/v1/deployments/",
        {
            **request,
            "model": world.model.pk,
            "instance_type": request["instance_type"].name,
        },
        format="json",
    )
    if response.status_code in (200, 201):
        return Outcome(response.json()["id"], {})
    error = response.json()["error"]
    fields = error.get("fields") or {}
    if fields:
        return Outcome(None, {name: " ".join(messages) for name, messages in fields.items()})
    return Outcome(None, {"": error["message"]})


CHANNELS = {"web": _web, "api": _api}


@pytest.fixture(params=sorted(CHANNELS))
def channel(request):
    return CHANNELS[request.param]


@pytest.fixture
def world(team, model, release, artifact_root, cpu_instance_type) -> World:
    versions = [make_version(model, artifact_root) for _ in range(2)]
    gpu = InstanceType.objects.create(name="gpu-small", gpus=1)
    return World(team, model, versions, cpu_instance_type, gpu)


def serve(deployment) -> None:
    transition_deployment(deployment, ObservedState.PROGRESSING, reason="stage 1")
    transition_deployment(deployment, ObservedState.SERVING, reason="all traffic on target")


def a_request(world: World, number: int, strategy: str = "red_black", **overrides) -> dict:
    return {
        "version": world.versions[number - 1].pk,
        "strategy": strategy,
        "replicas": 2,
        "instance_type": world.cpu,
        "stages": [25, 100],
        "bake_seconds": 5,
        "health_deadline_seconds": 60,
        "max_error_rate": 0.1,
        **overrides,
    }


def shape(deployment: Deployment) -> tuple:
    previous = deployment.previous_version.number if deployment.previous_version else None
    return (
        deployment.strategy,
        deployment.target_version.number,
        previous,
        deployment.replicas,
        deployment.stages,
        deployment.bake_seconds,
        deployment.observed_state,
    )


def test_nothing_live_creates_a_deployment(channel, world, member):
    outcome = channel(world, member, a_request(world, 1))
    deployment = Deployment.objects.get()
    assert outcome == Outcome(deployment.pk, {})
    assert shape(deployment) == ("red_black", 1, None, 2, [25, 100], 5, "pending")


def test_red_black_onto_a_serving_red_black_rolls_it_to_the_version(channel, world, member):
    live = make_deployment(world.model, world.versions[0], world.cpu)
    serve(live)
    outcome = channel(world, member, a_request(world, 2))
    assert outcome == Outcome(live.pk, {})
    assert Deployment.objects.count() == 1
    live.refresh_from_db()
    assert shape(live) == ("red_black", 2, 1, 2, [25, 100], 5, "pending")
    kinds = list(DeploymentEvent.objects.filter(deployment=live).values_list("kind", flat=True))
    assert kinds[-3:] == ["updated", "updated", "state"]  # settings, replicas, the new rollout


def test_a_rollout_under_way_is_a_conflict_naming_the_deployment(channel, world, member):
    live = make_deployment(world.model, world.versions[0], world.cpu)  # pending: rolling out
    before = Deployment.objects.values().get(pk=live.pk)
    outcome = channel(world, member, a_request(world, 2))
    assert outcome.deployment is None
    assert list(outcome.errors) == [""]
    assert (
        f"Cannot roll deployment {live.pk}, this model's live Red-Black deployment"
        in (outcome.errors[""])
    )
    assert "already under way (pending)" in outcome.errors[""]
    assert Deployment.objects.values().get(pk=live.pk) == before  # the settings too


def test_another_instance_type_is_refused_not_ignored(channel, world, member):
    live = make_deployment(world.model, world.versions[0], world.cpu)
    serve(live)
    outcome = channel(world, member, a_request(world, 2, instance_type=world.gpu))
    assert outcome.deployment is None
    assert list(outcome.errors) == ["instance_type"]
    assert "a rollout keeps its instance type: choose cpu-local" in outcome.errors["instance_type"]
    live.refresh_from_db()
    assert shape(live) == ("red_black", 1, None, 1, [10, 50, 100], 60, "serving")


def test_versioned_beside_a_live_red_black_is_a_new_deployment(channel, world, member):
    live = make_deployment(world.model, world.versions[0], world.cpu)
    serve(live)
    outcome = channel(world, member, a_request(world, 2, "versioned"))
    created = Deployment.objects.exclude(pk=live.pk).get()
    assert outcome == Outcome(created.pk, {})
    assert shape(created) == ("versioned", 2, None, 2, [25, 100], 5, "pending")


def test_a_version_already_served_versioned_is_a_conflict(channel, world, member):
    first = make_deployment(world.model, world.versions[0], world.cpu, "versioned")
    outcome = channel(world, member, a_request(world, 1, "versioned"))
    assert outcome.deployment is None
    assert "version 1 already has a live Versioned deployment" in outcome.errors[""]
    assert f"(deployment {first.pk})" in outcome.errors[""]
    assert Deployment.objects.count() == 1


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("replicas", 65, "less than or equal to 64"),
        ("replicas", 0, "greater than or equal to 1"),
        ("bake_seconds", 24 * 3600 + 1, "less than or equal to 86400"),
        ("health_deadline_seconds", 24 * 3600 + 1, "less than or equal to 86400"),
        ("max_error_rate", 1.5, "less than or equal to 1"),
        ("stages", [50, 10, 100], "increasing"),
    ],
)
def test_limits_are_the_same_for_both(channel, world, member, field, value, needle):
    outcome = channel(world, member, a_request(world, 1, **{field: value}))
    assert outcome.deployment is None
    assert list(outcome.errors) == [field], outcome
    assert needle in outcome.errors[field]
    assert not Deployment.objects.exists()


# --- The service enforces the limits itself ----------------------------------------------------


@pytest.mark.parametrize("replicas", [0, 65])
def test_the_service_enforces_the_replica_limit_itself(world, replicas):
    from django.core.exceptions import ValidationError

    from portal.core.actors import Actor
    from portal.deployments import services

    actor = Actor(label="user:test")
    common = {"model": world.model, "instance_type": world.cpu, "actor": actor}
    for call in (services.deploy, services.create_deployment):
        with pytest.raises(ValidationError) as refused:
            call(strategy="red_black", version=world.versions[0], replicas=replicas, **common)
        assert list(refused.value.message_dict) == ["replicas"]
    assert not Deployment.objects.exists()

    live = make_deployment(world.model, world.versions[0], world.cpu)
    with pytest.raises(ValidationError) as refused:
        services.update_deployment(live, actor=actor, replicas=replicas)
    assert list(refused.value.message_dict) == ["replicas"]
    live.refresh_from_db()
    assert live.replicas == 1


def test_the_service_enforces_the_other_limits_too(world):
    from django.core.exceptions import ValidationError

    from portal.core.actors import Actor
    from portal.deployments import services

    live = make_deployment(world.model, world.versions[0], world.cpu)
    with pytest.raises(ValidationError) as refused:
        services.update_deployment(
            live,
            actor=Actor(label="user:test"),
            bake_seconds=-1,
            health_deadline_seconds=0,
            max_error_rate=2.0,
            stages=[10, 50],
        )
    assert sorted(refused.value.message_dict) == [
        "bake_seconds", "health_deadline_seconds", "max_error_rate", "stages",
    ]  # fmt: skip


def test_an_api_call_naming_only_the_version_keeps_the_live_settings(world, member):
    from rest_framework.test import APIClient

    live = make_deployment(world.model, world.versions[0], world.cpu, replicas=3, bake_seconds=7)
    serve(live)
    client = APIClient()
    client.force_login(member)
    body = {
        "model": world.model.pk,
        "version": world.versions[1].pk,
        "strategy": "red_black",
        "instance_type": "cpu-local",
    }
    response = client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 200, response.content  # rolled, not created
    assert response.json()["id"] == live.pk
    live.refresh_from_db()
    assert shape(live) == ("red_black", 2, 1, 3, [10, 50, 100], 7, "pending")
    # Asking again for what is already rolling out changes nothing and is no conflict.
    events = DeploymentEvent.objects.count()
    again = client.post("/api/v1/deployments/", body, format="json")
    assert (again.status_code, again.json()["id"]) == (200, live.pk)
    assert DeploymentEvent.objects.count() == events


def test_the_current_stage_and_percent_have_one_home(world, member):
    """The API's ``current_stage``/``stage_percent`` are the status's (:mod:`~portal.deployments.rollout.status`): a first
    Red-Black deploy goes all at once and has no stage, whatever stage the controller counts."""
    from rest_framework.test import APIClient

    from portal.deployments.rollout.status import describe

    deployment = make_deployment(world.model, world.versions[0], world.cpu)
    client = APIClient()
    client.force_login(member)

    def seen() -> tuple:
        deployment.refresh_from_db()
        body = client.get(f"/api/v1/deployments/{deployment.pk}/").json()
        status = describe(deployment)
        assert body["status"]["headline"] == status.headline
        return body["current_stage"], body["stage_percent"], status.stage, status.headline

    assert seen() == (0, None, None, "Waiting for v1 to be ready (registered)")
    Deployment.objects.filter(pk=deployment.pk).update(
        current_stage=2, observed_state="progressing"
    )
    assert seen() == (
        0,
        None,
        None,
        "Deploying v1 (all at once): waiting for instances (0 of 1 ready)",
    )
    # Replacing a serving version is staged: stage 2 of the three asks for 50%.
    Deployment.objects.filter(pk=deployment.pk).update(
        previous_version=world.versions[0], target_version=world.versions[1], traffic={1: 90, 2: 10}
    )
    assert seen()[:3] == (2, 50, 2)
    Deployment.objects.filter(pk=deployment.pk).update(current_stage=4)  # past the last: none
    assert seen()[:3] == (0, None, None)


# --- quotas -------------------------------------------------------------------------------------


def test_a_team_at_its_live_deployment_quota_is_refused_naming_it(channel, world, member):
    world.team.max_live_deployments = 1
    world.team.save()
    make_deployment(world.model, world.versions[0], world.cpu, "versioned")
    outcome = channel(world, member, a_request(world, 2, "versioned"))
    assert outcome.deployment is None
    assert "quota of 1 live deployments would be exceeded: 1 in use" in outcome.errors[""]
    assert Deployment.objects.count() == 1


def test_gpus_count_replicas_times_the_instance_types_gpus(channel, world, member):
    world.team.max_gpus = 1
    world.team.save()
    outcome = channel(world, member, a_request(world, 1, instance_type=world.gpu, replicas=2))
    assert "quota of 1 GPUs would be exceeded: 0 in use" in outcome.errors[""]
    assert "this asks for 2 GPU(s)" in outcome.errors[""]
    assert not Deployment.objects.exists()
    ok = channel(world, member, a_request(world, 1, instance_type=world.gpu, replicas=1))
    assert ok.deployment is not None


def test_scaling_past_the_instance_quota_changes_nothing(channel, world, member):
    world.team.max_instances = 3
    world.team.save()
    live = make_deployment(world.model, world.versions[0], world.cpu)
    serve(live)
    before = Deployment.objects.values().get(pk=live.pk)
    outcome = channel(world, member, a_request(world, 2, replicas=4))
    assert "quota of 3 instances would be exceeded: 0 in use" in outcome.errors[""]
    assert Deployment.objects.values().get(pk=live.pk) == before  # nor its rollout settings
    assert channel(world, member, a_request(world, 2, replicas=3)).deployment == live.pk


def test_the_api_answers_a_quota_with_403_and_its_figures(world, member):
    from rest_framework.test import APIClient

    world.team.max_instances = 1
    world.team.save()
    client = APIClient()
    client.force_login(member)
    response = client.post(
        "/api/v1/deployments/",
        {**a_request(world, 1), "model": world.model.pk, "instance_type": world.cpu.name},
        format="json",
    )
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert error["detail"] == {"quota": "instances", "limit": 1, "in_use": 0, "requested": 2}
