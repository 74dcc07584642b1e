"""Autoscaling end to end: the demo model on real serving processes behind the real gateway, the
controller in a real Celery worker reading the instances' own ``/metrics``, callers on bounded
client threads. Load rises: 1 → 2 instances; load stops: back to 1, then to 0; a request to the
sleeping route is held at the gateway, wakes the deployment and succeeds. No request fails."""

from __future__ import annotations

import time

import httpx
import pytest

from portal.deployments.models import Deployment
from tests.deployments.rollout_helpers import Load, explain, live_instances, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVED_NAME = "search--chat"


def fresh(deployment: Deployment) -> Deployment:
    deployment.refresh_from_db()
    return deployment


def ready_count(deployment: Deployment) -> int:
    return sum(1 for i in live_instances(deployment) if i.state == "ready")


def test_load_scales_out_and_back_then_to_zero_and_a_held_request_wakes_it(rollout_world):
    world = rollout_world
    model = world.model()
    version = world.version(model)
    deployment = world.deploy(
        model,
        version,
        replicas=1,
        scaling={
            "min_replicas": 1,
            "max_replicas": 2,
            "scale_metric": "in_flight",
            "scale_target": 1.0,
            "scale_up_window_seconds": 0,
            "scale_down_window_seconds": 3,
            "scale_to_zero_after_seconds": 10,
        },
    )
    url = world.endpoint(model)

    def why() -> str:
        return explain(deployment, world.run_root)

    wait_for(lambda: fresh(deployment).observed_state == "serving", 120, "serving", explain=why)

    with Load(
        url, SERVED_NAME, clients=4, key=world.caller_key, max_tokens=48, pause_seconds=0
    ) as load:
        wait_for(
            lambda: fresh(deployment).replicas == 2 and ready_count(deployment) == 2,
            120,
            "two ready instances under load",
            explain=why,
        )
        wait_for(lambda: len(load.instances) == 2, 60, "requests served by both instances")
    assert load.failures() == [] and load.results
    scaled_up = [e.message for e in fresh(deployment).events.filter(kind="scaling")]
    assert any(m.startswith("Scaled 1 → ") for m in scaled_up), scaled_up

    # Load stopped: back to one instance after the down window, then to none after 10 s idle.
    wait_for(lambda: fresh(deployment).replicas == 1, 60, "one replica again", explain=why)
    wait_for(lambda: fresh(deployment).scaling.asleep, 60, "scaled to zero", explain=why)
    wait_for(lambda: not live_instances(deployment), 60, "no instance left", explain=why)

    # A request to the sleeping route is held, wakes the deployment, and succeeds.
    started = time.monotonic()
    answer = httpx.post(
        url + "/completions",
        json={"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 3},
        headers=world.auth,
        timeout=120,
    )
    held_for = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    deployment = fresh(deployment)
    wait_for(
        lambda: fresh(deployment).scaling.cold_start_seconds is not None,
        30,
        "the cold start to be recorded",
        explain=why,
    )
    deployment = fresh(deployment)
    assert 0 < deployment.scaling.cold_start_seconds <= held_for
    messages = [e.message for e in deployment.events.filter(kind="scaling")]
    assert any(m.startswith("Scaled to zero: no request for") for m in messages), messages
    assert any("a request is held at the gateway" in m for m in messages), messages
    assert messages[-1].startswith("Cold start: the first instance was ready")
