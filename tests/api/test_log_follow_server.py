"""Following instance logs against the portal as it is deployed (gunicorn running the ASGI app,
:mod:`tests.web_server`): open follows wait without holding what other requests need, a line
written to the log reaches a waiting follower at once, and the caps answer 429.

The reproduction (issue 37): 20 follows of a log with nothing new held all of gunicorn's
threads, and ``/livez`` then took 19 s for everyone."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from portal.deployments.models import Instance
from portal.deployments.runtime.launchers import version_set
from tests.conftest import stop_process_group
from tests.deployments.rollout_helpers import wait_for
from tests.deployments.test_instance_logs import append, run_dir
from tests.web_server import start_portal

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FOLLOWERS = 100
#: What the issue asks of /livez and an API GET with FOLLOWERS follows open.
QUICK_SECONDS = 0.1


@pytest.fixture
def log_dir(tmp_path, deployment):
    """An Instance row and the run directory the local launcher reads its log from, as the
    launcher leaves them for a live instance."""
    Instance.objects.create(
        deployment=deployment, version=deployment.target_version, name="web-1", launcher="local"
    )
    key = version_set(deployment, deployment.target_version).key
    directory = run_dir(tmp_path / "instances", key, "web-1")
    append(directory, "started\n")
    return directory


def serve(tmp_path, **env: str):
    return start_portal(
        tmp_path / "var",
        env={
            "INSTANCE_LAUNCHER": "local",
            "INSTANCE_RUN_ROOT": str(tmp_path / "instances"),
            **env,
        },
    )


def log_url(url: str) -> str:
    """The log's API address (read before any event loop runs: it asks the database)."""
    return f"{url}/api/v1/instances/{Instance.objects.get().pk}/logs/"


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def cursor(logs: str, token: str) -> str:
    answer = httpx.get(logs, headers=headers(token), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["next"]


async def open_follows(client, logs, token, since, count):
    """``count`` follow requests, started; they answer when the log has new lines."""
    return [
        asyncio.ensure_future(
            client.get(logs, params={"follow": "1", "since": since}, headers=headers(token))
        )
        for _ in range(count)
    ]


def test_a_hundred_open_follows_leave_livez_and_the_api_quick(
    tmp_path, log_dir, member_token, clean_redis
):
    server, url = serve(tmp_path, LOG_FOLLOWS_PER_USER=str(FOLLOWERS))
    try:
        logs = log_url(url)
        asyncio.run(
            _a_hundred_follows(url, logs, member_token, cursor(logs, member_token), log_dir)
        )
    finally:
        stop_process_group(server)


async def _a_hundred_follows(url, logs, token, since, log_dir):
    limits = httpx.Limits(max_connections=FOLLOWERS + 10)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        follows = await open_follows(client, logs, token, since, FOLLOWERS)
        # Every follow has reached a worker and is waiting: the portal's /metrics counts the
        # log view's requests when the view returns, which under ASGI is before the wait.
        await asyncio.to_thread(
            wait_for,
            lambda: answered_log_views(url) >= FOLLOWERS + 1,
            60,
            f"{FOLLOWERS} follows to be waiting",
        )
        done = [
            f.result() if not f.exception() else repr(f.exception()) for f in follows if f.done()
        ]
        assert not done, [
            (getattr(d, "status_code", d), getattr(d, "text", "")[:300]) for d in done[:3]
        ]

        livez, api = [], []
        for _ in range(10):
            livez.append(await timed(client.get(url + "/livez")))
            api.append(await timed(client.get(url + "/api/v1/teams/", headers=headers(token))))
        assert statistics.median(livez) < QUICK_SECONDS, livez
        assert statistics.median(api) < QUICK_SECONDS, api
        assert not any(f.done() for f in follows)

        append(log_dir, "a new line\n")
        answers = await asyncio.wait_for(asyncio.gather(*follows), 60)
    assert {a.status_code for a in answers} == {200}
    assert all(a.json()["lines"] == ["a new line"] for a in answers)


async def timed(request) -> float:
    started = time.perf_counter()
    answer = await request
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - started


def answered_log_views(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "portal_http_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("view") == "instance-logs"
    )


def test_follows_past_a_cap_are_answered_429_and_a_slot_comes_back(
    tmp_path, log_dir, member_token, viewer_token, clean_redis
):
    # One worker: the caps are per process.
    server, url = start_portal(
        tmp_path / "var",
        workers=1,
        env={
            "INSTANCE_LAUNCHER": "local",
            "INSTANCE_RUN_ROOT": str(tmp_path / "instances"),
            "LOG_FOLLOWS_PER_USER": "2",
            "LOG_FOLLOWS_PER_PROCESS": "3",
        },
    )
    try:
        logs = log_url(url)
        since = cursor(logs, member_token)
        asyncio.run(_caps(url, logs, member_token, viewer_token, since, log_dir))
    finally:
        stop_process_group(server)


async def _caps(url, logs, member_token, viewer_token, since, log_dir):
    async with httpx.AsyncClient(timeout=60) as client:
        params = {"follow": "1", "since": since}
        mine = await open_follows(client, logs, member_token, since, 2)
        await asyncio.to_thread(wait_for, lambda: answered_log_views(url) >= 3, 60, "2 follows")
        third = await client.get(logs, params=params, headers=headers(member_token))
        assert third.status_code == 429, third.text
        assert "limit per user" in third.json()["error"]["message"]
        assert int(third.headers["Retry-After"]) > 0

        # Another caller may still follow, up to the process's total.
        theirs = await open_follows(client, logs, viewer_token, since, 1)
        await asyncio.to_thread(wait_for, lambda: answered_log_views(url) >= 5, 60, "3 follows")
        fourth = await client.get(logs, params=params, headers=headers(viewer_token))
        assert fourth.status_code == 429, fourth.text
        assert "its limit" in fourth.json()["error"]["message"]

        # A caller that leaves gives its slot back.
        mine[0].cancel()
        await asyncio.gather(mine[0], return_exceptions=True)

        async def follow_taken() -> bool:
            # A waiting follow's status line is sent when its view returns, before the wait:
            # read the status, not the body, and let the follow go again.
            async with client.stream(
                "GET", logs, params={"follow": "1", "since": since}, headers=headers(member_token)
            ) as answer:
                return answer.status_code != 429

        deadline = time.monotonic() + 30
        while not await follow_taken():
            assert time.monotonic() < deadline, "the left follow's slot never came back"
            await asyncio.sleep(0.2)

        append(log_dir, "done\n")
        answers = await asyncio.wait_for(asyncio.gather(mine[1], *theirs), 60)
    assert [a.status_code for a in answers] == [200, 200]
