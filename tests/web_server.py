"""The portal served as the Procfile and the image serve it: gunicorn with
``portal.gunicorn_conf`` running ``portal.asgi:application``, on a free loopback port, against
the test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
from django.conf import settings

from tests.conftest import _test_database_url, die_with_pytest
from tests.deployments.rollout_helpers import wait_for
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def start_portal(var_dir: Path, *, workers: int = 2, env: dict[str, str] | None = None):
    """The server process and its URL, once it answers and all its workers are up. Its output
    goes to ``portal.log`` in ``var_dir``."""
    port = free_port()
    environment = {
        **os.environ,
        "PORTAL_VAR_DIR": str(var_dir),
        "DATABASE_URL": _test_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "WEB_CONCURRENCY": str(workers),
        **(env or {}),
    }
    environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
    var_dir.mkdir(parents=True, exist_ok=True)
    log = open(var_dir / "portal.log", "ab")  # noqa: SIM115 (the server holds it)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "portal.asgi:application"),
            *("--config", "python:portal.gunicorn_conf", "--bind", f"127.0.0.1:{port}"),
        ],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_pytest,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/livez").status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 60, "gunicorn to answer")
    wait_for(lambda: len(server_workers(proc)) == workers, 60, f"{workers} gunicorn workers")
    return proc, url


def server_workers(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children()
