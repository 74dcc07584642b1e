"""The gateway as a real process in front of real HTTP backends, following a real Redis table."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import psutil
import pytest
import redis
from django.conf import settings

from serving.gateway import keys, table
from serving.gateway import observations as gateway_observations
from serving.gateway.keys import KeyEntry, Limits
from serving.gateway.table import Backend, Group, RouteEntry
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import ROOT, metrics_url, start_gateway, wait_for
from tests.ports import free_port

#: Caller keys of the teams the tests route for (``t`` and ``search``), published before a
#: gateway starts.
T_KEY = "mlk_0000000t_secret-of-team-t"
SEARCH_KEY = "mlk_search00_secret-of-team-search"
AUTH = {"Authorization": f"Bearer {T_KEY}"}
SEARCH_AUTH = {"Authorization": f"Bearer {SEARCH_KEY}"}


def key_entry(plaintext: str, team: str, **fields) -> KeyEntry:
    prefix = keys.split_key(plaintext)
    assert prefix is not None
    return KeyEntry(prefix, keys.digest(plaintext), team, **fields)


def publish_keys(client, *entries: KeyEntry, teams: dict[str, Limits] | None = None) -> None:
    keys.publish(client, keys.document(list(entries), teams or {}))


@pytest.fixture
def client(clean_redis):
    client = redis.Redis.from_url(settings.REDIS_URL)
    publish_keys(client, key_entry(T_KEY, "t"), key_entry(SEARCH_KEY, "search"))
    return client


@pytest.fixture
def gateway(client):
    proc, url = start_gateway(settings.REDIS_URL)
    yield proc, url
    stop_process_group(proc)


def publish(client, url: str, *routes: RouteEntry) -> int:
    """Publish, and wait until every gateway process has the table (as the controller does: a
    process's /healthz speaks only for itself)."""
    generation = table.publish(client, list(routes))
    wait_for(lambda: (table.applied_generation(client) or 0) >= generation, 10, "table")
    return generation


def route(path: str, *groups: Group) -> RouteEntry:
    return RouteEntry(path, list(groups))


def slow_request(url: str, backend: Backend) -> tuple[dict[str, httpx.Response], threading.Thread]:
    """A 2 s request through the gateway to ``backend``, which has it by the time this
    returns."""
    before = httpx.get(f"{backend.openai}/v1/count").json()["requests"]
    slow: dict[str, httpx.Response] = {}
    thread = threading.Thread(
        target=lambda: slow.update(
            answer=httpx.get(url + "/models/t/m/v1/slow?seconds=2", timeout=60, headers=AUTH)
        )
    )
    thread.start()
    wait_for(
        lambda: httpx.get(f"{backend.openai}/v1/count").json()["requests"] > before,
        30,
        "the slow request at its backend",
        interval=0.05,
    )
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
    with httpx.Client(headers=SEARCH_AUTH) as http:
        for _ in range(400):
            answer = http.post(url + "/models/search/chat/v1/completions", json={"n": 1})
            assert answer.status_code == 200
            served.append((answer.json()["backend"], answer.headers["x-served-version"]))
    assert served.count(("a", "v1")) == 100 and served.count(("b", "v2")) == 300
    assert all(("a", "v1") in served[i : i + 4] for i in range(0, 400, 4))  # evenly spread

    echoed = httpx.post(
        url + "/models/search/chat/versions/2/v2/models/m/infer?x=1",
        content=b'{"inputs": []}',
        headers={"X-API-Key": SEARCH_KEY},  # the header tritonclient callers may set instead
    ).json()
    assert echoed == {
        "backend": "b",
        "method": "POST",
        "path": "/v2/models/m/infer",
        "query": "x=1",
        "body": '{"inputs": []}',
        "auth": "",  # the caller's key is the gateway's: no instance ever sees it
    }


def test_openai_routes_sit_right_under_the_base_url_and_the_v1_form_still_works(
    client, gateway, backends
):
    _, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    publish(
        client,
        url,
        route("t/m", Group("v1", 100, [backends("b")])),
        route("t/m/versions/2", Group("v2", 100, [backends("c")])),
    )
    for path, backend, upstream in (
        ("/models/t/m/chat/completions", "b", "/v1/chat/completions"),
        ("/models/t/m/v1/chat/completions", "b", "/v1/chat/completions"),
        ("/models/t/m/versions/2/models", "c", "/v1/models"),
        ("/models/t/m/v2/models/m/infer", "b", "/v2/models/m/infer"),
    ):
        echoed = httpx.post(url + path, headers=AUTH).json()
        assert (echoed["backend"], echoed["path"]) == (backend, upstream), path
    base = httpx.post(url + "/models/t/m", headers=AUTH)
    assert base.status_code == 404 and "base URL" in base.json()["error"]["message"]


def test_unknown_routes_and_empty_routes_answer_with_clear_errors(client, gateway):
    _, url = gateway
    publish(client, url, route("search/chat", Group("v1", 100, [])))
    missing = httpx.post(url + "/models/search/other/v1/completions", headers=SEARCH_AUTH)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "No model is served at /models/search/other/."
    empty = httpx.post(url + "/models/search/chat/v1/completions", headers=SEARCH_AUTH)
    assert empty.status_code == 503
    assert empty.json() == {
        "error": {"message": "no ready instance for route search/chat", "type": "unavailable"}
    }
    assert httpx.get(url + "/models/search/chat", headers=SEARCH_AUTH).status_code == 404


@pytest.mark.slow
def test_a_backend_that_refuses_connections_is_skipped_without_failing_anyone(
    client, gateway, backends
):
    _, url = gateway
    live = backends("live")
    publish(client, url, route("t/m", Group("v1", 50, [closed_port_backend("dead"), live])))
    for _ in range(20):
        answer = httpx.post(url + "/models/t/m/v1/x", headers=AUTH)
        assert answer.status_code == 200 and answer.json()["backend"] == "live"
    # Every process alternates between the two on its own, and /metrics sums the processes:
    # about one request in two tried the dead backend first.
    [retries] = [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(metrics_url(url) + "/metrics").text.splitlines()
        if line.startswith('gateway_connect_retries_total{route="t/m"}')
    ]
    assert 9 <= retries <= 11


def test_a_request_that_reached_a_backend_is_never_retried(client, gateway, backends):
    _, url = gateway
    doomed, other = backends("doomed"), backends("other")
    publish(client, url, route("t/m", Group("v1", 100, [doomed, other])))
    answer = httpx.post(url + "/models/t/m/v1/die", json={"prompt": "x"}, headers=AUTH)
    assert answer.status_code == 502
    assert answer.json()["error"]["type"] == "upstream_error"
    assert httpx.get(other.openai + "/v1/count").json()["requests"] == 0  # no second try


def test_a_backend_leaving_the_table_finishes_what_it_has(client, gateway, backends):
    _, url = gateway
    old, new = backends("old"), backends("new")
    publish(client, url, route("t/m", Group("v1", 100, [old])))
    slow, thread = slow_request(url, old)
    publish(client, url, route("t/m", Group("v2", 100, [new])))
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "new"
    thread.join()
    assert slow["answer"].status_code == 200 and slow["answer"].json()["backend"] == "old"


def test_streams_are_passed_on_as_they_come(client, gateway, backends):
    _, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("s")])))
    arrivals = []
    started = time.monotonic()
    with httpx.stream("POST", url + "/models/t/m/v1/stream", timeout=10, headers=AUTH) as answer:
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
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "good"


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
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "good"


def test_gateways_report_what_they_applied_and_when_routes_were_used(client, gateway, backends):
    _, url = gateway
    assert table.applied_generation(client) == 0
    generation = publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    wait_for(lambda: table.applied_generation(client) == generation, 5, "the report")
    before = time.time()
    httpx.post(url + "/models/t/m/v1/x", headers=AUTH)
    wait_for(lambda: table.last_requests(client).get("t/m", 0) >= before, 5, "last request")


def test_kserve_inference_requests_are_observed_by_version_for_the_canary_analysis(
    client, gateway, backends
):
    """Each KServe v2 inference call is kept with the version that answered, its status and
    latency, and read back by the window it ended in; OpenAI calls (observed by the front ends)
    and KServe metadata calls are not."""
    _, url = gateway
    publish(
        client,
        url,
        route("t/m", Group("v1", 50, [backends("a")]), Group("v2", 50, [backends("b")])),
    )
    since = time.time()
    with httpx.Client(headers=AUTH) as http:
        for _ in range(20):
            assert http.post(url + "/models/t/m/v2/models/m/infer", json={}).status_code == 200
        assert http.post(url + "/models/t/m/v2/models/m/generate", json={}).status_code == 200
        assert http.get(url + "/models/t/m/v2/models/m").status_code == 200
        assert http.post(url + "/models/t/m/completions", json={}).status_code == 200

    def read():
        found = gateway_observations.read(client, "gateway", "t/m", since, time.time())
        return len(found) == 21 and found

    found = wait_for(read, 10, "the observations flushed")
    assert {r["version"] for r in found} == {"v1", "v2"}
    assert Counter(r["version"] for r in found)["v1"] in range(5, 17)  # the 50/50 split
    assert all(r["status"] == 200 and r["error"] is None for r in found)
    assert all(r["protocol"] == "kserve" and 0 < r["latency_s"] < 10 for r in found)
    assert gateway_observations.read(client, "gateway", "t/m", 0, since) == []
    assert gateway_observations.read(client, "gateway", "other/model", since, time.time()) == []


def test_sigterm_lets_in_flight_requests_finish(client, gateway, backends):
    proc, url = gateway
    b = backends("b")
    publish(client, url, route("t/m", Group("v1", 100, [b])))
    slow, thread = slow_request(url, b)
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
                results.append(
                    httpx.post(url + "/models/t/m/v1/x", timeout=10, headers=AUTH).status_code
                )
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
    saved_keys = tmp_path / "gateway-keys.json"
    files = ("--table-file", str(saved), "--keys-file", str(saved_keys))
    first, url = start_gateway(settings.REDIS_URL, *files)
    try:
        published = publish(client, url, route("t/m", Group("v1", 100, [backends("old")])))
        wait_for(lambda: saved.exists() and saved_keys.exists(), 10, "the saved copies")
        client.flushdb()  # a Redis restart without persistence
        assert (
            httpx.post(url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "old"
        )  # keeps its table
        second, second_url = start_gateway(settings.REDIS_URL, *files)
        try:
            assert (
                httpx.post(second_url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "old"
            )
            # The controller publishes again: the counter Redis lost starts past every number
            # it gave before, so what waits for "this generation or newer" is not stuck.
            generation = table.publish(client, [route("t/m", Group("v1", 100, [backends("new")]))])
            assert generation > published
            for base in (url, second_url):
                wait_for(
                    lambda base=base: (
                        httpx.post(base + "/models/t/m/v1/x", headers=AUTH).json()["backend"]
                        == "new"
                    ),
                    10,
                    "the table published after the loss",
                )
        finally:
            stop_process_group(second)
    finally:
        stop_process_group(first)


def test_a_counter_that_went_back_after_redis_lost_its_data_is_recognised(
    client, gateway, backends
):
    """A counter started again at 1 after a loss (as portals did before
    :func:`table.next_generation`, or with a clock set back): the gateway takes the table
    published under it although its number is below the one it runs."""
    _, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("old")])))
    client.flushdb()
    number = int(client.incr("gateway:generation"))
    document = {
        "generation": number,
        "routes": [dataclasses.asdict(route("t/m", Group("v1", 100, [backends("new")])))],
    }
    client.set("gateway:routes", json.dumps(document))
    wait_for(
        lambda: httpx.post(url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "new",
        10,
        "the table under the lower number",
    )


def test_counters_never_go_back_even_after_redis_lost_its_data(client):
    before = [table.publish(client, []) for _ in range(3)]
    keys_before = keys.publish(client, keys.document([], {}))
    assert before == sorted(before) and len(set(before)) == 3
    client.flushdb()
    assert table.publish(client, []) > before[-1]
    assert keys.publish(client, keys.document([], {})) > keys_before


def test_bodies_over_the_configured_limit_are_413_and_never_forwarded(client, backends):
    proc, url = start_gateway(settings.REDIS_URL, env={"GATEWAY_MAX_BODY_BYTES": "1000"})
    try:
        b = backends("b")
        publish(client, url, route("t/m", Group("v1", 100, [b])))
        before = httpx.get(b.openai + "/v1/count").json()
        with httpx.Client(headers=AUTH) as http:
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
            # Under v2/ the gateway answers in KServe's error shape.
            assert "1000 bytes" in chunked.json()["error"]
        after = httpx.get(b.openai + "/v1/count").json()
        assert after["requests"] - before["requests"] == 1  # only the one at the limit
    finally:
        stop_process_group(proc)


@pytest.mark.parametrize("reuse_port", [False, True], ids=["plain", "reuse-port"])
def test_a_gateway_whose_port_is_taken_exits_with_an_error(clean_redis, reuse_port):
    """A port another program listens on, or the orphaned processes of an older gateway (they
    listen with SO_REUSEPORT, which would let new ones bind beside them and split the port's
    connections): the supervisor starts no process, says why, and exits 1 instead of ever
    printing GATEWAY READY."""
    with socket.socket() as taken:
        if reuse_port:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
                "--port-wait",
                "0.5",
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
    assert f"127.0.0.1:{port} is in use" in proc.stderr


def test_a_killed_supervisor_takes_its_processes_with_it(client, gateway, backends):
    """kill -9 the supervisor: its processes drain and exit (they do not go on serving,
    untracked), and a gateway started on the same port then serves alone."""
    proc, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    workers = psutil.Process(proc.pid).children()
    assert len(workers) == 2
    proc.kill()
    proc.wait()
    wait_for(
        lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers),
        30,
        "the orphaned gateway processes to exit",
    )
    port = int(url.rsplit(":", 1)[1])
    second, _ = start_gateway(settings.REDIS_URL, port=port)
    try:
        listeners = [
            c.pid
            for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        ]
        assert sorted(listeners) == sorted(p.pid for p in psutil.Process(second.pid).children())
        assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).json()["backend"] == "b"
    finally:
        stop_process_group(second)


def test_metrics_are_served_on_their_own_port_never_to_callers(client, gateway, backends):
    """/metrics names every team's routes: the caller-facing port does not serve it."""
    _, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).status_code == 200
    assert httpx.get(url + "/metrics").status_code == 404

    def counted() -> bool:
        # The gateway counts an answer once it has sent it: the caller may read it first.
        scraped = httpx.get(metrics_url(url) + "/metrics")
        assert scraped.status_code == 200
        return 'gateway_requests_total{code="200",route="t/m"}' in scraped.text

    wait_for(counted, 30, "the request counted at the metrics port")


def test_a_connection_sending_its_headers_slowly_is_closed(clean_redis):
    proc, url = start_gateway(settings.REDIS_URL, "--header-timeout", "1")
    try:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")  # and never the end
            # The gateway closes it: the read ends (b"") instead of timing out after 30 s.
            assert slow.recv(1024) == b""
        # A caller sending its request at once is served as before.
        assert httpx.get(url + "/healthz").status_code == 200
    finally:
        stop_process_group(proc)


def test_one_address_holds_at_most_the_capped_connections(clean_redis):
    """One gateway process (the cap is per process), a cap of 2: a third open connection from
    the same address is answered 429 and closed; once one closes, another is taken."""
    proc, url = start_gateway(
        settings.REDIS_URL,
        *("--workers", "0", "--max-connections-per-client", "2"),
        *("--header-timeout", "0"),  # the two held connections never send a request
    )
    port = int(url.rsplit(":", 1)[1])
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as third:
            answer = third.recv(1024)
        assert answer.startswith(b"HTTP/1.1 429 "), answer
        held.pop().close()
        wait_for(
            lambda: httpx.get(url + "/healthz", timeout=10).status_code == 200,
            30,
            "a connection taken again once one of the two closed",
        )
        for sock in held:
            sock.close()
    finally:
        stop_process_group(proc)


# --- caller keys and rate limits ------------------------------------------------------------


def test_callers_need_a_valid_key_scoped_to_the_model(client, gateway, backends):
    _, url = gateway
    b = backends("b")
    scoped = "mlk_scoped01_only-model-m"
    expired = "mlk_expired1_long-gone"
    publish_keys(
        client,
        key_entry(T_KEY, "t"),
        key_entry(scoped, "t", models=("m",)),
        key_entry(expired, "t", expires_at=time.time() - 1),
    )
    publish(
        client, url, route("t/m", Group("v1", 100, [b])), route("t/other", Group("v1", 100, [b]))
    )
    wait_for(
        lambda: (
            httpx.post(url + "/models/t/m/v1/x", headers={"X-API-Key": scoped}).status_code == 200
        ),
        10,
        "the new key set",
    )
    before = httpx.get(b.openai + "/v1/count").json()["requests"]

    def status(path: str, headers: dict[str, str]) -> tuple[int, str]:
        answer = httpx.post(url + path, headers=headers)
        return answer.status_code, answer.json()["error"][
            "type"
        ] if answer.status_code != 200 else ""

    assert status("/models/t/m/v1/x", {}) == (401, "invalid_api_key")
    missing = httpx.post(url + "/models/t/m/v1/x")
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="models"'
    assert "Authorization: Bearer" in missing.json()["error"]["message"]
    # A caller without a valid key learns nothing: a route that does not exist reads the same.
    assert status("/models/t/none/v1/x", {}) == (401, "invalid_api_key")
    assert status("/models/t/m/v1/x", {"Authorization": "Bearer mlk_0000000t_wrong"})[0] == 401
    assert status("/models/t/m/v1/x", {"Authorization": "Basic " + T_KEY})[0] == 401
    assert status("/models/t/m/v1/x", {"Authorization": f"Bearer {expired}"})[0] == 401
    assert httpx.post(
        url + "/models/t/m/v1/x", headers={"Authorization": f"Bearer {expired}"}
    ).json()["error"]["message"] == ("The caller key has expired.")
    # Another team's model, or a model outside the key's list: 403, never forwarded.
    assert status("/models/search/chat/v1/x", AUTH) == (403, "permission_denied")
    assert status("/models/t/other/v1/x", {"Authorization": f"Bearer {scoped}"}) == (
        403,
        "permission_denied",
    )
    assert status("/models/t/other/v1/x", AUTH) == (200, "")
    # Under v2/ the refusals take KServe's shape, which tritonclient turns into its exception.
    from tritonclient.http import InferenceServerClient
    from tritonclient.utils import InferenceServerException

    triton = InferenceServerClient(url.removeprefix("http://") + "/models/t/m")
    with pytest.raises(InferenceServerException) as refused:
        triton.get_model_metadata("m")
    assert refused.value.status() == "401" and "caller key is required" in str(refused.value)
    assert triton.get_model_metadata("m", headers=AUTH)["path"] == "/v2/models/m"  # echoed
    assert status("/models/t/m/v1/x", {"Authorization": f"bearer {scoped}"}) == (200, "")
    # Only the three accepted requests reached the backend.
    assert httpx.get(b.openai + "/v1/count").json()["requests"] - before == 3


def test_a_revoked_key_is_refused_within_a_second_and_its_use_is_reported(
    client, gateway, backends
):
    _, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    before = time.time()
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).status_code == 200
    wait_for(
        lambda: float(client.hget("gateway:key_last_used", "0000000t") or 0) >= before,
        5,
        "the key's last use",
    )
    publish_keys(client, key_entry(SEARCH_KEY, "search"))  # the portal revoked T_KEY
    revoked_at = time.monotonic()
    # Every gateway process (two share the port) must refuse it: ask several times in a row.
    wait_for(
        lambda: all(
            httpx.post(url + "/models/t/m/v1/x", headers=AUTH).status_code == 401 for _ in range(6)
        ),
        5,
        "the revocation",
        interval=0.05,
    )
    assert time.monotonic() - revoked_at < 2


def test_a_malformed_key_set_is_ignored_and_the_last_good_one_kept(client, gateway, backends):
    proc, url = gateway
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    client.set("gateway:keys", '{"keys": [{"prefix": 1}], "teams": {}}')
    client.incr("gateway:keys:generation")
    time.sleep(0.5)
    assert proc.poll() is None
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).status_code == 200


def test_request_rate_limits_hold_across_gateway_processes_with_retry_after(
    client, gateway, backends
):
    """One request per second for the key, whichever of the gateway's two processes answers:
    the buckets are in Redis, shared."""
    _, url = gateway
    publish_keys(client, key_entry(T_KEY, "t", limits=Limits(requests_per_second=1)))
    b = backends("b")
    publish(client, url, route("t/m", Group("v1", 100, [b])))
    time.sleep(1.5)  # the key set is applied, and the bucket full
    started = time.monotonic()
    answers = []
    for _ in range(8):
        with httpx.Client(headers=AUTH) as fresh:  # a new connection each: both processes answer
            answers.append(fresh.post(url + "/models/t/m/v1/x"))
    elapsed = time.monotonic() - started
    passed = [a for a in answers if a.status_code == 200]
    limited = [a for a in answers if a.status_code == 429]
    assert len(passed) + len(limited) == 8
    assert 1 <= len(passed) <= 1 + int(elapsed)  # the burst of one, plus what refilled
    assert limited[0].headers["Retry-After"] == "1"
    assert limited[0].json()["error"]["type"] == "rate_limit_exceeded"
    time.sleep(1.0)
    assert httpx.post(url + "/models/t/m/v1/x", headers=AUTH).status_code == 200


def test_team_token_limits_count_each_request_by_its_max_tokens(client, gateway, backends):
    """600 tokens a minute for the team, shared by its keys; a request counts its body's
    estimated prompt and its ``max_tokens``, and a refused one takes nothing."""
    _, url = gateway
    other = "mlk_0000000u_second-key-of-t"
    publish_keys(
        client,
        key_entry(T_KEY, "t"),
        key_entry(other, "t"),
        teams={"t": Limits(tokens_per_minute=600)},
    )
    publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
    time.sleep(1.5)
    body = {"prompt": "Hi", "max_tokens": 500}  # about 510 tokens with the body's bytes
    assert (
        httpx.post(url + "/models/t/m/v1/completions", json=body, headers=AUTH).status_code == 200
    )
    refused = httpx.post(
        url + "/models/t/m/v1/completions", json=body, headers={"X-API-Key": other}
    )
    assert refused.status_code == 429
    # About 420 tokens short at 10 a second: some 42 s to wait.
    assert 35 <= int(refused.headers["Retry-After"]) <= 45
    small = {"prompt": "Hi", "max_tokens": 20}
    assert (
        httpx.post(url + "/models/t/m/v1/completions", json=small, headers=AUTH).status_code == 200
    )


def test_without_redis_requests_pass_unlimited_on_the_saved_keys(client, backends, tmp_path):
    """Rate limits need Redis; a gateway that cannot reach it still checks keys (from its saved
    copy) and serves, and counts what it let through unlimited."""
    saved, saved_keys = tmp_path / "table.json", tmp_path / "keys.json"
    files = ("--table-file", str(saved), "--keys-file", str(saved_keys))
    publish_keys(client, key_entry(T_KEY, "t", limits=Limits(requests_per_second=1)))
    first, url = start_gateway(settings.REDIS_URL, *files)
    try:
        publish(client, url, route("t/m", Group("v1", 100, [backends("b")])))
        wait_for(lambda: saved.exists() and saved_keys.exists(), 10, "the saved copies")
    finally:
        stop_process_group(first)
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    proc, url = start_gateway(nowhere, *files)
    try:
        codes = [httpx.post(url + "/models/t/m/v1/x", headers=AUTH).status_code for _ in range(5)]
        assert codes == [200] * 5
        assert httpx.post(url + "/models/t/m/v1/x").status_code == 401
        unlimited = [
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(metrics_url(url) + "/metrics").text.splitlines()
            if line.startswith("gateway_rate_limits_unavailable_total")
        ]
        assert sum(unlimited) == 5
    finally:
        stop_process_group(proc)
