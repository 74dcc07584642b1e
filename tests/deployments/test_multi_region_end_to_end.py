"""Two local regions on one machine: each with its own launcher run directory, its own routing
table and its own gateway process (``--prefix``), the rollout and wave controllers in a real
Celery worker, callers under continuous load through both gateways.

``test_waves.py`` checks the wave controller's every decision on launchers moved by hand; this
checks that the same code moves real instances behind real gateways without failing a caller.
"""

from __future__ import annotations

import time

import httpx
import pytest

from portal.deployments import services
from portal.deployments.models import (
    DeploymentEvent,
    MultiRegionDeployment,
    Region,
    default_region,
)
from portal.deployments.regions import multi_region
from portal.deployments.regions.multi_region import RegionPart
from portal.deployments.traffic import caller_keys
from tests.conftest import stop_process_group
from tests.deployments.conftest import USER
from tests.deployments.rollout_helpers import (
    Load,
    in_bake,
    instance_processes,
    kill_between_requests,
    kill_instance_processes,
    live_instances,
    start_gateway,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVED_NAME = "search--chat"
#: One caller per region, each pausing between requests: five instances start under this load
#: (each request still finds its region mid-rollout), and a busy loop per region would take the
#: two cores they load on.
PACED = {"clients": 1, "pause_seconds": 0.1}


def group_serving(group: MultiRegionDeployment, version: int) -> MultiRegionDeployment:
    def done():
        group.refresh_from_db()
        assert group.observed_state not in ("failed", "aborted", "halted"), group.status_message
        return group.observed_state == "serving" and group.target_version.number == version

    wait_for(done, 240, f"v{version} serving in every region", explain=lambda: _explain(group))
    return group


def _explain(group: MultiRegionDeployment) -> str:
    group.refresh_from_db()
    lines = [f"{group.observed_state}: {group.status_message}"]
    for d in group.regional.select_related("region"):
        lines.append(f"  {d.region}: {d.observed_state} stage {d.current_stage} {d.status_message}")
    return "\n".join(lines)


@pytest.fixture
def second_region(rollout_world, tmp_path, settings):
    """Region eu-west beside the default one: its own run directory and its own gateway."""
    run_root = tmp_path / "instances-eu-west"
    region = Region.objects.create(name="eu-west", run_directory=str(run_root))
    gateway, url = start_gateway(settings.REDIS_URL, "--prefix", region.gateway_prefix)
    try:
        caller_keys.publish_caller_keys()  # the new region's gateways take the team's keys
        wait_for(
            lambda: (
                httpx.get(
                    f"{url}/models/search/none/v1/models", headers=rollout_world.auth
                ).status_code
                != 401
            ),
            10,
            "eu-west's gateway to take the caller key",
        )
        yield region, url, run_root
    finally:
        kill_instance_processes(run_root)
        stop_process_group(gateway)


def test_two_regions_roll_out_in_waves_under_load_and_roll_back_together(
    rollout_world, second_region
):
    world = rollout_world
    eu_west, eu_url, eu_root = second_region
    model = world.model("chat")
    v1, v2 = world.version(model), world.version(model)
    group = multi_region.create(
        model=model,
        version=v1,
        regions=[RegionPart(default_region(), replicas=1), RegionPart(eu_west, replicas=1)],
        instance_type=world.instance_type,
        actor=USER,
        stages=[50, 100],
        bake_seconds=0,  # the stages' bakes are the controller tests'; here: no failed caller
        wave_bake_seconds=1,
    )
    group_serving(group, 1)
    local_part, eu_part = group.regional.order_by("wave")
    endpoints = {
        "local": world.endpoint(model),
        "eu-west": f"{eu_url}/models/{world.team.slug}/{model.slug}",
    }
    # Each region's gateway routes to its own region's instance only.
    for name, url in endpoints.items():
        answer = httpx.post(
            f"{url}/v1/completions",
            json={"model": SERVED_NAME, "prompt": "hi", "max_tokens": 1},
            headers=world.auth,
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        part = local_part if name == "local" else eu_part
        assert answer.headers["x-served-by"] in {i.name for i in live_instances(part)}

    # 1. v2 crashes in the second region, mid-bake of its first stage: that region rolls
    # back, and the policy (roll back all) brings the first region, already on v2, back too.
    services.update_deployment(eu_part, actor=USER, bake_seconds=60)
    with (
        Load(endpoints["local"], SERVED_NAME, key=world.caller_key, **PACED) as local_load,
        Load(endpoints["eu-west"], SERVED_NAME, key=world.caller_key, **PACED) as eu_load,
    ):
        multi_region.roll_out(group, v2, actor=USER)
        wait_for(
            lambda: in_bake(eu_part, 1), 180, "eu-west's 50% stage", explain=lambda: _explain(group)
        )
        wait_for(lambda: eu_load.mix()["v2"] > 0, 10, "eu-west callers to reach v2")
        [crashing] = [i for i in live_instances(eu_part) if i.version_id == v2.pk]
        kill_between_requests(eu_load, eu_root, crashing)
        group_serving(group, 1)
        time.sleep(0.5)
    assert local_load.failures() == [] and eu_load.failures() == []
    assert local_load.mix()["v2"] > 0  # the first region had moved to v2 before the crash
    assert local_load.mix(time.time() - 0.4)["v2"] == 0
    assert eu_load.mix(time.time() - 0.4)["v2"] == 0
    assert group.failed_region == "eu-west"
    eu_part.refresh_from_db()
    assert f"instance {crashing.name} of v2 crashed" in eu_part.status_message
    # (This is also the single-region case: a version crashing at its 50% stage is rolled back
    # with no caller failing.) No process is left that the region's deployment does not own.
    wait_for(
        lambda: (
            sorted(instance_processes(eu_root)) == sorted(i.name for i in live_instances(eu_part))
        ),
        30,
        "eu-west's v2 instances to be gone",
    )
    assert "Rolled back: v1 serves in every region again" in group.status_message

    # 2. v2 again: region by region, and no caller in either region sees a failure.
    services.update_deployment(eu_part, actor=USER, bake_seconds=0)
    with (
        Load(endpoints["local"], SERVED_NAME, key=world.caller_key, **PACED) as local_load,
        Load(endpoints["eu-west"], SERVED_NAME, key=world.caller_key, **PACED) as eu_load,
    ):
        multi_region.roll_out(group, v2, actor=USER)
        group_serving(group, 2)
        time.sleep(0.5)
    assert local_load.failures() == [] and eu_load.failures() == []
    assert local_load.mix(time.time() - 0.4)["v1"] == 0
    assert eu_load.mix(time.time() - 0.4)["v1"] == 0
    events = DeploymentEvent.objects.filter(data__multi_region=group.pk).order_by(
        "created_at", "id"
    )
    waves = [e.message for e in events if "rolling out v2 in" in e.message]
    assert waves[-2:] == [
        "Wave 1 of 2: rolling out v2 in local.",
        "Wave 2 of 2: rolling out v2 in eu-west.",
    ]
    first_done = next(
        e.created_at for e in reversed(events) if e.message == "Wave 1 of 2: local serves v2."
    )
    second_started = next(
        e.created_at for e in reversed(events) if e.message.startswith("Wave 2 of 2: rolling")
    )
    assert first_done < second_started
