"""One truthful status: every state and strategy, stepped by the real controller on the in-memory
launcher, and at each point the headline, the stage, the progress, the bar, the API's fields,
the deployment page and the dashboard must agree with each other and with the traffic."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from portal.deployments import services
from portal.deployments.lifecycle import Action
from portal.deployments.models import Deployment
from portal.deployments.rollout.status import DeploymentStatus, describe, traffic_text
from portal.deployments.runtime.launchers.base import Health
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.deployments.test_controller import USER, ready_version, run_until, step
from tests.factories import make_model


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    M.reset()
    yield
    M.reset()


@pytest.fixture
def world(team, member, release, artifact_root, cpu_instance_type):
    model = make_model(team, "chat")
    v1, v2 = ready_version(model, artifact_root), ready_version(model, artifact_root)
    client = APIClient()
    client.force_login(member)
    return model, v1, v2, client, cpu_instance_type


def agree(deployment: Deployment, client: APIClient) -> DeploymentStatus:
    """The status, after checking that everything showing it says the same as the traffic."""
    deployment.refresh_from_db()
    status = describe(deployment, list(deployment.instances.all()))
    traffic = deployment.traffic
    # The bar is the traffic, old versions first, the target last; nothing invented.
    assert {s.version: s.percent for s in status.segments} == {
        n: p for n, p in traffic.items() if p
    }
    assert sum(s.percent for s in status.segments) in (0, 100)
    assert [s.role for s in status.segments if s.version == deployment.target_version.number] in (
        [],
        ["new"],
    )
    # The percent and progress are the heading-to version's share of that same traffic.
    heading = status.heading_to
    assert status.percent == (traffic.get(heading, 0) if heading is not None else 0)
    assert status.progress == status.percent / 100
    assert status.traffic == traffic_text(traffic, heading)
    # A stage only on a staged rollout in progress or paused; the headline counts it.
    if status.stage is not None:
        assert deployment.strategy == "red_black" and deployment.previous_version is not None
        assert deployment.observed_state in ("progressing", "paused")
        assert f"stage {status.stage} of {status.stage_count}" in status.headline
        assert status.stage_count == len(deployment.stages)
        assert status.stage_percent == deployment.stages[status.stage - 1]
        assert status.percent <= status.stage_percent
        assert f"{status.percent}%" in status.headline
    else:
        assert status.stage_count is None and status.stage_percent is None
        assert not re.search(r"stage \d", status.headline, re.IGNORECASE)
    assert "{" not in status.headline and "{" not in deployment.status_message
    # The API says the same, and its old fields are derived the same way.
    body = client.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert body["status"] == status.as_dict()
    assert body["current_stage"] == (status.stage or 0)
    assert body["stage_percent"] == status.stage_percent
    assert body["status"]["progress"] == body["status"]["percent"] / 100
    assert body["traffic"] == {str(n): p for n, p in traffic.items()}
    # The page shows the headline and draws the same bar.
    team = deployment.model.team.slug
    page = client.get(reverse("web:deployment_live", args=[team, deployment.pk]))
    html = page.content.decode()
    assert _text(status.headline) in html
    drawn = re.findall(r'data-version="(\d+)" data-percent="(\d+)"', html)
    assert [(int(v), int(p)) for v, p in drawn] == [(s.version, s.percent) for s in status.segments]
    assert f'data-percent="{status.percent}"' in html
    assert f'data-stage="{status.stage or ""}"' in html
    # The dashboard shows the same headline for it (a live or a failed one).
    dashboard = client.get(reverse("web:dashboard", args=[team])).content.decode()
    if deployment.observed_state in (
        "pending",
        "progressing",
        "paused",
        "serving",
        "rolling_back",
        "failed",
    ):
        assert _text(status.headline) in dashboard
    return status


def _text(headline: str) -> str:
    """The headline as the template escapes it."""
    return headline.replace("&", "&amp;").replace("'", "&#x27;").replace('"', "&quot;")


def serve_v1(world, replicas=2, **options) -> Deployment:
    model, v1, _, client, instance_type = world
    deployment = services.create_deployment(
        model=model,
        strategy="red_black",
        version=v1,
        instance_type=instance_type,
        actor=USER,
        replicas=replicas,
        bake_seconds=0,
        **options,
    )
    first = agree(deployment, client)
    assert first.headline == "Deploying v1 (all at once): starting"
    assert (first.level, first.badge, first.progress, first.segments) == ("warn", "waiting", 0, [])
    step(deployment, 2)
    scaling = agree(deployment, client)
    # The contradiction this fixes: "Stage 1 of 3 (10% on v1)" on a deploy that has no stages.
    assert deployment.current_stage == 1
    assert scaling.headline == (
        f"Deploying v1 (all at once): waiting for instances (0 of {replicas} ready)"
    )
    assert scaling.stage is None and scaling.percent == 0
    M.set_health(1, Health.READY)
    run_until(deployment, lambda d: d.observed_state == "serving")
    serving = agree(deployment, client)
    assert serving.headline == "Serving v1"
    assert (serving.level, serving.badge, serving.progress) == ("ok", f"{replicas} ready", 1.0)
    assert [(s.label, s.percent, s.role) for s in serving.segments] == [("v1", 100, "new")]
    return deployment


def test_traffic_reads_as_words_with_the_rolling_in_version_first():
    assert traffic_text({1: 90, 2: 10}, 2) == "v2 10% · v1 90%"
    assert traffic_text({1: 90, 2: 10}, 1) == "v1 90% · v2 10%"
    assert traffic_text({3: 100}) == "v3 100%"
    assert traffic_text({}) == "no traffic"


def test_a_first_red_black_deploy_goes_all_at_once_without_stages(world):
    serve_v1(world, replicas=2)


def test_a_staged_rollout_at_each_stage_bake_and_completion(world):
    _, _, v2, client, _ = world
    deployment = serve_v1(world, replicas=2, stages=[25, 50, 100])
    services.update_deployment(deployment, actor=USER, version=v2, bake_seconds=3600)
    pending = agree(deployment, client)
    assert pending.headline == "Rolling out v1 → v2: starting"
    step(deployment, 2)
    scaling = agree(deployment, client)
    assert scaling.headline == (
        "Rolling out v1 → v2: stage 1 of 3, 0% on v2; starting v2 instances for 25% (0 of 1 ready)"
    )
    assert (scaling.stage, scaling.stage_count, scaling.stage_percent) == (1, 3, 25)
    assert scaling.progress == 0
    M.set_health(2, Health.READY)
    run_until(deployment, lambda d: d.step.phase == "bake")
    baking = agree(deployment, client)
    assert baking.headline == "Baking v2 at 25% (stage 1 of 3)"
    assert (baking.stage, baking.percent, baking.progress) == (1, 25, 0.25)
    assert [(s.label, s.percent, s.role) for s in baking.segments] == [
        ("v1", 75, "old"),
        ("v2", 25, "new"),
    ]
    assert baking.traffic == "v2 25% · v1 75%"
    assert baking.bake_ends_at == deployment.step.bake_started_at + 3600  # the countdown's end
    assert scaling.bake_ends_at is None and pending.bake_ends_at is None
    # The bake ends: stage 2 scales first, so traffic is still stage 1's and says so.
    services.update_deployment(deployment, actor=USER, bake_seconds=0)
    run_until(deployment, lambda d: d.current_stage == 2)
    next_stage = agree(deployment, client)
    assert next_stage.stage == 2 and next_stage.stage_percent == 50
    assert next_stage.headline.startswith("Rolling out v1 → v2: stage 2 of 3, 25% on v2")
    M.finish_draining()
    run_until(deployment, lambda d: d.step.phase == "bake" and d.current_stage == 2)
    assert agree(deployment, client).headline == "Baking v2 at 50% (stage 2 of 3)"
    for _ in range(30):
        M.set_health(2, Health.READY)
        M.finish_draining()
        if step(deployment).observed_state == "serving":
            break
    done = agree(deployment, client)
    assert done.headline == "Serving v2" and done.progress == 1.0
    # "Rollout complete" was what the page said even after a rollback; now it names the version.
    assert deployment.current_stage == 3 and done.stage is None


def test_paused_then_promoted(world):
    _, _, v2, client, _ = world
    deployment = serve_v1(world, replicas=1, stages=[10, 50, 100])
    services.update_deployment(deployment, actor=USER, version=v2, bake_seconds=3600)
    step(deployment, 2)
    M.set_health(2, Health.READY)
    run_until(deployment, lambda d: d.step.phase == "bake")
    services.act(deployment, Action.PAUSE, actor=USER)
    asked = agree(deployment, client)
    assert asked.headline == "Baking v2 at 10% (stage 1 of 3) · pause requested"
    step(deployment)
    paused = agree(deployment, client)
    assert paused.headline == "Paused at stage 1 of 3: 10% on v2"
    assert (paused.level, paused.badge, paused.stage, paused.progress) == ("warn", "paused", 1, 0.1)
    assert deployment.status_message == "Paused at stage 1 of 3; traffic stays v2 10% · v1 90%."
    services.act(deployment, Action.PROMOTE, actor=USER)
    assert agree(deployment, client).headline.endswith(" · promote requested")
    step(deployment, 2)
    promoted = agree(deployment, client)
    assert promoted.stage == 3 and promoted.stage_percent == 100
    services.update_deployment(deployment, actor=USER, bake_seconds=0)
    for _ in range(30):
        M.set_health(2, Health.READY)
        M.finish_draining()
        if step(deployment).observed_state == "serving":
            break
    assert agree(deployment, client).headline == "Serving v2"


def test_a_rollback_in_progress_and_done(world, settings):
    _, _, v2, client, _ = world
    settings.INSTANCE_RESTART_BACKOFF_SECONDS = 600
    deployment = serve_v1(world, replicas=2, stages=[50, 100])
    services.update_deployment(deployment, actor=USER, version=v2, bake_seconds=3600)
    step(deployment, 2)
    M.set_health(2, Health.READY)
    run_until(deployment, lambda d: d.step.phase == "bake")
    M.finish_draining()
    step(deployment)
    # v1 stays whole through the stages; one of its instances is lost, so the rollback must
    # restore it before v1 takes the traffic back.
    lost = next(name for name, entry in M.table.items() if entry[1] == 1)
    M.table[lost][2:] = [Health.CRASHED, "exit status -9"]
    services.act(deployment, Action.ROLLBACK, actor=USER, reason="bad answers")
    assert agree(deployment, client).headline.endswith(" · rollback requested")
    step(deployment, 2)
    restoring = agree(deployment, client)
    # The contradiction this fixes: "Stage 2 of 2 (100% on v2)" while v1 was getting it back.
    assert deployment.observed_state == "rolling_back" and deployment.current_stage == 1
    assert restoring.stage is None and restoring.heading_to == 1
    assert restoring.headline == (
        "Rolling back to v1: 50% on v1, restoring its instances (1 of 2 ready)"
    )
    assert (restoring.progress, restoring.detail) == (0.5, "rollback requested")
    assert (restoring.level, restoring.badge) == ("warn", "rolling back")
    M.set_health(1, Health.READY)
    step(deployment)
    draining = agree(deployment, client)
    assert draining.headline == "Rolling back to v1: 100% on v1, draining v2"
    assert draining.progress == 1.0
    assert [(s.label, s.percent, s.role) for s in draining.segments] == [("v1", 100, "old")]
    M.finish_draining()
    run_until(deployment, lambda d: d.observed_state == "serving")
    done = agree(deployment, client)
    assert done.headline == "Rolled back from v2 to v1"
    assert done.rolled_back_from == 2  # the page offers to roll forward to it
    assert done.detail == "rollback requested"
    assert done.progress == 1.0 and done.stage is None


def test_versioned_deploys_all_at_once_and_serves(world):
    model, _, v2, client, instance_type = world
    deployment = services.create_deployment(
        model=model, strategy="versioned", version=v2, instance_type=instance_type, actor=USER
    )
    assert agree(deployment, client).headline == "Deploying Versioned v2: starting"
    step(deployment, 2)
    scaling = agree(deployment, client)
    # The contradiction this fixes: "Stage 1/3" on a deployment that has no stages.
    assert scaling.headline == "Deploying Versioned v2: waiting for instances (0 of 1 ready)"
    M.set_health(2, Health.READY)
    run_until(deployment, lambda d: d.observed_state == "serving")
    serving = agree(deployment, client)
    assert serving.headline == "Versioned v2: serving"
    assert (serving.level, serving.badge, serving.progress) == ("ok", "1 ready", 1.0)


def test_a_first_deploy_that_crashes_fails_and_the_dashboard_says_so(world):
    model, v1, _, client, instance_type = world
    deployment = services.create_deployment(
        model=model,
        strategy="red_black",
        version=v1,
        instance_type=instance_type,
        actor=USER,
        health_deadline_seconds=600,
    )
    step(deployment, 2)
    M.set_health(1, Health.CRASHED, "exit status 1")
    step(deployment)
    stopping = agree(deployment, client)
    assert deployment.observed_state == "rolling_back"
    assert stopping.headline == "Stopping v1: nothing to roll back to"
    assert "crashed: exit status 1" in stopping.detail
    run_until(deployment, lambda d: d.observed_state == "failed")
    failed = agree(deployment, client)
    assert failed.headline.startswith("Failed: Instance ") and "crashed" in failed.headline
    assert (failed.level, failed.badge, failed.segments, failed.progress) == (
        "bad",
        "failed",
        [],
        0,
    )
    # Not a grey "not deployed": the dashboard row is red and names the failure.
    dashboard = client.get(reverse("web:dashboard", args=[model.team.slug])).content.decode()
    assert 'badge badge-bad" data-testid="health">failed<' in dashboard


def test_two_versioned_deployments_count_all_their_ready_instances(world):
    model, v1, v2, client, instance_type = world
    for version in (v1, v2):
        deployment = services.create_deployment(
            model=model, strategy="versioned", version=version, instance_type=instance_type,
            actor=USER,
        )  # fmt: skip
        step(deployment, 2)
        M.set_health(version.number, Health.READY)
        run_until(deployment, lambda d: d.observed_state == "serving")
    dashboard = client.get(reverse("web:dashboard", args=[model.team.slug])).content.decode()
    assert 'data-testid="health">2 ready<' in dashboard
