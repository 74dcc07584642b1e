"""What a reconcile costs as deployments multiply, and what the routing table it skips still
guarantees: published when a route changes, not otherwise, and an instance stopped only once a
table without it is applied."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.core.actors import Actor
from portal.deployments import services, tasks
from portal.deployments.lifecycle import transition_deployment, transition_instance
from portal.deployments.models import Deployment, ObservedState
from portal.deployments.rollout import controller
from portal.deployments.runtime.launchers.base import Health
from portal.deployments.traffic import routing
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.deployments.test_controller import ready_version, step
from tests.factories import make_model

USER = Actor(label="user:test")


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    M.reset()
    yield
    M.reset()


@pytest.fixture
def world(team, release, artifact_root, cpu_instance_type):
    made: list[Deployment] = []

    def serve(count: int, replicas: int = 2) -> list[Deployment]:
        """``count`` more models, each with a Red-Black deployment serving on ``replicas``."""
        fresh: list[Deployment] = []
        for _ in range(count):
            model = make_model(team, f"m{len(made) + len(fresh)}")
            fresh.append(
                services.create_deployment(
                    model=model,
                    strategy="red_black",
                    version=ready_version(model, artifact_root),
                    instance_type=cpu_instance_type,
                    actor=USER,
                    replicas=replicas,
                    bake_seconds=0,
                )
            )
        for _ in range(6):
            for deployment in fresh:
                step(deployment)
            M.set_health(1, Health.READY)
        assert all(d.observed_state == "serving" for d in fresh)
        made.extend(fresh)
        return made

    return serve


def queries_of_reconcile(deployment: Deployment) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        controller.reconcile(deployment.pk)
    return [q["sql"] for q in captured.captured_queries]


def ready_instance(deployment: Deployment) -> str:
    return deployment.instances.filter(state="ready").order_by("pk")[0].name


def test_a_reconcile_costs_the_same_queries_at_3_and_30_deployments(world):
    deployments = world(3)
    first = deployments[0]
    steady_at_3 = queries_of_reconcile(first)
    name = ready_instance(first)
    M.table[name][2] = Health.UNHEALTHY  # its route loses an instance: the table is published
    published = M.generation
    changed_at_3 = queries_of_reconcile(first)
    assert M.generation == published + 1
    M.table[name][2] = Health.READY
    controller.reconcile(first.pk)

    world(27)
    steady_at_30 = queries_of_reconcile(first)
    M.table[name][2] = Health.UNHEALTHY
    published = M.generation
    changed_at_30 = queries_of_reconcile(first)
    assert M.generation == published + 1
    assert len(steady_at_30) == len(steady_at_3), steady_at_30
    assert len(changed_at_30) == len(changed_at_3), changed_at_30
    # The others' routes come from the record, not the database: no query of the change's is
    # routing's (the 8 beyond the steady step's 6 record the instance's health and reread it).
    assert len(steady_at_3) == 6 and len(changed_at_3) == 14, "\n".join(changed_at_3)


def test_a_steady_reconcile_publishes_nothing_and_a_change_is_published_at_once(world):
    a, b = world(2)
    before = M.generation
    for deployment in (a, b, a, b):
        controller.reconcile(deployment.pk)
    assert M.generation == before  # nothing changed: no table was built or handed over
    name = ready_instance(b)
    M.table[name][2] = Health.UNHEALTHY
    controller.reconcile(b.pk)
    assert M.generation == before + 1
    [route] = [r for r in M.routes if r.deployment_id == b.pk]
    assert [i.name for i in route.shares[0].instances] == [
        i.name for i in b.instances.filter(state="ready")
    ]
    assert {r.deployment_id for r in M.routes} == {a.pk, b.pk}  # the table stays whole


def test_a_route_keeps_the_generation_it_was_published_at(world):
    a, b = world(2)
    since = routing.publish(a)
    M.table[ready_instance(b)][2] = Health.UNHEALTHY
    controller.reconcile(b.pk)
    assert M.generation > since
    # a's route is the same in the newer table: waiting for the older one is enough.
    assert routing.publish(a) == since
    assert routing.publish(b) == M.generation


def test_the_route_from_the_rows_held_is_the_route_read_from_the_database(
    world, team, artifact_root
):
    [deployment] = world(1, replicas=4)
    v2 = ready_version(deployment.model, artifact_root)
    services.update_deployment(deployment, actor=USER, version=v2, stages=[25, 50, 100])
    compared = 0
    for _ in range(40):
        step(deployment)
        M.set_health(2, Health.READY)
        M.finish_draining()
        held = Deployment.objects.select_related(
            "model__team", "target_version", "previous_version", "instance_type"
        ).get(pk=deployment.pk)
        rows = list(held.instances.select_related("version__release", "version__model__team"))
        assert routing.route_of(held, rows) == routing.route_of(held)
        compared += 1
        if deployment.observed_state == "serving":
            break
    assert deployment.observed_state == "serving" and compared > 5


def test_a_change_left_unpublished_by_a_dead_worker_is_published_before_anything_stops(world):
    [deployment] = world(1)
    M.auto_apply = False
    # A worker marked an instance draining, then died before publishing.
    row = deployment.instances.filter(state="ready")[0]
    transition_instance(row, "draining", message="scaled down")
    published = M.generation
    controller.reconcile(deployment.pk)
    assert M.generation == published + 1
    assert row.name not in {i.name for s in M.routes[0].shares for i in s.instances}
    assert M.stop_calls == []  # the gateways may still send it requests
    M.applied = M.generation
    controller.reconcile(deployment.pk)
    assert M.stop_calls == [row.name]


def test_a_lost_record_of_the_published_table_is_rebuilt(world, clean_redis):
    [deployment] = world(1)
    clean_redis.delete(routing.PUBLISHED_KEY)
    published = M.generation
    generation = routing.publish(deployment)
    assert generation == M.generation == published + 1
    assert routing.publish(deployment) == generation


@pytest.fixture
def full_builds(monkeypatch):
    """How many times the whole table was built from the database."""
    built = []
    whole = routing.routes

    def counted(region=None):
        built.append(1)
        return whole(region)

    monkeypatch.setattr(routing, "routes", counted)
    return built


def test_the_table_published_from_the_record_is_the_one_built_from_the_database(
    world, artifact_root, full_builds
):
    a, b, c = world(3)
    published, full_builds[:] = M.generation, []  # the first publication built the table
    M.table[ready_instance(a)][2] = Health.UNHEALTHY
    controller.reconcile(a.pk)
    assert M.generation == published + 1 and full_builds == []
    assert M.routes == routing.routes()
    services.update_deployment(
        b, actor=USER, version=ready_version(b.model, artifact_root), stages=[50, 100]
    )
    for _ in range(20):
        full_builds[:] = []
        routing._decoded.clear()  # the others' routes decoded from Redis, not remembered
        step(b)
        step(a)
        assert full_builds == []  # the steps published from the record
        M.set_health(2, Health.READY)
        M.finish_draining()
        assert M.routes == routing.routes()
        if b.observed_state == "serving" and b.target_version.number == 2:
            break
    assert b.observed_state == "serving" and b.target_version.number == 2
    [route_of_b] = [r for r in M.routes if r.deployment_id == b.pk]
    assert {share.version_set.version for share in route_of_b.shares} == {2}
    assert M.generation >= published + 3  # b's stages and a's change, each published
    assert [r.deployment_id for r in M.routes] == [a.pk, b.pk, c.pk]


def test_a_deployment_that_leaves_the_live_set_leaves_the_table(world, full_builds):
    a, b = world(2)
    transition_deployment(a, ObservedState.RETIRED, reason="test", traffic={})
    published, full_builds[:] = M.generation, []  # the first publication built the table
    controller.reconcile(a.pk)
    assert M.generation == published + 1
    assert [r.deployment_id for r in M.routes] == [b.pk]
    assert full_builds == []
    assert M.routes == routing.routes()
    assert routing.redis_client().hlen(routing.ROUTES_KEY) == 1


@pytest.mark.parametrize("loss", ["older format", "routes lost"])
def test_a_record_of_an_older_format_or_without_its_routes_is_rebuilt_from_the_database(
    world, clean_redis, full_builds, monkeypatch, loss
):
    a, b = world(2)
    monkeypatch.setattr(routing, "_decoded", {})  # a worker that decoded none of them yet
    if loss == "older format":  # it recorded digests alone
        clean_redis.hset(routing.PUBLISHED_KEY, "format", "routes-v1")
    clean_redis.delete(routing.ROUTES_KEY)
    published, full_builds[:] = M.generation, []
    M.table[ready_instance(a)][2] = Health.UNHEALTHY
    controller.reconcile(a.pk)
    assert full_builds == [1]
    assert M.generation == published + 1
    assert [r.deployment_id for r in M.routes] == [a.pk, b.pk]
    assert clean_redis.hget(routing.PUBLISHED_KEY, "format") == routing.FORMAT.encode()
    assert clean_redis.hlen(routing.ROUTES_KEY) == 2
    # From now on the record serves.
    routing._decoded.clear()
    M.table[ready_instance(b)][2] = Health.UNHEALTHY
    controller.reconcile(b.pk)
    assert full_builds == [1] and M.generation == published + 2
    assert M.routes == routing.routes()
    assert clean_redis.hlen(routing.ROUTES_KEY) == 2  # b's earlier route is gone


def test_a_route_read_back_from_the_record_equals_the_route(world):
    [deployment] = world(1)
    route = routing.route_of(deployment)
    assert route is not None and route.shares[0].instances
    assert routing._load(routing._dump(route)) == route


def test_beat_rebuilds_the_table_from_the_database(world):
    a, b = world(2)
    # A deployment's step that should have dropped its route never ran.
    transition_deployment(a, ObservedState.RETIRED, reason="test", traffic={})
    published = tasks.publish_routes()
    assert published == M.generation and [r.deployment_id for r in M.routes] == [b.pk]
    assert tasks.publish_routes() == published  # nothing changed: nothing published
