"""The gateway as a real process in front of real HTTP backends, following a real Redis table."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
import redis
from django.conf import settings

from serving.gateway import table
from serving.gateway.table import Backend, Group, RouteEntry
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import ROOT, start_gateway, wait_for
from tests.ports import free_port


@pytest.fixture
def client(clean_redis):
    return redis.Redis.from_url(settings.REDIS_URL)


@pytest.fixture
def gateway(client):
    proc, url = start_gateway(settings.REDIS_URL)
    yield proc, url
    stop_process_group(proc)


@pytest.fixture
def backends():
    """Start backends by name; each is a real server process on its own port."""
    started: list[subprocess.Popen] = []

    def start(name: str) -> Backend:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.gateway.backend", "--port", str(port), "--name", name],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"

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


def publish(client, url: str, *routes: RouteEntry) -> int:
    """Publish, and wait until every gateway process has the table (as the controller does: a
    process's /healthz speaks only for itself)."""
    generation = table.publish(client, list(routes))
    wait_for(lambda: (table.applied_generation(client) or 0) >= generation, 10, "table")
    return generation


def route(path: str, *groups: Group) -> RouteEntry:
    return RouteEntry(path, list(groups))


def slow_request(url: str) -> tuple[dict[str, httpx.Response], threading.Thread]:
    """A 2 s request through the gateway, in flight by the time this returns."""
    slow: dict[str, httpx.Response] = {}
    thread = threading.Thread(
        target=lambda: slow.update(
            answer=httpx.get(url + "/models/t/m/v1/slow?seconds=2", timeout=10)
        )
    )
    thread.start()
    time.sleep(0.5)
    return slow, thread


def closed_port_backend(name: str) -> Backend:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    return Backend(name, openai=url, kserve_http=url)


def test_weights_split_requests_exactly_and_every_route_kind_is_proxied(client, gateway, backends):
    _, url = gateway
    a, b = backends("a"), backends("b")
    publish(
        client,
        url,
        route("search/chat", Group("v1", 25, [a]), Group("v2", 75, [b])),
        route("search/chat/versions/2", Group("v2", 100, [b])),
    )
    served = []
    with httpx.Client() as http:
        for _ in range(400):
            answer = http.post(url + "/models/search/chat/v1/completions", json={"n": 1})
            assert answer.status_code == 200
            served.append((answer.json()["backend"], answer.headers["x-served-version"]))
    assert served.count(("a", "v1")) == 100 and served.count(("b", "v2")) == 300
    assert all(("a", "v1") in served[i : i + 4] for i in range(0, 400, 4))  # evenly spread

    echoed = httpx.post(
        url + "/models/search/chat/versions/2/v2/models/m/infer?x=1",
        content=b'{"inputs": []}',
        headers={"Authorization": "Bearer t"},
    ).json()
    assert echoed == {
        "backend": "b",
        "method": "POST",
        "path": "/v2/models/m/infer",
        "query": "x=1",
        "body": '{"inputs": []}',
        "auth": "Bearer t",
    }


def test_unknown_routes_and_empty_routes_answer_with_clear_errors(client, gateway):
    _, url = gateway
    publish(client, url, route("search/chat", Group("v1", 100, [])))
    missing = httpx.post(url + "/models/search/other/v1/completions")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "No model is served at /models/search/other/."
    empty = httpx.post(url + "/models/search/chat/v1/completions")
    assert empty.status_code == 503
    assert empty.json() == {
        "error": {"message": "no ready instance for route search/chat", "type": "unavailable"}
    }
    assert httpx.get(url + "/models/search/chat/admin").status_code == 404


def test_a_backend_that_refuses_connections_is_skipped_without_failing_anyone(
    client, gateway, backends
):
    _, url = gateway
    live = backends("live")
    publish(client, url, route("t/m", Group("v1", 50, [closed_port_backend("dead"), live])))
    for _ in range(20):
        answer = httpx.post(url + "/models/t/m/v1/x")
        assert answer.status_code == 200 and answer.json()["backend"] == "live"
    # Every process alternates between the two on its own, and /metrics sums the processes:
    # about one request in two tried the dead backend first.
    [retries] = [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(url + "/metrics").text.splitlines()
        if line.startswith('gateway_connect_retries_total{route="t/m"}')
    ]
    assert 9 <= retries <= 11


def test_a_request_that_reached_a_backend_is_never_retried(client, gateway, backends):
    _, url = gateway
    doomed, other = backends("doomed"), backends("other")
    publish(client, url, route("t/m", Group("v1", 100, [doomed, other])))
    answer = httpx.post(url + "/models/t/m/v1/die", json={"prompt": "x"})
    assert answer.status_code == 502
    assert answer.json()["error"]["type"] == "upstream_error"
    assert httpx.get(other.openai + "/v1/count").json()["requests"] == 0  # no second try


def test_a_backend_leaving_the_table_finishes_what_it_has(client, gateway, backends):
    _, url = gateway
    old, new = backends("old"), backends("new")
    publish(client, url, route("t/m", Group("v1", 100, [old])))
    slow, thread = slow_request(url)
    publish(client, url, route("t/m", Group("v2", 100, [new])))
    assert httpx.post(url + "/models/t/m/v1/x").json()["backend"] == "new"
    thread.join()
    assert slow["answer"].status_code == 200 and slow["answer"].json()["backend"] == "old"


def test_streams_are_passed_on_as_they_come(client, gateway, backends):
    _, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("s")])))
    arrivals = []
    started = time.monotonic()
    with httpx.stream("POST", url + "/models/t/m/v1/stream", timeout=10) as answer:
        for line in answer.iter_lines():
            if line:
                arrivals.append((line, time.monotonic() - started))
    assert [line for line, _ in arrivals] == ["data: 0", "data: 1", "data: 2", "data: [DONE]"]
    assert arrivals[0][1] < arrivals[-1][1] - 1.5  # the first event did not wait for the last


def test_a_malformed_table_is_ignored_and_the_last_good_one_kept(client, gateway, backends):
    proc, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("good")])))
    client.set("gateway:routes", '{"generation": 99, "routes": [{"path": "/bad"}]}')
    client.incr("gateway:generation")
    time.sleep(0.5)
    assert proc.poll() is None
    assert httpx.post(url + "/models/t/m/v1/x").json()["backend"] == "good"


def test_a_table_written_after_its_number_was_taken_is_still_applied(client, gateway, backends):
    """A publisher takes the generation number before it writes the table. A gateway that looks
    in between reads no table (or the previous one) under the new number, and must read again
    rather than wait for the next publication (this once left a gateway on the old table)."""
    _, url = gateway
    good = backends("good")
    number = int(client.incr("gateway:generation"))
    time.sleep(0.5)  # several polls see the new number before its table exists
    document = {
        "generation": number,
        "routes": [dataclasses.asdict(route("t/m", Group("v1", 100, [good])))],
    }
    client.set("gateway:routes", json.dumps(document))
    wait_for(lambda: (table.applied_generation(client) or 0) >= number, 10, "table")
    assert httpx.post(url + "/models/t/m/v1/x").json()["backend"] == "good"


def test_gateways_report_what_they_applied_and_when_routes_were_used(client, gateway, backends):
    _, url = gateway
    assert table.applied_generation(client) == 0
    generation = publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    wait_for(lambda: table.applied_generation(client) == generation, 5, "the report")
    before = time.time()
    httpx.post(url + "/models/t/m/v1/x")
    wait_for(lambda: table.last_requests(client).get("t/m", 0) >= before, 5, "last request")


def test_sigterm_lets_in_flight_requests_finish(client, gateway, backends):
    proc, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    slow, thread = slow_request(url)
    os.killpg(proc.pid, signal.SIGTERM)
    thread.join()
    assert slow["answer"].status_code == 200
    assert proc.wait(timeout=10) == 0
    assert table.applied_generation(client) is None  # it said goodbye


def test_a_gateway_process_killed_loses_only_its_in_flight_requests(client, gateway, backends):
    proc, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    supervisor = psutil.Process(proc.pid)
    workers = supervisor.children()
    assert len(workers) == 2  # the default: two processes share the port
    results: list[int | str] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            try:
                results.append(httpx.post(url + "/models/t/m/v1/x", timeout=10).status_code)
            except httpx.HTTPError as exc:
                results.append(type(exc).__name__)

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for thread in callers:
        thread.start()
    wait_for(lambda: len(results) > 50, 30, "requests before the kill")
    workers[0].kill()
    killed_at = len(results)
    wait_for(
        lambda: len(supervisor.children()) == 2 and workers[0] not in supervisor.children(),
        30,
        "the supervisor to start another gateway process",
    )
    wait_for(lambda: len(results) > killed_at + 100, 30, "requests after the kill")
    stop.set()
    for thread in callers:
        thread.join()
    failed = [r for r in results if r != 200]
    assert len(failed) <= 3, failed  # at most what the three callers had in flight on it
    assert all(r == 200 for r in results[-50:])


def test_a_gateway_started_after_redis_lost_the_table_serves_the_saved_copy(
    client, backends, tmp_path
):
    saved = tmp_path / "gateway-table.json"
    first, url = start_gateway(settings.REDIS_URL, "--table-file", str(saved))
    try:
        publish(client, url, route("t/m", Group("v1", 100, [backends("old")])))
        wait_for(saved.exists, 10, "the saved copy")
        client.flushdb()  # a Redis restart without persistence
        assert httpx.post(url + "/models/t/m/v1/x").json()["backend"] == "old"  # keeps its table
        second, second_url = start_gateway(settings.REDIS_URL, "--table-file", str(saved))
        try:
            assert httpx.post(second_url + "/models/t/m/v1/x").json()["backend"] == "old"
            # The controller publishes again; Redis's counter started over below what the
            # gateways run, and both still take the new table.
            generation = table.publish(client, [route("t/m", Group("v1", 100, [backends("new")]))])
            assert generation == 1
            for base in (url, second_url):
                wait_for(
                    lambda base=base: (
                        httpx.post(base + "/models/t/m/v1/x").json()["backend"] == "new"
                    ),
                    10,
                    "the table published after the loss",
                )
        finally:
            stop_process_group(second)
    finally:
        stop_process_group(first)


def test_bodies_over_the_configured_limit_are_413_and_never_forwarded(client, backends):
    proc, url = start_gateway(settings.REDIS_URL, env={"GATEWAY_MAX_BODY_BYTES": "1000"})
    try:
        b = backends("b")
        publish(client, url, route("t/m", Group("v1", 100, [b])))
        before = httpx.get(b.openai + "/v1/count").json()
        with httpx.Client() as http:
            at_limit = http.post(url + "/models/t/m/v1/completions", content=b"x" * 1000)
            assert at_limit.status_code == 200
            declared = http.post(url + "/models/t/m/v1/completions", content=b"x" * 1001)
            assert declared.status_code == 413
            error = declared.json()["error"]
            assert error["type"] == "request_too_large" and "1000 bytes" in error["message"]
            chunked = http.post(
                url + "/models/t/m/v2/models/m/infer", content=iter([b"x" * 600, b"x" * 600])
            )
            assert chunked.status_code == 413
            assert chunked.json()["error"]["type"] == "request_too_large"
        after = httpx.get(b.openai + "/v1/count").json()
        assert after["requests"] - before["requests"] == 1  # only the one at the limit
    finally:
        stop_process_group(proc)


def test_a_gateway_that_cannot_listen_exits_with_an_error(clean_redis):
    """A port taken by another program: every process dies before it listens, and the
    supervisor says so with its exit status instead of ever printing GATEWAY READY."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "serving.gateway",
                "--port",
                str(port),
                "--redis-url",
                settings.REDIS_URL,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    assert "GATEWAY READY" not in proc.stdout
    assert "died before it listened" in proc.stderr
