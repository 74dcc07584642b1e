"""The portal's ``/metrics`` under gunicorn as the Procfile and the image run it: a real server
with several worker processes, whichever of them answers the scrape."""

from __future__ import annotations

import http.client
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import wait_for
from tests.web_server import server_workers, start_portal

WORKERS = 3
REQUESTS = 60
IDLE_SECONDS = 3  # above gunicorn's default keep-alive

pytestmark = pytest.mark.django_db(transaction=True)


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
    server, url = start_portal(tmp_path / "var", workers=WORKERS)
    try:
        with ThreadPoolExecutor(8) as pool:  # concurrent callers keep several workers busy
            codes = list(pool.map(lambda i: httpx.get(f"{url}/no-such-page-{i}").status_code,
                                  range(REQUESTS)))  # fmt: skip
        assert set(codes) == {404}
        counted_by = {p.name for p in (tmp_path / "var" / "web-metrics").glob("counter_*.db")}
        assert len(counted_by) > 1, "the requests all went to one worker; nothing was summed"

        assert [not_found_count(url) for _ in range(10)] == [REQUESTS] * 10

        victim = server_workers(server)[0]
        victim.send_signal(signal.SIGKILL)
        wait_for(
            lambda: (
                victim.pid not in {w.pid for w in server_workers(server)}
                and len(server_workers(server)) == WORKERS
            ),
            60,
            "gunicorn to replace the killed worker",
        )
        assert [not_found_count(url) for _ in range(10)] == [REQUESTS] * 10
    finally:
        stop_process_group(server)

    # A new server starts counting from zero, not from the last one's files.
    server, url = start_portal(tmp_path / "var", workers=WORKERS)
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
            # A body declared larger than the server takes is refused before it is sent
            # (Django's ASGI handler would spool it whole first: portal.core.body_limit).
            connection.putrequest("POST", "/api/v1/models/")
            connection.putheader("Content-Length", str(10**12))
            connection.putheader("Content-Type", "application/json")
            connection.endheaders()
            answer = connection.getresponse()
            assert answer.status == 413
            assert b"request_too_large" in answer.read()
        finally:
            connection.close()
    finally:
        stop_process_group(server)
