"""The wave controller's decisions, step by step, over two and three regions on launchers the
test moves by hand (one in-memory launcher per region, each with its own routing table).

Each step runs every region's rollout controller and then the wave controller, as the
workers would; ``test_multi_region_end_to_end.py`` runs the same on real processes.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from portal.core.actors import Actor
from portal.core.errors import Conflict
from portal.deployments import services, tasks
from portal.deployments.lifecycle import Action
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    MultiRegionDeployment,
    Region,
)
from portal.deployments.regions import multi_region, waves
from portal.deployments.regions.multi_region import RegionPart
from portal.deployments.rollout import controller
from portal.deployments.runtime.launchers.base import Health
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.deployments.test_controller import ready_version
from tests.factories import make_model

USER = Actor(label="user:test")
NAMES = ("us-east", "eu-west", "ap-south")


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    M.reset()
    yield
    M.reset()


@pytest.fixture
def regions(db):
    return [Region.objects.create(name=name) for name in NAMES]


@pytest.fixture
def versions(team, release, artifact_root):
    model = make_model(team, "chat")
    return model, ready_version(model, artifact_root), ready_version(model, artifact_root)


class World:
    """A multi-region deployment and the hand on its launchers."""

    def __init__(self, group: MultiRegionDeployment):
        self.group = group
        #: Regions whose instances of a version are left starting (never pass health checks).
        self.stuck: set[tuple[str, int]] = set()
        self.versions: tuple = ()

    @property
    def regional(self) -> list[Deployment]:
        return list(self.group.regional.select_related("region").order_by("wave"))

    def step(self, times: int = 1) -> MultiRegionDeployment:
        for _ in range(times):
            for deployment in self.regional:
                controller.reconcile(deployment.pk)
            waves.reconcile(self.group.pk)
            for name, version in {(r, v) for r in NAMES for v in (1, 2)} - self.stuck:
                M.set_health(version, Health.READY, region=name)
            M.finish_draining()
        self.group.refresh_from_db()
        return self.group

    def run_until(self, predicate, limit: int = 60) -> MultiRegionDeployment:
        for _ in range(limit):
            if predicate(self.step()):
                return self.group
        raise AssertionError(f"still {self.group.observed_state}: {self.group.status_message}")

    def serving(self) -> dict[str, int | None]:
        """Each region's version at 100% (None: mid-rollout or nothing serving)."""
        found = {}
        for deployment in self.regional:
            route = M.routes_in.get(deployment.region.name, [])
            shares = {s.version_set.version: s.weight for r in route for s in r.shares}
            found[deployment.region.name] = next((v for v, w in shares.items() if w == 100), None)
        return found

    def versions_started(self, region: str) -> set[int]:
        return {e[1] for e in M.table.values() if e[4] == region}


def deploy(versions, cpu_instance_type, regions, count=2, wave_bake_seconds=0) -> World:
    """v1 serving in the first ``count`` regions (deployed without a bake between waves),
    which then bake ``wave_bake_seconds`` between the waves of the next rollout."""
    model, v1, _ = versions
    group = multi_region.create(
        model=model,
        version=v1,
        regions=[RegionPart(region, replicas=1) for region in regions[:count]],
        instance_type=cpu_instance_type,
        actor=USER,
        bake_seconds=0,
        wave_bake_seconds=0,
    )
    world = World(group)
    world.run_until(lambda g: g.observed_state == "serving")
    MultiRegionDeployment.objects.filter(pk=group.pk).update(wave_bake_seconds=wave_bake_seconds)
    group.refresh_from_db()
    world.versions = versions
    return world


def test_a_first_deploy_goes_region_by_region(versions, cpu_instance_type, regions):
    model, v1, _ = versions
    group = multi_region.create(
        model=model,
        version=v1,
        regions=[RegionPart(regions[0], replicas=2), RegionPart(regions[1], replicas=1)],
        instance_type=cpu_instance_type,
        actor=USER,
        bake_seconds=0,
        wave_bake_seconds=0,
    )
    world = World(group)
    world.stuck = {("us-east", 1)}
    world.step(4)
    # The second region is held while the first one's instances are not ready.
    assert world.versions_started("us-east") == {1}
    assert world.versions_started("eu-west") == set()
    assert world.regional[1].desired_state == "paused"
    world.stuck = set()
    world.run_until(lambda g: g.observed_state == "serving")
    assert world.serving() == {"us-east": 1, "eu-west": 1}
    # Each region's table lists its own instances only: two in us-east, one in eu-west.
    assert M.split("us-east") == {"v1": (100, 2)}
    assert M.split("eu-west") == {"v1": (100, 1)}
    assert M.routes == []  # nothing in the default region's table


def test_a_new_version_rolls_out_in_wave_order_with_a_bake_between_waves(
    versions, cpu_instance_type, regions, monkeypatch
):
    world = deploy(versions, cpu_instance_type, regions, count=3, wave_bake_seconds=600)
    _, _, v2 = versions
    multi_region.roll_out(world.group, v2, actor=USER)
    now = [time.time()]
    monkeypatch.setattr(waves, "time", SimpleNamespace(time=lambda: now[0]))
    order = []
    for _ in range(80):
        group = world.step()
        for name, version in world.serving().items():
            if version == 2 and name not in order:
                order.append(name)
        if group.wave_phase == "bake":
            # Between waves nothing starts in the next region until the bake is over.
            assert world.versions_started(NAMES[group.current_wave]) == {1}
            assert "baking 600 s" in group.status_message
            now[0] += 601
        if group.observed_state == "serving":
            break
    assert order == ["us-east", "eu-west", "ap-south"]
    assert world.group.target_version == v2
    assert world.serving() == {"us-east": 2, "eu-west": 2, "ap-south": 2}
    baked = DeploymentEvent.objects.filter(message__contains="baked: regions moved so far")
    assert baked.count() == 1 + 2  # wave 1 baked (us-east), wave 2 baked (us-east, eu-west)


def crash_v2_in(world: World, region: str, policy: str) -> MultiRegionDeployment:
    """Roll out v2 and crash every v2 instance of ``region`` as soon as it starts."""
    _, _, v2 = world.versions
    MultiRegionDeployment.objects.filter(pk=world.group.pk).update(on_region_failure=policy)
    multi_region.roll_out(world.group, v2, actor=USER)
    world.stuck = {(region, 2)}
    for _ in range(80):
        M.set_health(2, Health.CRASHED, "exit 1: CUDA error", region=region)
        group = world.step()
        if group.observed_state in ("serving", "halted") and group.target_version_id != v2.pk:
            return group
        if group.observed_state == "halted":
            return group
    raise AssertionError(f"still {world.group.observed_state}: {world.group.status_message}")


@pytest.mark.parametrize("count", [2, 3])
def test_a_failure_in_the_second_region_rolls_every_region_back(
    versions, cpu_instance_type, regions, count
):
    world = deploy(versions, cpu_instance_type, regions, count=count)
    group = crash_v2_in(world, "eu-west", "roll_back_all")
    assert group.observed_state == "serving"
    assert group.target_version.number == 1
    assert group.previous_version is None
    assert group.failed_region == "eu-west"
    assert world.serving() == dict.fromkeys(NAMES[:count], 1)
    if count == 3:
        assert world.versions_started("ap-south") == {1}  # the third wave never started
    # us-east had finished its rollout to v2 and was rolled back by the policy.
    us_east = world.regional[0]
    assert us_east.events.filter(message__startswith="Rollback requested by the multi").exists()
    assert M.count(2, Health.READY, Health.STARTING, region="us-east") == 0
    # Every event of the rollout names its region.
    for event in DeploymentEvent.objects.filter(data__has_key="multi_region"):
        assert event.data["region"] == event.deployment.region.name


def test_a_failure_in_the_second_region_halts_the_wave_when_asked(
    versions, cpu_instance_type, regions
):
    world = deploy(versions, cpu_instance_type, regions, count=3)
    group = crash_v2_in(world, "eu-west", "halt")
    assert group.observed_state == "halted"
    assert "v2 failed in eu-west" in group.status_message
    assert "us-east keep v2" in group.status_message
    world.step(3)
    assert world.serving() == {"us-east": 2, "eu-west": 1, "ap-south": 1}
    # One rollback for the whole rollout brings the moved region back too.
    multi_region.act(world.group, Action.ROLLBACK, actor=USER)
    world.stuck = set()
    group = world.run_until(lambda g: g.observed_state == "serving")
    assert group.target_version.number == 1
    assert world.serving() == {"us-east": 1, "eu-west": 1, "ap-south": 1}


def test_pause_holds_the_next_wave_and_promote_finishes_every_region(
    versions, cpu_instance_type, regions
):
    world = deploy(versions, cpu_instance_type, regions, count=3, wave_bake_seconds=3600)
    _, _, v2 = versions
    multi_region.roll_out(world.group, v2, actor=USER)
    world.run_until(lambda g: g.wave_phase == "bake")
    multi_region.act(world.group, Action.PAUSE, actor=USER)
    group = world.step(3)
    assert group.observed_state == "paused"
    assert world.serving() == {"us-east": 2, "eu-west": 1, "ap-south": 1}
    with pytest.raises(Conflict):
        services.act(world.regional[1], Action.PROMOTE, actor=USER)  # act on the whole
    multi_region.act(world.group, Action.RESUME, actor=USER)
    world.step()
    multi_region.act(world.group, Action.PROMOTE, actor=USER)
    group = world.run_until(lambda g: g.observed_state == "serving")
    assert world.serving() == {"us-east": 2, "eu-west": 2, "ap-south": 2}
    # Promoted regions skipped their stages: each took v2 straight to 100%.
    eu_west = world.regional[1]
    assert eu_west.events.filter(message__startswith="Promoted: skipping to stage").exists()


def test_abort_in_the_second_wave_brings_every_region_back(versions, cpu_instance_type, regions):
    world = deploy(versions, cpu_instance_type, regions, count=2, wave_bake_seconds=0)
    _, _, v2 = versions
    multi_region.roll_out(world.group, v2, actor=USER)
    world.stuck = {("eu-west", 2)}  # the second region's v2 never gets ready
    world.run_until(lambda g: g.current_wave == 2 and world.versions_started("eu-west") == {1, 2})
    multi_region.act(world.group, Action.ABORT, actor=USER)
    group = world.run_until(lambda g: g.observed_state == "serving")
    assert group.target_version.number == 1
    assert world.serving() == {"us-east": 1, "eu-west": 1}


def test_a_worker_killed_between_waves_resumes_where_it_was(
    versions, cpu_instance_type, regions, clean_redis
):
    world = deploy(versions, cpu_instance_type, regions, count=2, wave_bake_seconds=3600)
    _, _, v2 = versions
    multi_region.roll_out(world.group, v2, actor=USER)
    world.run_until(lambda g: g.wave_phase == "bake")
    baking = world.group.bake_started_at
    started = DeploymentEvent.objects.filter(message__contains="rolling out v2 in").count()
    # The worker dies holding the lock, with no task queued: its lock expires, its marker is
    # gone, and beat's redrive finds the rollout nobody is looking at.
    clean_redis.delete(waves.lock_key(world.group.pk))
    clean_redis.delete(f"reconcile:scheduled:waves:{world.group.pk}")
    tasks.redrive_deployments()
    assert clean_redis.exists(f"reconcile:scheduled:waves:{world.group.pk}")
    group = world.step(3)
    assert group.current_wave == 1 and group.wave_phase == "bake"
    assert group.bake_started_at == baking  # the bake was not restarted
    assert DeploymentEvent.objects.filter(message__contains="rolling out v2 in").count() == started
    assert world.serving() == {"us-east": 2, "eu-west": 1}


def test_regions_refuse_what_they_cannot_take(versions, cpu_instance_type, regions):
    model, v1, _ = versions
    other = services.create_deployment(
        model=model,
        strategy="red_black",
        version=v1,
        instance_type=cpu_instance_type,
        actor=USER,
        region=regions[1],
    )
    with pytest.raises(Conflict, match="already serves this model Red-Black in eu-west"):
        multi_region.create(
            model=model,
            version=v1,
            regions=[RegionPart(regions[0]), RegionPart(regions[1])],
            instance_type=cpu_instance_type,
            actor=USER,
        )
    assert not MultiRegionDeployment.objects.exists()
    assert Deployment.objects.filter(region=regions[0]).count() == 0  # nothing half-made
    assert other.region == regions[1]


def test_versioned_deployments_are_cleaned_up_per_region(
    versions, cpu_instance_type, regions, settings
):
    """Each region keeps its newest Versioned deployment, and its own gateways say when a route
    there was last called."""
    model, v1, v2 = versions
    settings.VERSIONED_IDLE_SECONDS = 0  # serving since a moment ago is idle enough
    us_east, eu_west = regions[0], regions[1]
    made = {}
    for region, version in ((us_east, v1), (us_east, v2), (eu_west, v1)):
        deployment = services.create_deployment(
            model=model,
            strategy="versioned",
            version=version,
            instance_type=cpu_instance_type,
            actor=USER,
            region=region,
        )
        for _ in range(6):
            controller.reconcile(deployment.pk)
            M.set_health(version.number, Health.READY)
        deployment.refresh_from_db()
        assert deployment.observed_state == "serving"
        made[(region.name, version.number)] = deployment
    path = f"{model.team.slug}/{model.slug}/versions/1"
    M.requests_in["us-east"] = {path: time.time() + 3600}  # us-east's v1 was just called
    # eu-west's v1 is that region's newest: kept; us-east's v1 was just called there: kept.
    assert services.retire_idle_versioned() == []
    M.requests_in["us-east"] = {}
    Deployment.objects.filter(pk=made[("us-east", 1)].pk).update(last_request_at=None)
    assert services.retire_idle_versioned() == [made[("us-east", 1)].pk]


def first_deploy_failing_in_eu_west(versions, cpu_instance_type, regions, policy) -> World:
    model, v1, _ = versions
    group = multi_region.create(
        model=model,
        version=v1,
        regions=[RegionPart(regions[0], replicas=1), RegionPart(regions[1], replicas=1)],
        instance_type=cpu_instance_type,
        actor=USER,
        bake_seconds=0,
        wave_bake_seconds=0,
        on_region_failure=policy,
    )
    world = World(group)
    world.stuck = {("eu-west", 1)}
    for _ in range(60):
        M.set_health(1, Health.CRASHED, "exit 1", region="eu-west")
        if world.step().observed_state in ("failed", "halted"):
            return world
    raise AssertionError(f"still {world.group.observed_state}: {world.group.status_message}")


def test_a_first_deploy_failing_in_the_second_region_stops_every_region(
    versions, cpu_instance_type, regions
):
    world = first_deploy_failing_in_eu_west(versions, cpu_instance_type, regions, "roll_back_all")
    assert world.group.observed_state == "failed"
    us_east, eu_west = world.regional
    assert us_east.observed_state == "retired"  # nothing to roll back to: it stops serving
    assert eu_west.observed_state == "failed"
    world.step(3)
    assert M.count(1, Health.READY, Health.STARTING) == 0
    assert M.routes_in["us-east"] == []


def test_a_halted_first_deploy_can_be_aborted(versions, cpu_instance_type, regions):
    world = first_deploy_failing_in_eu_west(versions, cpu_instance_type, regions, "halt")
    assert world.group.observed_state == "halted"
    assert world.serving()["us-east"] == 1  # the region that took v1 keeps serving it
    multi_region.act(world.group, Action.ABORT, actor=USER)
    group = world.run_until(lambda g: g.observed_state == "aborted")
    assert "Stopped in every region" in group.status_message
    assert world.regional[0].observed_state == "retired"
