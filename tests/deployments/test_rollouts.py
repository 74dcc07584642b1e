"""Rollouts end to end: real serving processes behind the real gateway, the controller in a real
Celery worker, callers under continuous load. Every test ends with zero failed requests and no
instance process left that the deployment does not account for."""

from __future__ import annotations

import itertools
import os
import signal
import time

import httpx
import pytest
import redis
from django.conf import settings

from portal.deployments import services
from portal.deployments.lifecycle import Action
from portal.deployments.models import Deployment
from portal.deployments.tasks import redrive_deployments
from portal.deployments.traffic import routing
from serving.gateway import table
from tests.conftest import start_celery_worker, stop_process_group
from tests.deployments.conftest import USER
from tests.deployments.rollout_helpers import (
    Load,
    explain,
    in_bake,
    instance_processes,
    kill_between_requests,
    live_instances,
    start_gateway,
    timeline,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVED_NAME = "search--chat"  # the Triton model name of team "search", model "chat"


def state(deployment: Deployment) -> Deployment:
    deployment.refresh_from_db()
    return deployment


def why(deployment: Deployment) -> str:
    return explain(deployment, settings.INSTANCE_RUN_ROOT)


def serving(deployment: Deployment, version: int, timeout: float = 120) -> Deployment:
    def done():
        d = state(deployment)
        assert d.observed_state not in ("failed", "aborted"), d.status_message
        return d.observed_state == "serving" and d.target_version.number == version and d

    return wait_for(done, timeout, f"v{version} serving", explain=lambda: why(deployment))


def settled(world, deployment: Deployment, replicas: int, timeout: float = 60) -> None:
    """Only the serving version's instances run, and exactly as many as wanted."""

    def clean():
        d = state(deployment)
        live = live_instances(d)
        running = instance_processes(world.run_root)
        return (
            len(live) == replicas
            and all(i.version_id == d.target_version_id and i.state == "ready" for i in live)
            and sorted(running) == sorted(i.name for i in live)
        )

    wait_for(
        clean, timeout, "old instances to be drained and stopped", explain=lambda: why(deployment)
    )


@pytest.fixture
def chat(rollout_world):
    """Model "chat" serving v1 on one instance, with v2 registered and ready."""
    world = rollout_world
    model = world.model("chat")
    v1 = world.version(model)
    v2 = world.version(model)
    deployment = world.deploy(model, v1, replicas=1, stages=[50, 100], bake_seconds=3)
    serving(deployment, 1)
    return world, model, v1, v2, deployment


def test_red_black_rollout_shifts_traffic_in_stages_and_rolls_back_on_request(rollout_world):
    world = rollout_world
    model = world.model("chat")
    v1, v2 = world.version(model), world.version(model)
    deployment = world.deploy(model, v1, replicas=2, stages=[25, 50, 100], bake_seconds=4)
    serving(deployment, 1)
    settled(world, deployment, 2)
    with Load(world.endpoint(model), SERVED_NAME, clients=3, key=world.caller_key) as load:
        time.sleep(1)
        services.update_deployment(deployment, actor=USER, version=v2)
        serving(deployment, 2, timeout=180)
        time.sleep(1)
    assert load.failures() == []
    events = list(state(deployment).events.order_by("created_at"))
    stage_starts = {
        e.message.split(":")[0]: e.created_at.timestamp()
        for e in events
        if e.message.startswith("Stage ") and "traffic" in e.message
    }
    assert list(stage_starts) == ["Stage 1 of 3", "Stage 2 of 3", "Stage 3 of 3"]
    bounds = [*stage_starts.values(), time.time()]
    shares = []
    for since, until in itertools.pairwise(bounds):
        mix = load.mix(since + 0.5, until)  # half a second for the gateways to take the table
        shares.append(mix["v2"] / max(1, mix["v1"] + mix["v2"]))
    assert 0.1 < shares[0] < 0.4, shares
    assert 0.35 < shares[1] < 0.65, shares
    assert shares[2] > 0.95, shares
    assert load.mix(0, bounds[0] - 1)["v2"] == 0  # nothing reached v2 before stage 1
    settled(world, deployment, 2)
    # The old set stays whole through the stages: v1 drained only after the last bake.
    messages = timeline(deployment)
    assert any("Stage 2 of 3: traffic v2 50% · v1 50%." in m for m in messages)
    drained = [m for m in messages if "v1-" in m and "ready → draining" in m]
    baked = [m for m in messages if m.startswith("Stage 3 of 3 baked")]
    assert len(drained) == 2 and baked
    assert messages.index(baked[0]) < messages.index(drained[0]), messages

    # An operator rollback: v1 is restored at full size before any v2 instance goes.
    with Load(world.endpoint(model), SERVED_NAME, clients=3, key=world.caller_key) as load:
        services.act(deployment, Action.ROLLBACK, actor=USER, reason="bad answers")
        serving(deployment, 1, timeout=180)
        time.sleep(0.5)
    assert load.failures() == []
    assert state(deployment).previous_version is None
    assert "Rolled back to v1 because rollback requested" in state(deployment).status_message
    settled(world, deployment, 2)
    assert load.mix(time.time() - 0.4)["v2"] == 0


def test_a_version_that_never_becomes_healthy_is_rolled_back(chat):
    world, model, _v1, v2, deployment = chat
    with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
        # A real instance needs several seconds to load; a 1 s deadline is a health deadline
        # breach as a hung GPU load would be.
        services.update_deployment(deployment, actor=USER, version=v2, health_deadline_seconds=1)
        serving(deployment, 1)
    assert load.failures() == []
    assert load.mix()["v2"] == 0
    d = state(deployment)
    assert "did not pass its health check within 1 s" in d.status_message
    assert d.status_message.startswith("Rolled back to v1 because instance ")
    settled(world, deployment, 1)


def ready_again(deployment: Deployment, version, count: int, lost: str):
    def whole():
        ready = [
            i
            for i in live_instances(deployment)
            if i.version_id == version.pk and i.state == "ready"
        ]
        return len(ready) == count and lost not in {i.name for i in ready}

    wait_for(whole, 120, f"{count} ready v{version.number}", explain=lambda: why(deployment))


def test_a_killed_serving_instance_is_replaced(rollout_world):
    world = rollout_world
    model = world.model("chat")
    v1 = world.version(model)
    deployment = world.deploy(model, v1, replicas=2, bake_seconds=0)
    serving(deployment, 1)
    with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
        victim = live_instances(deployment)[0]
        kill_between_requests(load, world.run_root, victim)
        ready_again(deployment, v1, 2, victim.name)
        time.sleep(1)  # requests on the replacement too
    assert load.failures() == []
    assert state(deployment).observed_state == "serving"
    assert any("Starting 1 instance(s) of v1" in m for m in timeline(deployment))
    settled(world, deployment, 2)


def test_a_killed_old_instance_is_replaced_mid_rollout_and_the_rollout_goes_on(chat):
    world, model, v1, v2, deployment = chat
    services.update_deployment(deployment, actor=USER, bake_seconds=600)
    with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
        services.update_deployment(deployment, actor=USER, version=v2)
        wait_for(
            lambda: in_bake(deployment, 1), 120, "the 50% stage", explain=lambda: why(deployment)
        )
        [victim] = [i for i in live_instances(deployment) if i.version_id == v1.pk]
        kill_between_requests(load, world.run_root, victim)
        ready_again(deployment, v1, 1, victim.name)
        started = time.time()
        wait_for(lambda: load.mix(since=started)["v1"] > 0, 30, "v1 answering again")
        assert in_bake(deployment, 1)  # the old set's loss did not stop the rollout
        services.update_deployment(deployment, actor=USER, bake_seconds=1)
        services.act(deployment, Action.PROMOTE, actor=USER)
        serving(deployment, 2)
    assert load.failures() == []
    settled(world, deployment, 1)


def test_a_rollback_in_the_last_bake_starts_nothing_and_fails_no_request(chat):
    """One replica, stages 50/100: v1's only instance is still there while v2 takes 100% and
    bakes, so the rollback just gives it the traffic back."""
    world, model, v1, v2, deployment = chat
    [old] = [i for i in live_instances(deployment) if i.version_id == v1.pk]
    # Long enough for the test to see stage 2's bake begin and lengthen it before it passes.
    services.update_deployment(deployment, actor=USER, bake_seconds=15)
    with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
        services.update_deployment(deployment, actor=USER, version=v2)
        wait_for(
            lambda: in_bake(deployment, 2), 180, "the last bake", explain=lambda: why(deployment)
        )
        services.update_deployment(deployment, actor=USER, bake_seconds=600)
        assert in_bake(deployment, 2), why(deployment)  # the bake did not pass meanwhile
        assert state(deployment).traffic == {2: 100}
        assert [i.pk for i in live_instances(deployment) if i.version_id == v1.pk] == [old.pk]
        services.act(deployment, Action.ROLLBACK, actor=USER, reason="bad answers")
        serving(deployment, 1)
        started = time.time()
        wait_for(lambda: load.mix(since=started)["v1"] > 0, 30, "v1 answering")
    assert load.failures() == []
    messages = timeline(deployment)
    asked = messages.index(next(m for m in messages if m.startswith("Rollback requested")))
    assert not [m for m in messages[asked:] if m.startswith("Starting")], messages[asked:]
    assert [i.pk for i in live_instances(deployment)] == [old.pk]  # the same, never restarted
    settled(world, deployment, 1)


def test_an_error_rate_breach_during_the_bake_rolls_back(chat):
    world, model, _v1, v2, deployment = chat
    services.update_deployment(deployment, actor=USER, bake_seconds=60, max_error_rate=0.2)
    with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
        services.update_deployment(deployment, actor=USER, version=v2)
        wait_for(
            lambda: in_bake(deployment, 1), 120, "the 50% stage", explain=lambda: why(deployment)
        )
        [v2_instance] = [i for i in live_instances(deployment) if i.version_id == v2.pk]
        # Other callers send v2 requests it fails (no text_input): its own metrics count them.
        url = f"{v2_instance.endpoints['kserve_http']}/v2/models/{SERVED_NAME}/generate"
        for sent in range(10):
            try:
                answer = httpx.post(url, json={}, timeout=60)
            except httpx.TransportError:
                answer = None
            if answer is None or answer.status_code == 503:
                # The breach was seen before all ten went out (the load's v2 requests count in
                # the bake too): the rollback already drained v2 (gone, or refusing as it
                # drains). The status below says why.
                assert sent > 0, "v2 went away before any bad request"
                break
            assert answer.status_code == 400, answer.text
        serving(deployment, 1)
    assert load.failures() == []
    d = state(deployment)
    assert "v2's error rate" in d.status_message and "exceeded the 20% bound" in d.status_message
    settled(world, deployment, 1)


def test_a_rollout_survives_its_worker_being_killed(chat):
    world, model, _v1, v2, deployment = chat
    with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
        services.update_deployment(deployment, actor=USER, version=v2)
        wait_for(
            lambda: in_bake(deployment, 1), 120, "the 50% stage", explain=lambda: why(deployment)
        )
        os.killpg(world.worker.pid, signal.SIGKILL)
        world.worker.wait()
        time.sleep(3)  # longer than RECONCILE_STALE_SECONDS: nobody is looking now
        stuck = state(deployment).last_reconciled_at
        world.worker = start_celery_worker("rollout-2")
        redrive_deployments.delay()  # what beat does every 3 s
        serving(deployment, 2)
    assert load.failures() == []
    assert state(deployment).last_reconciled_at > stuck
    settled(world, deployment, 1)  # no instance leaked: only v2's one runs


def test_a_rollout_survives_redis_losing_its_data(chat, tmp_path):
    """FLUSHDB mid-rollout (a Redis restart without persistence) while the controller waits for
    the gateways to take stage 1's split: the routing table, the controller's markers and locks,
    the queued tasks and Celery's bindings are gone. The table republished afterwards must count
    as the split applied (once Redis's counter restarted at 1, the step waited for ever for the
    generation it had published before the loss)."""
    world, model, _v1, v2, deployment = chat
    saved, saved_keys = tmp_path / "gateway-table.json", tmp_path / "gateway-keys.json"
    files = ("--table-file", str(saved), "--keys-file", str(saved_keys))
    saver, _ = start_gateway(settings.REDIS_URL, *files)
    client = redis.Redis.from_url(settings.REDIS_URL)
    # A gateway slow to apply tables (its report says it runs none yet) holds the controller at
    # "Waiting for the gateways to take the new traffic split" until this test lets it go.
    laggard = f"{settings.GATEWAY_REDIS_PREFIX}:live:laggard"
    client.set(laggard, 0)
    try:
        with Load(world.endpoint(model), SERVED_NAME, key=world.caller_key) as load:
            services.update_deployment(deployment, actor=USER, version=v2)
            wait_for(
                lambda: state(deployment).step.phase == "shift" and deployment.step.generation,
                120,
                "stage 1's split published, the controller waiting for the gateways",
                explain=lambda: why(deployment),
            )
            waited_for = deployment.step.generation
            wait_for(
                lambda: saved.exists() and saved_keys.exists(), 10, "the gateway's saved copies"
            )
            with client.pipeline(transaction=True) as pipe:
                pipe.flushdb()
                pipe.set(laggard, 0)  # still behind after the loss
                pipe.execute()
            fresh, fresh_url = start_gateway(settings.REDIS_URL, *files)
            try:
                answer = httpx.post(
                    # The base URL's older form, with /v1, still works.
                    f"{fresh_url}/models/{world.team.slug}/{model.slug}/v1/completions",
                    json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 2},
                    headers=world.auth,
                    timeout=30,
                )
                assert answer.status_code == 200, answer.text  # from the saved copies
            finally:
                stop_process_group(fresh)
            republished = routing.publish()  # what beat's publish_routes does every minute
            assert republished > waited_for
            client.set(laggard, republished)  # the laggard catches up with the newest table
            wait_for(
                lambda: (table.applied_generation(client) or 0) >= republished,
                10,
                "every gateway on the republished table",
            )
            client.delete(laggard)  # and leaves (a gateway stopped reporting)
            redrive_deployments.delay()  # what beat does every 3 s
            serving(deployment, 2)
        assert load.failures() == []
        settled(world, deployment, 1)
    finally:
        client.delete(laggard)
        stop_process_group(saver)


def test_versioned_versions_serve_side_by_side_and_idle_old_ones_are_cleaned_up(
    rollout_world, settings
):
    world = rollout_world
    model = world.model("chat")
    v1, v2 = world.version(model), world.version(model)
    old = world.deploy(model, v1, strategy="versioned")
    new = world.deploy(model, v2, strategy="versioned")
    serving(old, 1)
    serving(new, 2)
    for _deployment, number in ((old, 1), (new, 2)):
        answer = httpx.post(
            world.endpoint(model, number) + "/completions",
            json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 2},
            headers=world.auth,
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-served-version"] == f"v{number}"
    assert services.advise_strategy(model, v2).strategy == "red_black"

    settings.VERSIONED_IDLE_SECONDS = 3
    wait_for(lambda: services.retire_idle_versioned() == [], 1, "an active v1 to be kept")
    time.sleep(4)  # now both are idle: only the older goes, the latest is always kept
    assert services.retire_idle_versioned() == [old.pk]
    assert state(old).observed_state == "retired"
    assert state(new).observed_state == "serving"
    wait_for(lambda: not live_instances(old), 60, "v1's instances to stop")
    assert (
        httpx.post(
            world.endpoint(model, 1) + "/completions", json={}, headers=world.auth, timeout=10
        ).status_code
        == 404
    )
