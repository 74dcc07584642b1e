"""The portal's ``/metrics`` under gunicorn as the Procfile and the image run it: a real server
with several worker processes, whichever of them answers the scrape."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import _test_database_url, die_with_pytest, stop_process_group
from tests.deployments.rollout_helpers import wait_for
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
REQUESTS = 60
IDLE_SECONDS = 3  # above gunicorn's default keep-alive

pytestmark = pytest.mark.django_db(transaction=True)


def start_gunicorn(var_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "PORTAL_VAR_DIR": str(var_dir),
        "DATABASE_URL": _test_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "WEB_CONCURRENCY": str(WORKERS),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "portal.wsgi"),
            *("--config", "python:portal.gunicorn_conf", "--bind", f"127.0.0.1:{port}"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_pytest,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/metrics").status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 60, "gunicorn to answer")
    wait_for(lambda: len(workers(proc)) == WORKERS, 60, f"{WORKERS} gunicorn workers")
    return proc, url


def workers(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children()


def not_found_count(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(
        s.value
        for s in families["portal_http_requests"].samples
        if s.labels == {"method": "GET", "view": "unmatched", "status": "404"}
        and s.name.endswith("_total")
    )


@pytest.mark.slow
def test_every_scrape_sees_the_requests_of_all_workers_even_one_that_died(tmp_path, clean_redis):
    server, url = start_gunicorn(tmp_path / "var")
    try:
        with ThreadPoolExecutor(8) as pool:  # concurrent callers keep several workers busy
            codes = list(pool.map(lambda i: httpx.get(f"{url}/no-such-page-{i}").status_code,
                                  range(REQUESTS)))  # fmt: skip
        assert set(codes) == {404}
        counted_by = {p.name for p in (tmp_path / "var" / "web-metrics").glob("counter_*.db")}
        assert len(counted_by) > 1, "the requests all went to one worker; nothing was summed"

        assert [not_found_count(url) for _ in range(10)] == [REQUESTS] * 10

        victim = workers(server)[0]
        victim.send_signal(signal.SIGKILL)
        wait_for(
            lambda: (
                victim.pid not in {w.pid for w in workers(server)}
                and len(workers(server)) == WORKERS
            ),
            60,
            "gunicorn to replace the killed worker",
        )
        assert [not_found_count(url) for _ in range(10)] == [REQUESTS] * 10
    finally:
        stop_process_group(server)

    # A new server starts counting from zero, not from the last one's files.
    server, url = start_gunicorn(tmp_path / "var")
    try:
        assert not_found_count(url) == 0
        # A client keeps a connection open between polls: one idle for longer than gunicorn's
        # default keep-alive (2 s) must still take the next request.
        host, port = url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for idle in (0, IDLE_SECONDS):
                time.sleep(idle)  # what is tested: the connection idle that long
                connection.request("GET", "/livez")
                answer = connection.getresponse()
                answer.read()
                assert answer.status == 200
        finally:
            connection.close()
    finally:
        stop_process_group(server)
