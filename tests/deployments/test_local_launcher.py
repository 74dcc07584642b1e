"""The local launcher on real serving processes: start, observe, drain, crash, and what a new
launcher object (a new worker) still sees of them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from portal.deployments.runtime.launchers.base import Health, Shape, VersionSet
from portal.deployments.runtime.launchers.local import LocalLauncher, _process, process_started
from serving.demo import package_weights
from tests.deployments.rollout_helpers import instance_processes, kill_instance_processes, wait_for


@pytest.fixture(scope="module")
def demo_package(tmp_path_factory, demo_weights) -> Path:
    return package_weights(demo_weights, tmp_path_factory.mktemp("package") / "demo.tar")


@pytest.fixture
def launcher(settings, tmp_path, clean_redis):
    settings.INSTANCE_RUN_ROOT = tmp_path / "instances"
    settings.INSTANCE_DRAIN_SECONDS = 5
    yield LocalLauncher()
    kill_instance_processes(tmp_path / "instances")


def demo_set(package: Path) -> VersionSet:
    return VersionSet(
        deployment_id=7,
        team="demo",
        model="tiny",
        version=1,
        served_model_name="demo--tiny",
        package_path=package,
        package_digest="",
        weights_dir=package.parent,
        shape=Shape(name="cpu-local"),
    )


def health(launcher: LocalLauncher, the_set: VersionSet) -> dict[str, Health]:
    return {i.name: i.health for i in launcher.observe(the_set)}


@pytest.mark.slow
def test_an_instance_starts_serves_and_drains(launcher, demo_package, monkeypatch, tmp_path):
    # The web server's metrics directory, were the worker to have it, is not the instance's.
    web_metrics = tmp_path / "web-metrics"
    web_metrics.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(web_metrics))
    the_set = demo_set(demo_package)
    [name] = launcher.start(the_set, 1)
    assert name.startswith("demo-tiny-v1-d7-")
    assert health(launcher, the_set) == {name: Health.STARTING}
    wait_for(lambda: health(LocalLauncher(), the_set) == {name: Health.READY}, 120, "ready")
    [seen] = LocalLauncher().observe(the_set)  # another worker sees the same
    answer = httpx.post(
        seen.endpoints["openai"] + "/v1/completions",
        json={"model": "demo--tiny", "prompt": "Hi", "max_tokens": 2},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert "nv_inference_request_success" in httpx.get(seen.endpoints["metrics"]).text
    work = launcher.run_root / the_set.key / name / "work"
    assert list((work / "prometheus").glob("*.db")) and not list(web_metrics.iterdir())

    launcher.stop(the_set, [name], drain_seconds=5)
    launcher.stop(the_set, [name], drain_seconds=5)  # twice is harmless
    wait_for(lambda: health(launcher, the_set) == {name: Health.EXITED}, 60, "exited")
    launcher.forget(the_set, [name])
    assert launcher.observe(the_set) == []
    assert not (launcher.run_root / the_set.key).exists()


def test_a_crash_is_reported_with_the_end_of_its_log(launcher, demo_package):
    the_set = demo_set(demo_package)
    [name] = launcher.start(the_set, 1)
    process = instance_processes(launcher.run_root)[name]
    for child in process.children(recursive=True):
        child.kill()
    process.send_signal(signal.SIGKILL)
    wait_for(lambda: health(launcher, the_set) == {name: Health.CRASHED}, 30, "crashed")
    [seen] = launcher.observe(the_set)
    assert seen.message.startswith("the process exited without being asked to")
    launcher.forget(the_set, [name])
    assert launcher.observe(the_set) == []


def test_a_bad_package_fails_to_start(launcher, tmp_path, demo_package):
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar")
    the_set = demo_set(broken)
    [name] = launcher.start(the_set, 1)
    wait_for(lambda: health(launcher, the_set) == {name: Health.CRASHED}, 60, "start failure")
    [seen] = launcher.observe(the_set)
    assert "unpack_package" in seen.message or "package" in seen.message


def test_a_record_without_a_process_is_not_mistaken_for_a_live_one(launcher, demo_package):
    """A worker killed between writing the record and starting the process; or a pid reused."""
    the_set = demo_set(demo_package)
    directory = launcher.run_root / the_set.key / "demo-tiny-v1-d7-dead"
    directory.mkdir(parents=True)
    record = {"name": directory.name, "created_at": time.time() - 60, "pid": None}
    (directory / "instance.json").write_text(json.dumps(record))
    reused = {**record, "name": "demo-tiny-v1-d7-reused", "pid": psutil.Process().pid}
    (directory.parent / reused["name"]).mkdir()
    (directory.parent / reused["name"] / "instance.json").write_text(
        json.dumps({**reused, "pid_started_since_boot": 0.0})
    )
    assert health(launcher, the_set) == {
        "demo-tiny-v1-d7-dead": Health.CRASHED,
        "demo-tiny-v1-d7-reused": Health.CRASHED,
    }


def test_a_live_instance_stays_itself_when_the_wall_clock_is_set(
    launcher, demo_package, monkeypatch
):
    """Linux derives the boot time from the wall clock, so setting the clock (NTP on a busy VM)
    moves every process's ``create_time()`` by whole seconds. A record of a live process must
    still name it: before, every instance then looked as if it had exited, at the same moment."""
    the_set = demo_set(demo_package)
    directory = launcher.run_root / the_set.key / "demo-tiny-v1-d7-live"
    directory.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        me = psutil.Process(child.pid)
        record = {
            "name": directory.name,
            "created_at": time.time(),
            "pid": me.pid,
            "pid_started_since_boot": process_started(me),
        }
        (directory / "instance.json").write_text(json.dumps(record))
        assert _process(record) is not None
        stepped = psutil._psplatform.boot_time() + 3.0
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: stepped)
        assert abs(psutil.Process(me.pid).create_time() - me.create_time()) > 2
        assert _process(record) is not None
        earlier = {**record, "pid_started_since_boot": record["pid_started_since_boot"] - 5}
        assert _process(earlier) is None  # a pid reused by another process
    finally:
        child.kill()
        child.wait()
