"""The gateway tests' backends: real HTTP servers, one process each, on loopback."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from serving.gateway.table import Backend
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import ROOT, wait_for
from tests.ports import free_port


@pytest.fixture
def backends():
    """Start backends by name; each is a real server process on its own port."""
    started: list[subprocess.Popen] = []

    def start(name: str, host: str = "127.0.0.1", port: int | None = None) -> Backend:
        """``host`` may be any loopback address (127.0.0.2 stands for a pod's)."""
        port = port or free_port()
        argv = [
            sys.executable, "-m", "tests.gateway.backend",
            "--port", str(port), "--name", name, "--host", host,
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(proc)
        url = f"http://{host}:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/v1/count").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 30, f"backend {name}")
        return Backend(name, openai=url, kserve_http=url)

    yield start
    for proc in started:
        stop_process_group(proc)
