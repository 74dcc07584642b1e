"""The controller's scaling, step by step, on the launcher the test moves by hand.

The instances' load is what their ``/metrics`` would say (``MemoryLauncher.loads``); everything
else is the real controller, services and database. ``test_autoscaling_end_to_end.py`` runs
the same on real instances behind the real gateway.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.deployments import services
from portal.deployments.models import Deployment
from portal.deployments.rollout import controller
from portal.deployments.rollout.status import describe
from portal.deployments.runtime.launchers.base import Health
from portal.deployments.state.autoscaling import InstanceLoad
from portal.deployments.traffic import activation
from portal.deployments.traffic.routing import route_path
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.deployments.test_controller import USER, ready_version, run_until, step
from tests.factories import make_model

AUTOSCALED = {"min_replicas": 1, "max_replicas": 6, "scale_target": 4.0}


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis, monkeypatch):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    M.reset()
    M.with_metrics = True
    monkeypatch.setattr(controller, "scrape_load", M.load_of)
    yield
    M.reset()


@pytest.fixture
def versions(team, release, artifact_root):
    model = make_model(team, "chat")
    return model, ready_version(model, artifact_root), ready_version(model, artifact_root)


def in_flight(version: int, per_instance: float) -> None:
    M.loads[version] = InstanceLoad(running=per_instance, waiting=0.0, kv_cache_usage=None)


def serve(model, version, instance_type, replicas=1, **scaling) -> Deployment:
    deployment = services.create_deployment(
        model=model,
        strategy="red_black",
        version=version,
        instance_type=instance_type,
        actor=USER,
        replicas=replicas,
        bake_seconds=0,
        scaling={**AUTOSCALED, "scale_up_window_seconds": 0, **scaling},
    )
    in_flight(version.number, 0)
    step(deployment, 2)
    M.set_health(version.number, Health.READY)
    return run_until(deployment, lambda d: d.observed_state == "serving")


def scaling_events(deployment: Deployment) -> list[str]:
    return [e.message for e in deployment.events.filter(kind="scaling")]


def test_load_scales_a_serving_deployment_up_within_its_bounds_and_says_why(
    versions, cpu_instance_type
):
    model, v1, _ = versions
    deployment = serve(model, v1, cpu_instance_type, scale_down_window_seconds=0)
    in_flight(1, 10)
    step(deployment)
    assert deployment.replicas == 3  # ceil(1 * 10 / 4)
    assert M.count(1, Health.STARTING) == 2
    [message] = scaling_events(deployment)
    assert message == (
        "Scaled 1 → 3: in-flight requests per instance 10 against a target of 4 "
        "(ceil(1 \u00d7 10 / 4) = 3)."
    )
    M.set_health(1, Health.READY)
    in_flight(1, 30)  # 3 instances at 30 each: 23 wanted, capped at 6
    step(deployment, 2)
    assert deployment.replicas == 6
    assert "within 1-6: 6" in scaling_events(deployment)[-1]
    M.set_health(1, Health.READY)
    step(deployment)
    assert M.split() == {"v1": (100, 6)}


def test_scaling_down_waits_for_the_down_window_then_drains_the_extra_instances(
    versions, cpu_instance_type
):
    model, v1, _ = versions
    deployment = serve(model, v1, cpu_instance_type, replicas=3, scale_down_window_seconds=300)
    in_flight(1, 0)
    step(deployment, 3)
    assert deployment.replicas == 3  # 3 was recommended within the last 300 s
    # Age the recommendations past the window, as five quiet minutes would.
    state = deployment.scaling
    aged = tuple((t - 301, n) for t, n in state.recommendations)
    Deployment.objects.filter(pk=deployment.pk).update(
        scaling=state.but(recommendations=aged, recording_since=state.recording_since - 301)
    )
    step(deployment)
    assert deployment.replicas == 1
    step(deployment)
    assert M.count(1, Health.READY) == 1 and M.count(1, Health.DRAINING) == 2
    assert M.split() == {"v1": (100, 1)}


def test_a_fixed_count_is_never_changed_by_load(versions, cpu_instance_type):
    model, v1, _ = versions
    deployment = services.create_deployment(
        model=model,
        strategy="red_black",
        version=v1,
        instance_type=cpu_instance_type,
        actor=USER,
        replicas=2,
    )
    step(deployment, 2)
    M.set_health(1, Health.READY)
    in_flight(1, 100)
    run_until(deployment, lambda d: d.observed_state == "serving")
    step(deployment, 3)
    assert (deployment.replicas, deployment.min_replicas, deployment.max_replicas) == (2, 2, 2)
    assert scaling_events(deployment) == []


def test_during_a_red_black_rollout_both_versions_scale_together_at_the_stages_split(
    versions, cpu_instance_type
):
    model, v1, v2 = versions
    deployment = serve(model, v1, cpu_instance_type, replicas=2, scale_down_window_seconds=0)
    in_flight(1, 4)
    services.update_deployment(
        deployment, actor=USER, version=v2, stages=[50, 100], bake_seconds=3600
    )
    step(deployment, 2)
    in_flight(2, 4)
    M.set_health(2, Health.READY)
    run_until(deployment, lambda d: d.step.phase == "bake")
    M.finish_draining()
    step(deployment)
    assert M.split() == {"v2": (50, 1), "v1": (50, 1)}  # the idle v1 had scaled to 1
    # Load on both: N goes 1 → 4; v2 gets its half, v1 stays whole at the new N.
    in_flight(1, 8)
    in_flight(2, 8)
    step(deployment)
    assert deployment.replicas == 4
    assert (M.count(2, Health.STARTING), M.count(1, Health.STARTING)) == (1, 3)
    M.set_health(1, Health.READY)
    M.set_health(2, Health.READY)
    in_flight(1, 4)  # the same load over twice the instances
    in_flight(2, 4)
    step(deployment)
    assert M.split() == {"v2": (50, 2), "v1": (50, 4)}  # the split holds, capacity doubled
    assert deployment.replicas == 4
    assert deployment.step.phase == "bake" and deployment.observed_state == "progressing"
    # Load falls to 8 in flight, half on each version's share: N goes back to 2, one instance
    # of v2 and two of v1 drain.
    in_flight(1, 1)  # four v1 instances
    in_flight(2, 2)  # two v2 instances
    step(deployment)
    assert deployment.replicas == 2  # 8 in flight at the target's 4 per instance
    in_flight(1, 2)  # the same load on half the instances
    in_flight(2, 4)
    step(deployment)
    assert M.split() == {"v2": (50, 1), "v1": (50, 2)}
    assert (M.count(2, Health.DRAINING), M.count(1, Health.DRAINING)) == (1, 2)


def test_an_idle_deployment_sleeps_and_a_wake_brings_one_instance_back(versions, cpu_instance_type):
    model, v1, _ = versions
    deployment = serve(model, v1, cpu_instance_type, replicas=2, scale_to_zero_after_seconds=60)
    path = route_path(deployment)
    M.requests[path] = time.time() - 30
    step(deployment)
    assert not deployment.scaling.asleep  # 30 s idle of 60
    # Nobody called for two minutes and the instances have been up longer.
    M.requests[path] = time.time() - 120
    deployment.instances.update(ready_at=timezone.now() - timedelta(minutes=5))
    in_flight(1, 1)
    step(deployment)
    assert not deployment.scaling.asleep  # a request still in flight: stay up
    in_flight(1, 0)
    step(deployment)
    assert deployment.scaling.asleep
    assert deployment.status_message.startswith("Scaled to zero: no request for 2 min")
    asleep = describe(deployment, deployment.instances.all())
    assert (asleep.headline, asleep.level, asleep.badge) == (
        "Scaled to zero: v1 starts on the next request",
        "idle",
        "scaled to zero",
    )
    step(deployment)
    assert M.count(1, Health.DRAINING) == 2
    [route] = M.routes
    assert route.wake and [len(s.instances) for s in route.shares] == [0]  # kept, held on
    M.finish_draining()
    step(deployment, 3)
    assert M.count(1, Health.STARTING, Health.READY) == 0  # asleep: nothing restarted
    assert activation.wake(deployment.pk)
    assert not activation.wake(deployment.pk)  # already awake: nothing to do
    step(deployment)
    assert M.count(1, Health.STARTING) == 1 and deployment.replicas == 1  # min_replicas
    waking = describe(deployment, deployment.instances.all())
    assert (waking.headline, waking.badge) == (
        "Waking: starting v1 for a request held at the gateway",
        "waking",
    )
    M.set_health(1, Health.READY)
    step(deployment)
    assert deployment.scaling.cold_start_seconds is not None
    assert deployment.scaling.woken_at is None
    assert M.split() == {"v1": (100, 1)}
    messages = scaling_events(deployment)
    assert messages[-2].startswith("Waking after 0 min asleep: a request is held at the gateway")
    assert messages[-1].startswith("Cold start: the first instance was ready")


def test_a_wake_the_gateway_wrote_to_redis_is_carried_out_by_the_backstop(
    versions, cpu_instance_type, redis_client
):
    model, v1, _ = versions
    deployment = serve(model, v1, cpu_instance_type, scale_to_zero_after_seconds=60)
    Deployment.objects.filter(pk=deployment.pk).update(
        scaling=deployment.scaling.but(asleep_since=time.time())
    )
    redis_client.hset(activation.wake_key(), str(deployment.pk), time.time())
    assert activation.wake_requested() == [deployment.pk]
    assert not redis_client.exists(activation.wake_key())
    deployment.refresh_from_db()
    assert not deployment.scaling.asleep and deployment.scaling.woken_at is not None


def test_turning_scale_to_zero_off_wakes_a_sleeping_deployment(versions, cpu_instance_type):
    model, v1, _ = versions
    deployment = serve(model, v1, cpu_instance_type, scale_to_zero_after_seconds=60)
    Deployment.objects.filter(pk=deployment.pk).update(
        scaling=deployment.scaling.but(asleep_since=time.time())
    )
    deployment.refresh_from_db()
    services.update_deployment(
        deployment, actor=USER, scaling={"scale_to_zero_after_seconds": None}
    )
    deployment.refresh_from_db()
    assert not deployment.scaling.asleep
    assert deployment.scale_to_zero_after_seconds is None


def test_bad_policies_are_refused_by_field(versions, cpu_instance_type, settings):
    model, v1, _ = versions
    bad = [
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"scale_target": 0}, "scale_target"),
        ({"scale_metric": "kv_cache", "scale_target": 1.5}, "scale_target"),
        ({"scale_metric": "tokens"}, "scale_metric"),
        ({"scale_down_window_seconds": 7200}, "scale_down_window_seconds"),
        ({"scale_to_zero_after_seconds": 1}, "scale_to_zero_after_seconds"),
    ]
    for scaling, field in bad:
        with pytest.raises(ValidationError) as refused:
            services.create_deployment(
                model=model,
                strategy="red_black",
                version=v1,
                instance_type=cpu_instance_type,
                actor=USER,
                scaling=scaling,
            )
        assert field in refused.value.message_dict, (scaling, refused.value.message_dict)
    settings.KUBERNETES_GATEWAY_NAME = "shared"
    with pytest.raises(ValidationError) as refused:
        services.create_deployment(
            model=model,
            strategy="red_black",
            version=v1,
            instance_type=cpu_instance_type,
            actor=USER,
            scaling={"scale_to_zero_after_seconds": 600},
        )
    assert "Gateway API" in refused.value.message_dict["scale_to_zero_after_seconds"][0]
    assert not Deployment.objects.exists()
