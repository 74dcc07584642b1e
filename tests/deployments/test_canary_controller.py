"""The controller's canary analysis, step by step, on the memory launcher: each version's
instances list an ``openai`` endpoint served by an :class:`ObservationsServer` holding the
requests the test wants judged; the bake's window is moved into the past instead of waited for.

What each decision does to the rollout: promote goes on, rollback restores the old version,
too few requests lengthens the bake and then holds for a person; and what is refused."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.core.exceptions import ValidationError

from portal.deployments import services
from portal.deployments.lifecycle import Action
from portal.deployments.models import Deployment, StageAnalysis
from portal.deployments.runtime.launchers.base import Health
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.deployments.observations_server import ObservationsServer
from tests.deployments.test_controller import USER, ready_version, run_until, serve_v1, step
from tests.factories import make_model, make_stage_analysis

pytestmark = pytest.mark.usefixtures("memory_launcher")

#: A small policy so that a test needs hundreds of requests, not thousands: latency judged
#: (critical), errors judged; the rest reported only.
POLICY = {
    "metrics": [
        {"name": "latency_s", "min_samples": 200, "max_change": 0.2, "critical": True},
        {"name": "error_rate", "min_samples": 200},
        {"name": "completion_tokens", "min_samples": 200, "report_only": True},
    ]
}
BAKE = 60


@pytest.fixture
def versions(team, release, artifact_root):
    model = make_model(team, "chat")
    return model, ready_version(model, artifact_root), ready_version(model, artifact_root)


@pytest.fixture
def servers():
    made = {1: ObservationsServer(), 2: ObservationsServer()}
    M.openai_urls = {number: server.url for number, server in made.items()}
    yield made
    for server in made.values():
        server.close()


def canary_deployment(versions, instance_type, **options) -> Deployment:
    model, v1, _ = versions
    return serve_v1(
        model,
        v1,
        instance_type,
        replicas=1,
        stages=[50, 100],
        canary_analysis=True,
        canary_policy=options.pop("policy", POLICY),
        **options,
    )


def into_first_bake(deployment: Deployment, v2) -> Deployment:
    services.update_deployment(deployment, actor=USER, version=v2, bake_seconds=BAKE)
    step(deployment, 2)
    M.set_health(2, Health.READY)
    return run_until(deployment, lambda d: d.step.phase == "bake")


def bake_over(deployment: Deployment) -> tuple[float, float]:
    """Move the bake's start a whole bake (and its extensions) into the past, as if it had run;
    returns the window's bounds."""
    deployment.refresh_from_db()
    span = BAKE * (1 + deployment.step.extensions)
    started = time.time() - span - 1
    step_now = deployment.step.but(bake_started_at=started)
    Deployment.objects.filter(pk=deployment.pk).update(step=step_now)
    return started, started + span


def messages(deployment: Deployment) -> list[str]:
    return [e.message for e in deployment.events.all()]


def test_equal_versions_are_promoted_stage_by_stage(versions, cpu_instance_type, servers):
    deployment = canary_deployment(versions, cpu_instance_type)
    into_first_bake(deployment, versions[2])
    since, until = bake_over(deployment)
    servers[1].add_requests(400, since, until, seed=1)
    servers[2].add_requests(400, since, until, seed=2)
    run_until(deployment, lambda d: d.current_stage == 2)
    [analysis] = StageAnalysis.objects.filter(deployment=deployment)
    assert (analysis.stage, analysis.percent, analysis.decision) == (1, 50, "promote")
    assert (analysis.canary_version, analysis.baseline_version) == (2, 1)
    assert analysis.sample["baseline"]["requests"] == 400
    assert analysis.sample["canary"]["requests"] == 400
    latency = next(v for v in analysis.verdicts if v["name"] == "latency_s")
    assert latency["verdict"] == "pass" and latency["canary_count"] == 400
    assert analysis.window_start.timestamp() == pytest.approx(since, abs=0.01)
    assert any(
        m.startswith(
            "Stage 1 of 2 baked: healthy, error rate in bounds; canary analysis of stage 1"
        )
        for m in messages(deployment)
    ), messages(deployment)
    # Stage 2 is 100%: v1 takes nothing, so it is not judged, and the timeline says why.
    run_until(deployment, lambda d: d.step.phase == "bake")
    bake_over(deployment)
    run_until(deployment, lambda d: d.observed_state == "serving")
    M.finish_draining()
    assert StageAnalysis.objects.filter(deployment=deployment).count() == 1
    assert any("no canary analysis at 100%" in m for m in messages(deployment))


def test_a_slower_new_version_is_rolled_back_by_the_latency_verdict(
    versions, cpu_instance_type, servers
):
    deployment = canary_deployment(versions, cpu_instance_type)
    into_first_bake(deployment, versions[2])
    since, until = bake_over(deployment)
    servers[1].add_requests(400, since, until, latency=0.2, seed=1)
    servers[2].add_requests(400, since, until, latency=0.6, seed=2)  # 3x slower
    deployment = run_until(deployment, lambda d: d.observed_state == "rolling_back")
    assert "canary analysis of stage 1: critical metric failed: latency_s fail" in (
        deployment.status_message
    )
    [analysis] = StageAnalysis.objects.filter(deployment=deployment)
    assert (analysis.decision, analysis.action) == ("rollback", "rolled back to v1")
    latency = next(v for v in analysis.verdicts if v["name"] == "latency_s")
    assert latency["ratio"] > 2.5 and latency["p_value"] < 0.01
    for _ in range(30):
        M.finish_draining()
        if step(deployment).observed_state == "serving":
            break
    assert deployment.observed_state == "serving", deployment.status_message
    assert deployment.target_version.number == 1


def test_too_few_requests_lengthen_the_bake_then_hold_for_a_person(
    versions, cpu_instance_type, servers, settings
):
    settings.CANARY_MAX_BAKE_EXTENSIONS = 2
    deployment = canary_deployment(versions, cpu_instance_type)
    into_first_bake(deployment, versions[2])
    since, until = bake_over(deployment)
    servers[1].add_requests(50, since, until)
    servers[2].add_requests(50, since, until)
    for extension in (1, 2):
        deployment = run_until(deployment, lambda d, n=extension: d.step.extensions == n)
        assert deployment.observed_state == "progressing"
        bake_over(deployment)
    deployment = run_until(deployment, lambda d: d.observed_state == "paused")
    assert deployment.desired_state == "paused"
    assert deployment.traffic == {1: 50, 2: 50}  # traffic stays as it was
    assert deployment.status_message.startswith("Held at stage 1 of 2: canary analysis of stage 1")
    assert "not enough data" in deployment.status_message
    assert "after 2 extension(s) of the bake" in deployment.status_message
    actions = [a.action for a in StageAnalysis.objects.filter(deployment=deployment)]
    assert actions == [
        f"bake extended by {BAKE} s",
        f"bake extended by {BAKE} s",
        "held for a person",
    ]
    assert all(
        a.decision == "not_enough_data" for a in StageAnalysis.objects.filter(deployment=deployment)
    )
    # A person resumes: the stage bakes again from the start, with no extension used.
    services.act(deployment, Action.RESUME, actor=USER)
    deployment = run_until(deployment, lambda d: d.step.phase == "bake")
    assert deployment.observed_state == "progressing" and deployment.step.extensions == 0
    assert deployment.current_stage == 1


def test_a_hold_between_the_scores_pauses_the_rollout(versions, cpu_instance_type, servers):
    """Two scored metrics, no critical one: a failed latency scores 50, between the policy's
    marginal score (40) and its pass score (95): a person decides."""
    policy = {
        "metrics": [
            {"name": "latency_s", "min_samples": 200, "max_change": 0.2, "critical": False},
            {"name": "error_rate", "min_samples": 200},
        ],
        "marginal_score": 40,
    }
    deployment = canary_deployment(versions, cpu_instance_type, policy=policy)
    into_first_bake(deployment, versions[2])
    since, until = bake_over(deployment)
    servers[1].add_requests(400, since, until, latency=0.2, seed=1)
    servers[2].add_requests(400, since, until, latency=0.6, seed=2)
    deployment = run_until(deployment, lambda d: d.observed_state == "paused")
    assert "score 50 between 40 and 95: latency_s fail" in deployment.status_message
    [analysis] = StageAnalysis.objects.filter(deployment=deployment)
    assert (analysis.decision, analysis.score) == ("hold", 50.0)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"strategy": "versioned"}, "canary_analysis", "Only a Red-Black rollout"),
        ({"stages": [100]}, "canary_analysis", "below 100%"),
        (
            {"canary_policy": {"metrics": [{"name": "latency_s", "alpha": 2}]}},
            "canary_policy.metrics[0].alpha",
            "",
        ),
    ],
)
def test_the_analysis_is_refused_where_there_is_nothing_to_compare_or_its_policy_is_bad(
    versions, cpu_instance_type, options, field, words
):
    model, v1, _ = versions
    with pytest.raises(ValidationError) as refused:
        services.create_deployment(
            model=model,
            version=v1,
            instance_type=cpu_instance_type,
            actor=USER,
            canary_analysis=True,
            **{"strategy": "red_black", **options},
        )
    assert list(refused.value.message_dict) == [field]
    assert words in refused.value.message_dict[field][0]
    assert not Deployment.objects.exists()


def test_a_policy_is_stored_whole_and_changed_as_a_rollout_setting(versions, cpu_instance_type):
    deployment = canary_deployment(versions, cpu_instance_type, policy={})
    assert deployment.canary_analysis is True
    names = [m["name"] for m in deployment.canary_policy["metrics"]]
    assert "latency_s" in names and "schema_invalid_rate" in names  # the platform default
    services.update_deployment(
        deployment, actor=USER, canary_policy={"metrics": [{"name": "error_rate"}]}
    )
    deployment.refresh_from_db()
    assert [m["name"] for m in deployment.canary_policy["metrics"]] == ["error_rate"]
    assert "canary_policy changed" in messages(deployment)[-1]
    with pytest.raises(ValidationError) as refused:
        services.update_deployment(deployment, actor=USER, stages=[100])
    assert "canary_analysis" in refused.value.message_dict


def test_a_verdict_kept_before_a_worker_stopped_is_acted_on_not_judged_again(
    versions, cpu_instance_type, servers
):
    """The analysis row is written before the rollout acts on it; a worker killed in between
    leaves the row, and the next step acts on that verdict, without a second row."""
    deployment = canary_deployment(versions, cpu_instance_type)
    into_first_bake(deployment, versions[2])
    since, until = bake_over(deployment)
    servers[1].add_requests(400, since, until, seed=1)
    servers[2].add_requests(400, since, until, seed=2)  # equal: judged again, it would promote
    make_stage_analysis(
        deployment,
        percent=50,
        window_start=datetime.fromtimestamp(since, tz=UTC),
        window_end=datetime.fromtimestamp(until, tz=UTC),
        reason="critical metric failed: latency_s fail: kept before the worker stopped",
    )
    deployment = run_until(deployment, lambda d: d.observed_state == "rolling_back")
    assert "kept before the worker stopped" in deployment.status_message
    assert StageAnalysis.objects.filter(deployment=deployment).count() == 1
