"""``stop_local_instances`` (what ``./dev run`` runs on its way out) reaches every local
region's run directory, not only the platform's."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
from django.core.management import call_command

from portal.deployments.models import Region
from portal.deployments.runtime.launchers.local import process_started


def fake_instance(run_root, name: str) -> subprocess.Popen:
    """A process recorded as an instance the way the local launcher records one."""
    directory = run_root / "team-model-v1-d1" / name
    directory.mkdir(parents=True)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    record = {
        "name": name,
        "pid": process.pid,
        "pid_started_since_boot": process_started(psutil.Process(process.pid)),
    }
    (directory / "instance.json").write_text(json.dumps(record))
    return process


def test_every_local_regions_instances_are_stopped(settings, tmp_path, db, capsys):
    settings.INSTANCE_LAUNCHER = "local"
    settings.INSTANCE_RUN_ROOT = tmp_path / "instances"
    eu = Region.objects.create(name="eu-west")  # run directory: INSTANCE_RUN_ROOT/regions/eu-west
    Region.objects.create(name="ap-south", run_directory=str(tmp_path / "ap"))
    Region.objects.create(name="remote", launcher="kubernetes")  # not this machine's
    processes = [
        fake_instance(settings.INSTANCE_RUN_ROOT, "local-1"),
        fake_instance(settings.INSTANCE_RUN_ROOT / "regions" / eu.name, "eu-1"),
        fake_instance(tmp_path / "ap", "ap-1"),
    ]
    try:
        call_command("stop_local_instances")
        assert "Stopped 3 local instance(s)." in capsys.readouterr().out
        for process in processes:
            assert process.wait(timeout=10) == -15  # SIGTERM: it drains, then exits
    finally:
        for process in processes:
            process.kill()
