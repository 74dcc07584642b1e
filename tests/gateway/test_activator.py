"""Scale to zero at the gateway: a request for a deployment with no instance is held while the
gateway asks for the wake, and released once the table gives the route one. A real gateway
process, real backends, a real Redis (also the Celery broker, whose queue the test reads; no
worker runs)."""

from __future__ import annotations

import base64
import json
import os
import threading
import time

import httpx
import pytest
import redis
from django.conf import settings

from serving.gateway import table
from serving.gateway.activator import WAKE_TASK
from serving.gateway.table import Group, RouteEntry, TableError
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import metrics_url, start_gateway, wait_for
from tests.gateway.test_gateway import AUTH, SEARCH_KEY, T_KEY, key_entry, publish, publish_keys
from tests.ports import free_port

DEPLOYMENT = 7
COMPLETIONS = "/models/t/m/v1/completions"


@pytest.fixture
def client(clean_redis):
    client = redis.Redis.from_url(settings.REDIS_URL)
    publish_keys(client, key_entry(T_KEY, "t"), key_entry(SEARCH_KEY, "search"))
    return client


@pytest.fixture
def queue():
    """A Celery queue of the test's own, which the gateway sends its wake task to."""
    return f"activator-test-{os.getpid()}"


@pytest.fixture
def gateway_with(client, queue):
    """Start a gateway with options; stopped after the test."""
    started = []

    def start(*options: str) -> str:
        proc, url = start_gateway(settings.REDIS_URL, *options, env={"CELERY_QUEUE": queue})
        started.append(proc)
        return url

    yield start
    for proc in started:
        stop_process_group(proc)


def asleep(*backends) -> RouteEntry:
    """Route ``t/m`` of deployment 7, which scales to zero: no backend while it sleeps."""
    return RouteEntry("t/m", [Group("v1", 100, list(backends))], wake=DEPLOYMENT)


def metric(url: str, name: str, labels: str = "") -> float:
    """The value of one sample at /metrics (summed over the gateway's processes), 0 if absent."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in httpx.get(metrics_url(url) + "/metrics").text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == wanted:
            return float(value)
    return 0.0


def held(url: str) -> float:
    return metric(url, "gateway_held_requests")


def activations(url: str, outcome: str) -> float:
    return metric(url, "gateway_activations_total", f'outcome="{outcome}"')


def in_thread(call) -> tuple[dict[str, object], threading.Thread]:
    """Run ``call`` in a thread; its answer (or the exception it raised) lands in the dict."""
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["answer"] = call()
        except Exception as exc:  # the test looks at it
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return result, thread


def wake_messages(broker: redis.Redis, queue: str) -> list[tuple[str, list]]:
    """The Celery messages waiting in ``queue`` (kombu's JSON envelope on a Redis list), as
    (task name, args)."""
    found = []
    for raw in broker.lrange(queue, 0, -1):
        envelope = json.loads(raw)
        assert envelope["properties"]["body_encoding"] == "base64"
        args, _kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        found.append((envelope["headers"]["task"], args))
    return found


def test_a_held_request_is_released_once_the_table_gives_its_route_an_instance(
    client, gateway_with, queue, backends
):
    url = gateway_with()
    publish(client, url, asleep())
    body = {"prompt": "Hello", "max_tokens": 3}
    result, thread = in_thread(
        lambda: httpx.post(url + COMPLETIONS, json=body, headers=AUTH, timeout=60)
    )
    wait_for(lambda: held(url) == 1, 10, "the request to be held")
    # The wake was asked for twice over: in Redis, for the portal's periodic task, and with a
    # Celery task on the broker (sent by one gateway process only).
    wait_for(lambda: client.hget("gateway:wake", str(DEPLOYMENT)), 10, "the wake in Redis")
    assert abs(float(client.hget("gateway:wake", str(DEPLOYMENT))) - time.time()) < 60
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    messages = wait_for(lambda: wake_messages(broker, queue), 10, "the wake task on the broker")
    assert messages[0] == (WAKE_TASK, [DEPLOYMENT])
    assert WAKE_TASK == "portal.deployments.tasks.wake_deployment"
    assert thread.is_alive()  # still held: the route has no instance yet

    b = backends("b")  # the deployment woke: its instance starts, the controller publishes it
    publish(client, url, asleep(b))
    thread.join(timeout=30)
    answer = result["answer"]
    assert isinstance(answer, httpx.Response), result
    assert answer.status_code == 200
    assert answer.json()["backend"] == "b" and json.loads(answer.json()["body"]) == body
    assert held(url) == 0
    assert activations(url, "released") == 1
    # Once awake, requests go straight through.
    assert httpx.post(url + COMPLETIONS, headers=AUTH).json()["backend"] == "b"
    assert activations(url, "released") == 1


def test_a_request_held_too_long_is_answered_503_with_retry_after(client, gateway_with):
    url = gateway_with("--hold-seconds", "1")
    publish(client, url, asleep())
    started = time.monotonic()
    answer = httpx.post(url + COMPLETIONS, headers=AUTH, timeout=30)
    assert 0.9 <= time.monotonic() - started < 15
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "10"
    error = answer.json()["error"]
    assert error["type"] == "unavailable"
    assert "scaled to zero and starting" in error["message"]
    # Under v2/, KServe's shape.
    kserve = httpx.post(url + "/models/t/m/v2/models/m/infer", headers=AUTH, timeout=30)
    assert kserve.status_code == 503 and kserve.headers["Retry-After"] == "10"
    assert "scaled to zero and starting" in kserve.json()["error"]
    assert activations(url, "timed_out") == 2
    assert held(url) == 0
    assert client.hget("gateway:wake", str(DEPLOYMENT)) is not None


def test_a_request_over_the_hold_limit_is_answered_503_at_once(client, gateway_with, backends):
    url = gateway_with("--hold-max", "1", "--workers", "0")  # one process: one count
    publish(client, url, asleep())
    first, thread = in_thread(lambda: httpx.post(url + COMPLETIONS, headers=AUTH, timeout=60))
    wait_for(lambda: held(url) == 1, 10, "the first request to be held")
    started = time.monotonic()
    second = httpx.post(url + COMPLETIONS, headers=AUTH, timeout=30)
    assert time.monotonic() - started < 5  # not held
    assert second.status_code == 503 and second.headers["Retry-After"] == "10"
    assert "scaled to zero and starting" in second.json()["error"]["message"]
    assert activations(url, "refused") == 1
    publish(client, url, asleep(backends("b")))
    thread.join(timeout=30)
    answer = first["answer"]
    assert isinstance(answer, httpx.Response) and answer.status_code == 200, first


def test_a_caller_that_leaves_while_held_is_no_longer_counted(client, gateway_with):
    url = gateway_with("--hold-max", "1", "--workers", "0")
    publish(client, url, asleep())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + COMPLETIONS, headers=AUTH, timeout=httpx.Timeout(5, read=1))
    wait_for(lambda: held(url) == 0, 10, "the held count to drop")
    # The count is whole again: one request may be held again, not refused.
    _, thread = in_thread(lambda: httpx.post(url + COMPLETIONS, headers=AUTH, timeout=2))
    wait_for(lambda: held(url) == 1, 10, "another request to be held")
    thread.join(timeout=30)
    wait_for(lambda: held(url) == 0, 10, "the held count to drop again")
    assert activations(url, "refused") == activations(url, "timed_out") == 0


def test_a_route_without_wake_and_no_instance_is_503_at_once(client, gateway_with):
    url = gateway_with()
    publish(client, url, RouteEntry("t/m", [Group("v1", 100, [])]))
    started = time.monotonic()
    answer = httpx.post(url + COMPLETIONS, headers=AUTH, timeout=30)
    assert time.monotonic() - started < 5
    assert answer.status_code == 503 and "Retry-After" not in answer.headers
    assert answer.json() == {
        "error": {"message": "no ready instance for route t/m", "type": "unavailable"}
    }
    assert client.hgetall("gateway:wake") == {}
    assert held(url) == 0 and activations(url, "refused") == 0


def test_the_table_carries_wake_and_refuses_a_bad_one(clean_redis):
    client = redis.Redis.from_url(settings.REDIS_URL)
    generation = table.publish(client, [asleep(), RouteEntry("t/other")])
    assert table.parse(client.get("gateway:routes")) == (
        generation,
        [asleep(), RouteEntry("t/other", [], None)],
    )
    old = {"generation": 3, "routes": [{"path": "t/m", "groups": []}]}  # before scale to zero
    assert table.parse(json.dumps(old)) == (3, [RouteEntry("t/m", [], None)])
    for bad in ("7", 7.5, True, [7]):
        document = {"generation": 3, "routes": [{"path": "t/m", "groups": [], "wake": bad}]}
        with pytest.raises(TableError, match="bad wake"):
            table.parse(json.dumps(document))


def test_without_redis_or_broker_a_held_request_still_times_out_cleanly(
    client, gateway_with, tmp_path
):
    """Asking for the wake fails (no Redis, no broker): the gateway logs it and keeps the
    request held until its time is up, then answers the usual 503."""
    files = ("--table-file", str(tmp_path / "table.json"), "--keys-file", str(tmp_path / "k.json"))
    url = gateway_with(*files)
    publish(client, url, asleep())
    wait_for(
        lambda: (tmp_path / "table.json").exists() and (tmp_path / "k.json").exists(),
        10,
        "the saved copies",
    )
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    proc, url = start_gateway(
        nowhere, "--hold-seconds", "2", *files, env={"CELERY_BROKER_URL": nowhere}
    )
    try:
        answer = httpx.post(url + COMPLETIONS, headers=AUTH, timeout=30)
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "10"
        assert "scaled to zero and starting" in answer.json()["error"]["message"]
        assert proc.poll() is None
        assert activations(url, "timed_out") == 1 and held(url) == 0
    finally:
        stop_process_group(proc)
