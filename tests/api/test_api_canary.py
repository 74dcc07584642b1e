"""Canary analysis through the API: the policy set at deploy and by PATCH, refused by field, and
each bake's analysis read back (``GET .../deployments/{id}/analysis/``)."""

from __future__ import annotations

import pytest

from portal.deployments.models import Deployment
from tests.api.helpers import api_error, nothing_created, ok
from tests.factories import make_deployment, make_stage_analysis, make_version

pytestmark = pytest.mark.django_db

DEPLOYMENTS = "/api/v1/deployments/"


@pytest.fixture
def v1(model, release, artifact_root):
    return make_version(model, artifact_root)


@pytest.fixture
def client(api, member_token):
    return api(member_token)


def body(model, version, **overrides) -> dict:
    return {
        "model": model.pk,
        "version": version.pk,
        "strategy": "red_black",
        "instance_type": "cpu-local",
        "stages": [10, 50, 100],
        **overrides,
    }


def test_a_deploy_with_canary_analysis_stores_the_whole_policy(
    client, model, v1, cpu_instance_type
):
    policy = {"metrics": [{"name": "latency_s", "max_change": 0.3}, {"name": "error_rate"}]}
    answer = ok(
        client.post(
            DEPLOYMENTS, body(model, v1, canary_analysis=True, canary_policy=policy), format="json"
        ),
        201,
    )
    assert answer["canary_analysis"] is True
    latency = answer["canary_policy"]["metrics"][0]
    # Fields left out took the platform default's for that metric.
    assert latency == {**latency, "name": "latency_s", "max_change": 0.3, "min_samples": 1000}
    assert answer["canary_policy"]["pass_score"] == 95
    assert Deployment.objects.get(pk=answer["id"]).canary_policy == answer["canary_policy"]


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"metrics": [{"name": "latency_s", "alpha": 2}]}, "canary_policy.metrics[0].alpha"),
        ({"metrics": [{"name": "gpu_temperature"}]}, "canary_policy.metrics[0].name"),
        ({"metrics": [{"name": "latency_s", "colour": "red"}]}, "canary_policy.metrics[0].colour"),
        ({"pass_score": 50, "marginal_score": 80}, "canary_policy.marginal_score"),
        ({"metrics": "latency_s"}, "canary_policy.metrics"),
        ([1, 2], "canary_policy"),
    ],
)
def test_a_bad_policy_is_refused_by_field(client, model, v1, cpu_instance_type, policy, field):
    with nothing_created():
        response = client.post(
            DEPLOYMENTS, body(model, v1, canary_analysis=True, canary_policy=policy), format="json"
        )
    fields = api_error(response, 400, "invalid")["fields"]
    assert list(fields) == [field], fields


def test_canary_analysis_needs_a_stage_below_100(client, model, v1, cpu_instance_type):
    with nothing_created():
        response = client.post(
            DEPLOYMENTS, body(model, v1, stages=[100], canary_analysis=True), format="json"
        )
    assert "below 100%" in api_error(response, 400, "invalid")["fields"]["canary_analysis"][0]


def test_patch_turns_it_on_and_changes_the_policy(client, model, v1, cpu_instance_type):
    deployment = make_deployment(model, v1, cpu_instance_type)
    url = f"{DEPLOYMENTS}{deployment.pk}/"
    answer = ok(client.patch(url, {"canary_analysis": True}, format="json"))
    assert answer["canary_analysis"] is True
    answer = ok(
        client.patch(url, {"canary_policy": {"metrics": [{"name": "error_rate"}]}}, format="json")
    )
    assert [m["name"] for m in answer["canary_policy"]["metrics"]] == ["error_rate"]
    response = client.patch(url, {"canary_policy": {"pass_score": 101}}, format="json")
    assert list(api_error(response, 400, "invalid")["fields"]) == ["canary_policy.pass_score"]


def test_each_bakes_analysis_is_read_back_by_the_team_only(
    client, api, outsider, model, v1, cpu_instance_type
):
    deployment = make_deployment(model, v1, cpu_instance_type)
    verdict = {"name": "latency_s", "kind": "latency", "verdict": "fail", "reason": "3x slower"}
    make_stage_analysis(
        deployment,
        verdicts=[verdict],
        sample={"baseline": {"requests": 1200}, "canary": {"requests": 1100}},
    )
    url = f"{DEPLOYMENTS}{deployment.pk}/analysis/"
    [analysis] = ok(client.get(url))
    assert analysis["decision"] == "rollback" and analysis["verdicts"] == [verdict]
    assert analysis["window_start"].startswith("2026-12-07T12:00:00")
    assert analysis["sample"]["canary"]["requests"] == 1100
    assert api(outsider).get(url).status_code == 404
