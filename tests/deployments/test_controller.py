"""The controller's decisions, step by step, on a launcher the test moves by hand.

``test_rollouts.py`` runs the same controller on real processes under load; these tests look
at each step in between: what is started, what takes traffic, and what is stopped when.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.core.actors import Actor
from portal.deployments import services
from portal.deployments.lifecycle import Action
from portal.deployments.models import Deployment
from portal.deployments.rollout import controller
from portal.deployments.runtime.launchers.base import Health
from portal.registry.lifecycle import transition_version
from portal.registry.models import VersionState
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.factories import TAGGER_IO, make_model, make_python_version, make_version

USER = Actor(label="user:test")


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    M.reset()
    yield
    M.reset()


def make_ready(version):
    for state in ("materializing", "materialized", "packaging", "ready"):
        transition_version(version, state)
    return version


def ready_version(model, artifact_root):
    return make_ready(make_version(model, artifact_root))


def step(deployment: Deployment, times: int = 1) -> Deployment:
    for _ in range(times):
        controller.reconcile(deployment.pk)
    deployment.refresh_from_db()
    return deployment


def run_until(deployment: Deployment, predicate, limit: int = 30) -> Deployment:
    for _ in range(limit):
        if predicate(step(deployment)):
            return deployment
    raise AssertionError(f"still {deployment.observed_state}: {deployment.status_message}")


@pytest.fixture
def versions(team, release, artifact_root):
    model = make_model(team, "chat")
    return model, ready_version(model, artifact_root), ready_version(model, artifact_root)


def serve_v1(model, v1, instance_type, replicas=2, **options) -> Deployment:
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
    step(deployment, 2)  # pending → progressing → start
    assert M.count(1, Health.STARTING) == replicas
    M.set_health(1, Health.READY)
    run_until(deployment, lambda d: d.observed_state == "serving")
    assert M.split() == {"v1": (100, replicas)}
    return deployment


def to_first_bake(deployment: Deployment, v2) -> Deployment:
    """Start a rollout to ``v2`` with a long bake and run it until its first stage bakes."""
    services.update_deployment(deployment, actor=USER, version=v2, bake_seconds=3600)
    step(deployment, 2)
    M.set_health(2, Health.READY)
    return run_until(deployment, lambda d: d.step.phase == "bake")


def test_a_first_deploy_starts_every_replica_then_serves(versions, cpu_instance_type):
    model, v1, _ = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=3)
    assert deployment.traffic == {1: 100}
    assert deployment.instances.filter(state="ready").count() == 3


def test_red_black_scales_new_up_beside_the_whole_old_set_and_never_shifts_before_new_is_ready(
    versions, cpu_instance_type
):
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=2, stages=[25, 50, 100])
    services.update_deployment(deployment, actor=USER, version=v2)
    observed = []
    for _ in range(60):
        step(deployment)
        ready_v2 = M.count(2, Health.READY)
        observed.append((deployment.current_stage, M.count(1, Health.READY), ready_v2))
        if M.routes and ready_v2 == 0:
            assert "v2" not in M.split() or M.split()["v2"][1] == 0  # no traffic before ready
        M.set_health(2, Health.READY)
        M.finish_draining()
        if deployment.observed_state == "serving":
            break
    assert deployment.observed_state == "serving"
    assert M.split() == {"v2": (100, 2)}
    # The v1 set stays whole until the last bake has passed: per stage (old ready, new ready)
    by_stage = {}
    for stage, old, new in observed:
        by_stage.setdefault(stage, set()).add((old, new))
    assert (2, 1) in by_stage[1]  # 25%: one new beside both old
    assert (2, 1) in by_stage[2]  # 50%: still one new (ceil(2·50%)), both old
    assert (2, 2) in by_stage[3]  # 100%: both new, both old kept until the final bake ends
    assert all(old == 2 for stage, old, _ in observed if stage < 3)
    assert M.count(1, Health.READY, Health.STARTING, Health.DRAINING) == 0
    messages = [e.message for e in deployment.events.all()]
    assert "Stage 1 of 3: traffic v2 25% · v1 75%." in messages
    assert "Stage 2 of 3: traffic v2 50% · v1 50%." in messages


def test_a_crash_gives_the_whole_old_set_the_traffic_back_before_removing_the_new(
    versions, cpu_instance_type
):
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=2, stages=[50, 100])
    to_first_bake(deployment, v2)
    step(deployment)
    assert M.split() == {"v2": (50, 1), "v1": (50, 2)}  # v1 stays whole through the stages
    M.set_health(2, Health.CRASHED, "exit status -9")
    step(deployment)
    assert deployment.observed_state == "rolling_back"
    assert "crashed: exit status -9" in deployment.status_message
    step(deployment)
    assert M.count(1, Health.STARTING) == 0  # nothing to start: v1 is whole
    assert M.split() == {"v1": (100, 2)}
    run_until(deployment, lambda d: d.observed_state == "serving")
    assert deployment.target_version == v1 and deployment.previous_version is None
    assert deployment.status_message.startswith("Rolled back to v1 because instance ")


def test_a_rollback_first_restores_an_old_set_that_lost_an_instance(
    versions, cpu_instance_type, settings
):
    settings.INSTANCE_RESTART_BACKOFF_SECONDS = 600  # the lost one is not replaced meanwhile
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=2, stages=[50, 100])
    to_first_bake(deployment, v2)
    crash_one(1)
    step(deployment)
    services.act(deployment, Action.ROLLBACK, actor=USER)
    step(deployment, 2)
    assert deployment.observed_state == "rolling_back"
    assert M.count(1, Health.STARTING) == 1  # restoring v1 to two
    step(deployment, 3)
    assert M.split()["v1"] == (50, 1)  # unchanged until v1 is whole again
    M.set_health(1, Health.READY)
    step(deployment)
    assert M.split() == {"v1": (100, 2)}


def test_a_retired_instance_is_stopped_only_once_the_gateways_have_the_new_table(
    versions, cpu_instance_type
):
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=2, stages=[50, 100])
    to_first_bake(deployment, v2)
    M.auto_apply = False
    services.act(deployment, Action.ROLLBACK, actor=USER)
    step(deployment, 3)
    assert deployment.instances.filter(state="draining").count() == 1  # v2's
    assert M.stop_calls == []  # the gateways may still send it requests
    M.applied = M.generation
    step(deployment)
    assert len(M.stop_calls) == 1


def test_pause_resume_and_promote(versions, cpu_instance_type):
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1, stages=[10, 50, 90, 100])
    to_first_bake(deployment, v2)
    services.act(deployment, Action.PAUSE, actor=USER)
    assert step(deployment).observed_state == "paused"
    assert step(deployment, 3).current_stage == 1
    services.act(deployment, Action.RESUME, actor=USER)
    assert step(deployment).observed_state == "progressing"
    services.act(deployment, Action.PROMOTE, actor=USER)
    step(deployment)
    assert deployment.current_stage == 4
    messages = [e.message for e in deployment.events.all()]
    assert "Promoted: skipping to stage 4 (100%), no bake." in messages
    # The bake is long (the test's default); a promoted rollout does not wait for it.
    run_until(deployment, lambda d: d.observed_state == "serving")
    assert deployment.target_version == v2


def test_promote_during_the_last_bake_ends_it_now(versions, cpu_instance_type):
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1, stages=[100])
    to_first_bake(deployment, v2)
    assert deployment.step.phase == "bake" and deployment.current_stage == 1
    step(deployment, 3)
    assert deployment.observed_state == "progressing"  # still baking
    services.act(deployment, Action.PROMOTE, actor=USER)
    run_until(deployment, lambda d: d.observed_state == "serving")
    assert "Promoted: the bake of stage 1 ends now." in [e.message for e in deployment.events.all()]


def test_aborting_a_first_deploy_stops_everything(versions, cpu_instance_type):
    model, v1, _ = versions
    deployment = services.create_deployment(
        model=model, strategy="red_black", version=v1, instance_type=cpu_instance_type, actor=USER
    )
    step(deployment, 2)
    services.act(deployment, Action.ABORT, actor=USER, reason="wrong model")
    step(deployment, 2)
    M.finish_draining()
    run_until(deployment, lambda d: d.observed_state == "aborted")
    assert deployment.status_message == "Abort requested."
    assert M.table == {}
    assert deployment.traffic == {}


def test_a_failed_version_fails_its_first_deploy(versions, cpu_instance_type, artifact_root):
    model, _, _ = versions
    v3 = make_version(model, artifact_root)
    deployment = services.create_deployment(
        model=model, strategy="red_black", version=v3, instance_type=cpu_instance_type, actor=USER
    )
    assert "Waiting for v3 to be ready (registered)." in step(deployment).status_message
    transition_version(v3, VersionState.FAILED, reason="checksum mismatch")
    assert step(deployment).observed_state == "failed"
    assert "checksum mismatch" in deployment.status_message


def test_an_interface_change_needs_versioned_or_an_explicit_override(
    team, release, artifact_root, cpu_instance_type
):
    model = make_model(team, "tagger")
    io_v2 = {**TAGGER_IO, "inputs": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}]}
    v1 = make_ready(make_python_version(model, artifact_root, TAGGER_IO))
    v2 = make_ready(make_python_version(model, artifact_root, io_v2))
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1)
    advice = services.advise_strategy(model, v2)
    assert advice.strategy == "versioned" and "I/O spec" in advice.interface_changes[0]
    assert "temporary" not in advice.reason and "on top of the old ones" in advice.reason
    with pytest.raises(ValidationError, match="changes the model's interface"):
        services.update_deployment(deployment, actor=USER, version=v2)
    services.update_deployment(deployment, actor=USER, version=v2, allow_io_change=True)
    deployment.refresh_from_db()
    assert deployment.target_version == v2 and deployment.allow_io_change


def test_a_launcher_error_is_reported_and_retried(versions, cpu_instance_type, monkeypatch):
    model, v1, _ = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1)

    def broken(self, version_set):
        raise ConnectionError("API server unreachable")

    monkeypatch.setattr(M, "observe", broken)
    assert controller.reconcile(deployment.pk) == controller.ERROR_RETRY_SECONDS
    deployment.refresh_from_db()
    assert "retries in 5 s: ConnectionError('API server unreachable')" in deployment.status_message
    assert deployment.observed_state == "serving"  # nothing was decided on a broken view
    monkeypatch.undo()
    step(deployment)
    assert deployment.observed_state == "serving"


def test_an_instance_failing_its_health_check_through_the_bake_rolls_back(
    versions, cpu_instance_type
):
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1, stages=[50, 100])
    to_first_bake(deployment, v2)
    M.set_health(2, Health.UNHEALTHY, "health check failing")
    assert step(deployment, 2).observed_state == "progressing"  # one slow check is tolerated
    past = timezone.now() - timedelta(seconds=controller.UNHEALTHY_GRACE_SECONDS + 1)
    deployment.instances.filter(state="unhealthy").update(updated_at=past)
    assert step(deployment).observed_state == "rolling_back"
    assert "failed its health check for over 10 s" in deployment.status_message


def test_an_instance_whose_counts_were_unread_when_the_bake_began_is_judged_from_its_first_reading(
    versions, cpu_instance_type, monkeypatch
):
    """On a busy machine the baseline scrape of v2's instance timed out. Its requests from
    before the bake (200 answered) must not dilute the failures of the bake (10 of 11)."""
    from portal.deployments.state.rollout_state import RequestCounts

    model, v1, v2 = versions
    M.with_metrics = True
    answers: dict[int, RequestCounts | None] = {1: RequestCounts(500, 0), 2: None}

    def scrape_counts(url: str) -> RequestCounts | None:
        return answers[M.table[url.removeprefix("memory://")][1]]

    monkeypatch.setattr(controller, "scrape_counts", scrape_counts)
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1, stages=[50, 100])
    services.update_deployment(deployment, actor=USER, max_error_rate=0.2)
    to_first_bake(deployment, v2)
    assert deployment.step.unread and not deployment.step.baseline
    answers[2] = RequestCounts(200, 0)  # the first reading, in the bake: its baseline
    assert step(deployment).observed_state == "progressing"
    assert deployment.step.unread == () and list(deployment.step.baseline.values()) == [
        RequestCounts(200, 0)
    ]
    answers[2] = RequestCounts(201, 10)
    assert step(deployment).observed_state == "rolling_back"
    assert "error rate 91% (10 of 11 requests) exceeded the 20% bound" in deployment.status_message


# --- self-healing -------------------------------------------------------------------------------


def crash_one(version: int, message: str = "exit status -9") -> str:
    """Crash one running instance of ``version`` (as a kill -9 would); its name."""
    name = next(
        n for n, e in M.table.items() if e[1] == version and e[2] in (Health.READY, Health.STARTING)
    )
    M.table[name][2:] = [Health.CRASHED, message]
    return name


def age_failures(deployment: Deployment, seconds: float) -> None:
    past = timezone.now() - timedelta(seconds=seconds)
    deployment.instances.filter(state="failed").update(updated_at=past)


def test_a_dead_serving_instance_is_replaced_after_its_back_off(
    versions, cpu_instance_type, settings
):
    settings.INSTANCE_RESTART_BACKOFF_SECONDS = 30
    model, v1, _ = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=2)
    crash_one(1)
    step(deployment)
    assert M.count(1, Health.READY) == 1 and M.count(1, Health.STARTING) == 0
    assert deployment.status_message.startswith("Restarting: 1 instance(s) of v1 lost")
    age_failures(deployment, 31)  # the back-off has passed
    step(deployment)
    assert M.count(1, Health.STARTING) == 1
    M.set_health(1, Health.READY)
    step(deployment, 2)
    assert M.split() == {"v1": (100, 2)}
    assert deployment.observed_state == "serving"
    assert deployment.status_message == (
        "v1 serves on 2 instance(s) again; lost instances were replaced."
    )


def test_a_version_that_keeps_crashing_stops_restarting_and_says_why(
    versions, cpu_instance_type, settings
):
    settings.INSTANCE_RESTART_BACKOFF_SECONDS = 0
    settings.CRASH_LOOP_FAILURES = 3
    model, v1, _ = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1)
    for attempt in range(3):
        crash_one(1, f"CUDA out of memory (attempt {attempt})")
        step(deployment)
    # Two failures were restarted at once; the third makes a crash loop: nothing starts.
    assert M.started == 3 and M.count(1, Health.STARTING, Health.READY) == 0
    assert deployment.status_message.startswith("Crash loop: v1 had 3 instance failures")
    assert deployment.status_message.endswith("CUDA out of memory (attempt 2)")
    step(deployment, 3)
    assert M.started == 3
    loop_events = [e for e in deployment.events.all() if e.message.startswith("Crash loop")]
    assert len(loop_events) == 1  # said once in the timeline, not at every step
    age_failures(deployment, settings.CRASH_LOOP_WINDOW_SECONDS + 1)
    step(deployment)
    assert M.count(1, Health.STARTING) == 1  # the window passed: it tries again


def test_an_instance_that_stays_unhealthy_is_drained_and_replaced(
    versions, cpu_instance_type, settings
):
    model, v1, _ = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=2)
    name = next(iter(M.table))
    M.table[name][2] = Health.UNHEALTHY
    step(deployment)
    assert M.count(1, Health.STARTING) == 0  # one failing check is not a reason yet
    past = timezone.now() - timedelta(seconds=settings.UNHEALTHY_REPLACE_SECONDS + 1)
    deployment.instances.filter(state="unhealthy").update(updated_at=past)
    step(deployment)
    assert deployment.instances.get(name=name).state == "draining"
    assert M.count(1, Health.STARTING) == 1


def test_a_lost_instance_of_the_old_version_is_replaced_mid_rollout(
    versions, cpu_instance_type, settings
):
    settings.INSTANCE_RESTART_BACKOFF_SECONDS = 0
    model, v1, v2 = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=4, stages=[25, 100])
    to_first_bake(deployment, v2)
    assert M.split() == {"v2": (25, 1), "v1": (75, 4)}
    crash_one(1)
    step(deployment)
    assert deployment.observed_state == "progressing"  # the old set's loss is no rollback
    assert M.count(1, Health.STARTING) == 1  # v1 stays whole: four
    M.set_health(1, Health.READY)
    step(deployment)
    assert M.split() == {"v2": (25, 1), "v1": (75, 4)}


def test_beat_restarts_a_chain_that_redis_lost(versions, cpu_instance_type, monkeypatch):
    from portal.core.redis_clients import redis_client
    from portal.deployments import kick, tasks

    model, v1, _ = versions
    deployment = serve_v1(model, v1, cpu_instance_type, replicas=1)
    woken: list[int] = []
    monkeypatch.setattr(tasks, "schedule", lambda pk, delay=0.0: woken.append(pk))
    client = redis_client()
    client.set(kick.deployment_marker(deployment.pk), 1)  # a look is pending
    assert tasks.redrive_deployments() == [] and woken == []
    client.set(controller.lock_key(deployment.pk), "worker")  # a worker is at it right now
    client.delete(kick.deployment_marker(deployment.pk))
    assert tasks.redrive_deployments() == []
    client.flushdb()  # Redis restarted without its data: nobody is coming
    assert tasks.redrive_deployments() == [deployment.pk] and woken == [deployment.pk]


def test_the_versioned_clean_up_remembers_last_requests_redis_forgot(
    versions, cpu_instance_type, settings
):
    import time

    model, v1, v2 = versions
    deployments = []
    for version in (v1, v2):
        deployment = services.create_deployment(
            model=model,
            strategy="versioned",
            version=version,
            instance_type=cpu_instance_type,
            actor=USER,
            replicas=1,
        )
        step(deployment, 2)
        M.set_health(version.number, Health.READY)
        deployments.append(run_until(deployment, lambda d: d.observed_state == "serving"))
    old = deployments[0]
    settings.VERSIONED_IDLE_SECONDS = 0  # serving since a moment ago is idle enough
    M.requests[f"{model.team.slug}/{model.slug}/versions/1"] = time.time() + 3600
    assert services.retire_idle_versioned() == []  # v1 was just called
    M.requests.clear()  # the gateways' records went with Redis's data
    assert services.retire_idle_versioned() == []  # still known from the database
    Deployment.objects.filter(pk=old.pk).update(last_request_at=timezone.now() - timedelta(1))
    assert services.retire_idle_versioned() == [old.pk]


def test_kick_sends_tasks_by_names_the_workers_know():
    """kick.py enqueues by name (so that nothing imports tasks.py to enqueue): every name it
    sends must be a task the app registers, or the message would be dropped by the worker."""
    from portal.cache import kick as cache_kick
    from portal.celery import app
    from portal.deployments import kick

    app.loader.import_default_modules()
    names = [kick.RECONCILE_DEPLOYMENT, kick.RECONCILE_MULTI_REGION, kick.COPY_TO_REGION]
    for name in [*names, cache_kick.MATERIALIZE_VERSION]:
        assert name in app.tasks, name
