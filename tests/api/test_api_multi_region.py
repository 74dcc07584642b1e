"""Multi-region deployments through the API: regions, create, the team's scope, new versions by
PATCH and the actions, with each region's launcher moved by hand (tests/deployments/test_waves.py)."""

from __future__ import annotations

import pytest

from portal.deployments.models import Deployment, MultiRegionDeployment, Region
from tests.api.helpers import api_error, nothing_created, ok
from tests.deployments.memory_launcher import MemoryLauncher
from tests.deployments.test_controller import ready_version
from tests.deployments.test_waves import NAMES, World
from tests.factories import make_model

pytestmark = pytest.mark.django_db

GROUPS = "/api/v1/multi-region-deployments/"
DEPLOYMENTS = "/api/v1/deployments/"


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    MemoryLauncher.reset()
    yield
    MemoryLauncher.reset()


@pytest.fixture
def regions(db, cpu_instance_type):
    made = [Region.objects.create(name=name) for name in NAMES]
    made[0].gateway_url = "https://us-east.models.example.com/"
    made[0].save()
    made[2].instance_types.add(cpu_instance_type)
    return made


@pytest.fixture
def versions(team, release, artifact_root):
    model = make_model(team, "chat")
    return model, ready_version(model, artifact_root), ready_version(model, artifact_root)


@pytest.fixture
def client(api, member_token):
    return api(member_token)


def body(versions, regions=("us-east", "eu-west"), **extra) -> dict:
    model, v1, _ = versions
    return {
        "model": model.pk,
        "version": v1.pk,
        "regions": [{"region": name, "replicas": 1} for name in regions],
        "instance_type": "cpu-local",
        "bake_seconds": 0,
        "wave_bake_seconds": 0,
        **extra,
    }


def create(client, versions, **extra) -> dict:
    return ok(client.post(GROUPS, body(versions, **extra), format="json"), 201)


def world_of(answer: dict) -> World:
    return World(MultiRegionDeployment.objects.get(pk=answer["id"]))


def test_regions_are_listed_for_anyone_signed_in(api, viewer, regions, cpu_instance_type):
    listed = ok(api(viewer).get("/api/v1/regions/"))["results"]
    by_name = {r["name"]: r for r in listed}
    assert set(NAMES) <= set(by_name)
    assert by_name["us-east"]["gateway_url"] == "https://us-east.models.example.com"
    assert by_name["eu-west"]["gateway_url"]  # the platform's gateway when unset
    assert by_name["ap-south"]["instance_types"] == ["cpu-local"]
    assert by_name["us-east"] == {
        "name": "us-east",
        "description": "",
        "is_default": False,
        "gateway_url": "https://us-east.models.example.com",
        "instance_types": [],
    }
    assert ok(api(viewer).get("/api/v1/regions/ap-south/"))["name"] == "ap-south"
    assert api().get("/api/v1/regions/").status_code == 401


def test_create_lists_the_regions_in_wave_order(client, versions, regions):
    answer = create(client, versions, on_region_failure="halt")
    assert answer["observed_state"] == "pending"
    assert answer["on_region_failure"] == "halt"
    assert answer["target_version"] == versions[1].number
    assert answer["wave"] == {"current": 0, "count": 2, "phase": "", "bake_ends_at": None}
    assert [(r["region"], r["wave"]) for r in answer["regions"]] == [
        ("us-east", 1),
        ("eu-west", 2),
    ]
    first, second = answer["regions"]
    assert first["replicas"] == 1 and first["instances_ready"] == 0
    assert second["desired_state"] == "paused"  # held until its wave
    assert set(first) == {
        "region", "wave", "deployment", "observed_state", "desired_state", "current_stage",
        "stage_count", "traffic", "replicas", "instances_ready", "status_message",
    }  # fmt: skip
    # Each region's deployment names its region and its place in the waves.
    regional = ok(client.get(f"{DEPLOYMENTS}{second['deployment']}/"))
    assert (regional["region"], regional["multi_region"], regional["wave"]) == (
        "eu-west",
        answer["id"],
        2,
    )
    # The controllers take it region by region to serving.
    world = world_of(answer)
    world.run_until(lambda g: g.observed_state == "serving")
    answer = ok(client.get(f"{GROUPS}{answer['id']}/"))
    assert answer["observed_state"] == "serving"
    assert answer["wave"]["count"] == 2
    assert [r["observed_state"] for r in answer["regions"]] == ["serving", "serving"]
    assert [r["traffic"] for r in answer["regions"]] == [{"1": 100}, {"1": 100}]
    assert [r["instances_ready"] for r in answer["regions"]] == [1, 1]
    assert ok(client.get(GROUPS))["results"][0]["id"] == answer["id"]


def test_a_bad_region_is_refused_on_its_field(client, versions, regions):
    with nothing_created():
        response = client.post(GROUPS, body(versions, regions=("us-east", "mars")), format="json")
    error = api_error(response, 400, "invalid")
    assert error["fields"].keys() == {"regions"}
    assert "mars" in error["fields"]["regions"][0]
    response = client.post(GROUPS, body(versions, regions=("us-east", "us-east")), format="json")
    assert api_error(response, 400, "invalid")["fields"].keys() == {"regions"}
    response = client.post(GROUPS, body(versions, regions=()), format="json")
    assert api_error(response, 400, "invalid")["fields"].keys() == {"regions"}
    response = client.post(
        GROUPS, {**body(versions), "regions": [{"region": "us-east", "size": 1}]}, format="json"
    )
    assert all(name.startswith("regions") for name in api_error(response, 400, "invalid")["fields"])


def test_another_teams_is_not_found(client, api, outsider, viewer, versions, regions):
    answer = create(client, versions)
    other = api(outsider)
    assert api_error(other.get(f"{GROUPS}{answer['id']}/"), 404, "not_found")
    assert ok(other.get(GROUPS))["results"] == []
    assert other.post(f"{GROUPS}{answer['id']}/pause/", {}, format="json").status_code == 404
    response = other.patch(f"{GROUPS}{answer['id']}/", {"version": versions[2].pk}, format="json")
    assert response.status_code == 404
    # Their model is unknown to them (400 on the field, like a missing one).
    response = other.post(GROUPS, body(versions), format="json")
    assert api_error(response, 400, "invalid")["fields"].keys() == {"model"}
    # A viewer reads but does not act.
    assert ok(api(viewer).get(f"{GROUPS}{answer['id']}/"))["id"] == answer["id"]
    response = api(viewer).post(f"{GROUPS}{answer['id']}/pause/", {}, format="json")
    assert api_error(response, 403, "permission_denied")


def test_actions_answer_as_the_deployments_do(client, versions, regions):
    answer = create(client, versions)
    url = f"{GROUPS}{answer['id']}/"
    paused = ok(client.post(url + "pause/", {"reason": "looking"}, format="json"))
    assert paused["desired_state"] == "paused"
    assert api_error(client.post(url + "pause/", {}, format="json"), 409, "invalid_transition")
    assert ok(client.post(url + "resume/", {}, format="json"))["desired_state"] == "active"
    # Nothing to roll back to on a first deploy.
    error = api_error(client.post(url + "rollback/", {}, format="json"), 409, "invalid_transition")
    assert "no previous version" in error["message"]
    world = world_of(answer)
    world.run_until(lambda g: g.observed_state == "serving")
    # Serving: nothing to pause, promote or abort.
    for name in ("pause", "promote", "abort"):
        assert api_error(
            client.post(url + f"{name}/", {}, format="json"), 409, "invalid_transition"
        )
    # Acting on a region's deployment instead is refused: act on the whole.
    regional = answer["regions"][0]["deployment"]
    response = client.post(f"{DEPLOYMENTS}{regional}/pause/", {}, format="json")
    assert response.status_code == 409
    reasons = Deployment.objects.get(pk=regional).events.filter(data__reason="looking")
    assert reasons.exists()


def test_patch_rolls_a_new_version_out_region_by_region(client, versions, regions):
    _, v1, v2 = versions
    answer = create(client, versions)
    url = f"{GROUPS}{answer['id']}/"
    # Not while the first rollout is under way.
    response = client.patch(url, {"version": v2.pk}, format="json")
    assert api_error(response, 409, "conflict")
    world = world_of(answer)
    world.run_until(lambda g: g.observed_state == "serving")
    assert api_error(client.patch(url, {"version": v1.pk}, format="json"), 400, "invalid")
    assert api_error(client.patch(url, {"version": 999999}, format="json"), 400, "invalid")
    answer = ok(client.patch(url, {"version": v2.pk, "allow_io_change": False}, format="json"))
    assert answer["observed_state"] == "pending"
    assert (answer["target_version"], answer["previous_version"]) == (v2.number, v1.number)
    world.step()
    answer = ok(client.get(url))
    assert answer["observed_state"] == "progressing"
    assert answer["wave"]["current"] == 1 and answer["wave"]["phase"] == "rollout"
    assert Deployment.objects.get(pk=answer["regions"][0]["deployment"]).target_version == v2
    assert Deployment.objects.get(pk=answer["regions"][1]["deployment"]).target_version == v1
    # Promote finishes every region.
    assert ok(client.post(url + "promote/", {}, format="json"))["promote_requested"] is True
    world.run_until(lambda g: g.observed_state == "serving")
    assert world.serving() == {"us-east": 2, "eu-west": 2}
    answer = ok(client.get(url))
    assert [r["traffic"] for r in answer["regions"]] == [{"2": 100}, {"2": 100}]
    # And now there is a version to go back to.
    assert ok(client.post(url + "rollback/", {}, format="json"))["desired_state"] == "rollback"


def test_a_deployment_goes_to_the_region_named(client, versions, regions):
    model, v1, _ = versions
    deploy = {"model": model.pk, "strategy": "red_black", "version": v1.pk}
    deploy["instance_type"] = "cpu-local"
    answer = ok(client.post(DEPLOYMENTS, {**deploy, "region": "eu-west"}, format="json"), 201)
    assert (answer["region"], answer["multi_region"], answer["wave"]) == ("eu-west", None, 0)
    with nothing_created():
        response = client.post(DEPLOYMENTS, {**deploy, "region": "mars"}, format="json")
    assert api_error(response, 400, "invalid")["fields"].keys() == {"region"}
    # None named: the default region.
    answer = ok(client.post(DEPLOYMENTS, deploy, format="json"), 201)
    assert Region.objects.get(name=answer["region"]).is_default


def test_each_region_judges_its_own_bakes_with_the_policy_given(client, versions, regions):
    with nothing_created():
        response = client.post(
            GROUPS,
            body(versions, stages=[50, 100], canary_policy={"pass_score": "high"}),
            format="json",
        )
    assert list(api_error(response, 400, "invalid")["fields"]) == ["canary_policy.pass_score"]
    answer = create(
        client,
        versions,
        stages=[50, 100],
        canary_analysis=True,
        canary_policy={"metrics": [{"name": "error_rate"}]},
    )
    regional = Deployment.objects.filter(multi_region_id=answer["id"])
    assert regional.count() == 2
    for deployment in regional:
        assert deployment.canary_analysis is True
        assert [m["name"] for m in deployment.canary_policy["metrics"]] == ["error_rate"]
