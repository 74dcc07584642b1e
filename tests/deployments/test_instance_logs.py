"""Instance logs: the local launcher's bounded reads of a run directory's log, the Kubernetes
launcher's through the official client against the fake API server, the formatter, a failed
instance's summary, and the API (scoping, bad cursors, the bounded long poll)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from portal.deployments.lifecycle import transition_instance
from portal.deployments.models import Instance, InstanceState
from portal.deployments.runtime.launchers import kubernetes as kubernetes_launcher
from portal.deployments.runtime.launchers import version_set
from portal.deployments.runtime.launchers.base import (
    LOG_CHUNK_BYTES,
    LOG_CHUNK_LINES,
    LogCursorError,
    LogUnavailable,
    Shape,
    VersionSet,
)
from portal.deployments.runtime.launchers.local import (
    LOG,
    LocalLauncher,
    _crash_reason,
    process_started,
)
from portal.deployments.runtime.logs import failure_summary, format_line
from tests.deployments.fake_kube_api import FakeKubeApi

STEP_FAILED = json.dumps(
    {
        "ts": 1764940000.5,
        "component": "instance",
        "event": "step",
        "step": "start_engine",
        "status": "failed",
        "duration_s": 1.25,
        "error": "RuntimeError: tritonserver exited with 1",
    }
)
ABORTED = json.dumps(
    {"ts": 1764940000.6, "component": "instance", "event": "start_aborted", "step": "start_engine",
     "exit_code": 1}
)  # fmt: skip


def a_set(deployment: int = 5) -> VersionSet:
    return VersionSet(
        deployment_id=deployment,
        team="demo",
        model="tiny",
        version=1,
        served_model_name="demo--tiny",
        package_path=Path("/nowhere.tar"),
        package_digest="",
        weights_dir=Path("/nowhere"),
        shape=Shape(name="cpu-local"),
    )


def run_dir(root: Path, key: str, name: str, *, alive: bool = True) -> Path:
    """A run directory as the local launcher leaves it, for this test process (alive) or for
    a process that has exited (ended)."""
    directory = root / key / name
    directory.mkdir(parents=True)
    if alive:
        pid = psutil.Process().pid
    else:
        finished = subprocess.Popen([sys.executable, "-c", "pass"])
        finished.wait()
        pid = finished.pid
    record = {"name": name, "created_at": time.time(), "pid": pid,
              "pid_started_since_boot": process_started(psutil.Process()) if alive else 0.0}  # fmt: skip
    (directory / "instance.json").write_text(json.dumps(record))
    (directory / LOG).write_bytes(b"")
    return directory


def append(directory: Path, text: str) -> None:
    with open(directory / LOG, "a") as log:
        log.write(text)


@pytest.fixture
def local(settings, tmp_path):
    settings.INSTANCE_RUN_ROOT = tmp_path / "instances"
    return LocalLauncher()


# --- the local launcher -----------------------------------------------------------------------


def test_local_reads_the_tail_then_follows_by_offset(local):
    directory = run_dir(local.run_root, a_set().key, "i1")
    append(directory, "".join(f"line {i}\n" for i in range(10)))
    first = local.read_log(a_set(), "i1", tail=3)
    assert (first.lines, first.ended) == (["line 7", "line 8", "line 9"], False)
    assert local.read_log(a_set(), "i1", since=first.next).lines == []
    append(directory, "line 10\nhalf of a li")
    second = local.read_log(a_set(), "i1", since=first.next)
    assert second.lines == ["line 10"]  # the line being written waits until it is whole
    append(directory, "ne\n")
    assert local.read_log(a_set(), "i1", since=second.next).lines == ["half of a line"]
    assert local.read_log(a_set(), "i1", since="0", tail=1).lines[0] == "line 0"


def test_local_reads_are_bounded(local):
    directory = run_dir(local.run_root, a_set().key, "big")
    line = "x" * 99 + "\n"
    append(directory, line * 10_000)  # ~1 MB, 10,000 lines
    tail = local.read_log(a_set(), "big", tail=LOG_CHUNK_LINES)
    assert len(tail.lines) == LOG_CHUNK_LINES and tail.next == str(100 * 10_000)
    chunk = local.read_log(a_set(), "big", since="0")
    assert len(chunk.lines) == LOG_CHUNK_LINES and int(chunk.next) == 100 * LOG_CHUNK_LINES
    append(directory, "y" * (LOG_CHUNK_BYTES + 10))  # one line longer than a chunk
    offset, seen = chunk.next, 0
    while True:
        chunk = local.read_log(a_set(), "big", since=offset)
        assert len(chunk.lines) <= LOG_CHUNK_LINES
        assert sum(len(x) + 1 for x in chunk.lines) <= LOG_CHUNK_BYTES + 1
        if chunk.next == offset:
            break
        seen, offset = seen + len(chunk.lines), chunk.next
    assert seen == 8000 + 1  # the cut line is returned rather than stalling the reader


def test_local_ended_only_once_the_log_is_read_to_its_end(local):
    directory = run_dir(local.run_root, a_set().key, "gone", alive=False)
    append(directory, "a\nb\nno newline at the end")
    assert local.read_log(a_set(), "gone", since="0").lines == ["a", "b", "no newline at the end"]
    chunk = local.read_log(a_set(), "gone", since="2")
    assert chunk.ended and chunk.lines == ["b", "no newline at the end"]
    live = run_dir(local.run_root, a_set().key, "live")
    append(live, "a\n")
    assert not local.read_log(a_set(), "live").ended
    missing = local.read_log(a_set(), "never-was")
    assert (missing.lines, missing.ended) == ([], True)


def test_local_refuses_a_cursor_it_did_not_give(local):
    run_dir(local.run_root, a_set().key, "i1")
    with pytest.raises(LogCursorError):
        local.read_log(a_set(), "i1", since="2026-01-01T00:00:00Z")


def test_a_crash_reason_is_one_short_formatted_line(tmp_path):
    (tmp_path / LOG).write_text("plain start\n" + STEP_FAILED + "\n" + ABORTED + "\n")
    reason = _crash_reason(tmp_path)
    assert "{" not in reason and len(reason) < 300
    assert reason == (
        "the process exited without being asked to; last: ERROR instance: start_engine failed "
        "in 1.25 s: RuntimeError: tritonserver exited with 1"
    )
    (tmp_path / LOG).write_text("x" * 500 + "\n")
    assert len(_crash_reason(tmp_path)) < 260


def test_forget_keeps_a_crashed_instances_log_only(local):
    crashed = run_dir(local.run_root, a_set().key, "crashed", alive=False)
    (crashed / "work").mkdir()
    append(crashed, STEP_FAILED + "\n")
    stopped = run_dir(local.run_root, a_set().key, "stopped", alive=False)
    record = json.loads((stopped / "instance.json").read_text())
    (stopped / "instance.json").write_text(json.dumps({**record, "stop_requested_at": 1.0}))
    local.forget(a_set(), ["crashed", "stopped"])
    assert [p.name for p in crashed.iterdir()] == [LOG] and not stopped.exists()
    assert local.observe(a_set()) == []
    chunk = local.read_log(a_set(), "crashed")
    assert chunk.ended and chunk.lines == [STEP_FAILED]


# --- the formatter ----------------------------------------------------------------------------


def test_json_lines_read_as_time_level_logger_message():
    assert format_line(STEP_FAILED) == (
        "2025-12-05 13:06:40.500 ERROR instance: start_engine failed in 1.25 s: "
        "RuntimeError: tritonserver exited with 1"
    )
    ok = {"ts": 1764940000.0, "component": "instance", "event": "step", "step": "unpack_package",
          "status": "ok", "duration_s": 0.2, "files": 3}  # fmt: skip
    assert format_line(json.dumps(ok), with_time=False) == (
        "INFO instance: unpack_package ok in 0.2 s (files=3)"
    )
    logged = {"time": "12:00:01", "level": "warning", "logger": "vllm", "message": "slow"}
    assert format_line(json.dumps(logged)) == "12:00:01 WARNING vllm: slow"


def test_other_lines_are_kept_as_they_are():
    for line in ["INSTANCE READY openai=1 http=2 grpc=3 metrics=4", "{not json", "[1, 2]", ""]:
        assert format_line(line) == line


# --- the Kubernetes launcher against the fake API server --------------------------------------

NS = "llm-serving"


@pytest.fixture
def kube(settings, clean_redis):
    fake = FakeKubeApi()
    settings.KUBERNETES_NAMESPACE = NS
    yield fake, fake.launcher()
    fake.close()


def pod(name: str, phase: str = "Running") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": []}, "status": {"phase": phase}}  # fmt: skip


def test_kubernetes_tail_then_since_through_the_client(kube):
    api, launcher = kube
    api.put("pods", NS, pod("p1"))
    now = time.time()
    for i in range(5):
        api.log(NS, "p1", f"line {i}", at=now - 10 + i)
    api.log(NS, "p1", STEP_FAILED, at=now - 4)  # one JSON line: not parsed by the client
    first = launcher.read_log(a_set(), "p1", tail=3)
    assert (first.lines, first.ended) == (["line 3", "line 4", STEP_FAILED], False)
    assert api.log_queries[-1]["tailLines"] == ["3"]
    assert api.log_queries[-1]["limitBytes"] == [str(LOG_CHUNK_BYTES)]
    assert launcher.read_log(a_set(), "p1", since=first.next).lines == []
    assert int(api.log_queries[-1]["sinceSeconds"][0]) >= 4
    api.log(NS, "p1", "line 6")
    then = launcher.read_log(a_set(), "p1", since=first.next)
    assert then.lines == ["line 6"] and then.next > first.next
    with pytest.raises(LogCursorError):
        launcher.read_log(a_set(), "p1", since="12")


def test_kubernetes_ended_pod_and_gone_pod(kube):
    api, launcher = kube
    api.put("pods", NS, pod("p2", phase="Failed"))
    api.log(NS, "p2", "dying")
    chunk = launcher.read_log(a_set(), "p2")
    assert chunk.lines == ["dying"] and not chunk.ended  # not yet: the reader got lines
    assert launcher.read_log(a_set(), "p2", since=chunk.next).ended
    gone = launcher.read_log(a_set(), "nope")
    assert (gone.lines, gone.ended) == ([], True)


def test_kubernetes_api_server_down_is_log_unavailable(settings, clean_redis):
    """Answered 503 by the API (an ApplicationError), not a 500 with a client traceback."""
    fake = FakeKubeApi()
    settings.KUBERNETES_NAMESPACE = NS
    launcher = fake.launcher()
    fake.close()
    fake.server.server_close()  # nothing listens: connections are refused
    with pytest.raises(LogUnavailable, match="did not give instance p1's log") as raised:
        launcher.read_log(a_set(), "p1")
    assert raised.value.status_code == 503


def test_a_stuck_api_server_is_log_unavailable_too(settings, clean_redis, monkeypatch):
    """It accepts connections and never answers: the read gives up instead of holding a web
    worker for ever."""
    monkeypatch.setattr(kubernetes_launcher, "LOG_REQUEST_TIMEOUT", (0.5, 0.5))
    fake = FakeKubeApi()
    settings.KUBERNETES_NAMESPACE = NS
    launcher = fake.launcher()
    fake.close()  # stops answering; its socket still accepts
    try:
        with pytest.raises(LogUnavailable):
            launcher.read_log(a_set(), "p1")
    finally:
        fake.server.server_close()


# --- a failed instance's summary and the API --------------------------------------------------


@pytest.fixture
def instance_log(settings, tmp_path, deployment):
    """An Instance row of the ``deployment`` fixture and its log file in the local run root."""
    settings.INSTANCE_LAUNCHER = "local"
    settings.INSTANCE_RUN_ROOT = tmp_path / "instances"
    instance = Instance.objects.create(
        deployment=deployment, version=deployment.target_version, name="inst-1", launcher="local"
    )
    key = version_set(deployment, deployment.target_version).key
    directory = run_dir(settings.INSTANCE_RUN_ROOT, key, instance.name)
    append(directory, "booting\n" + STEP_FAILED + "\n")
    return instance, directory


@pytest.mark.django_db
def test_failure_summary_is_the_reason_and_the_formatted_end(instance_log):
    instance, _ = instance_log
    assert failure_summary(instance) is None  # not failed
    transition_instance(instance, InstanceState.STARTING)
    transition_instance(instance, InstanceState.FAILED, message="exited with 1")
    summary = failure_summary(instance)
    assert summary is not None and summary.reason == "exited with 1"
    assert summary.lines == ["booting", format_line(STEP_FAILED)]


def logs_url(instance: Instance, query: str = "") -> str:
    return f"/api/v1/instances/{instance.pk}/logs/{query}"


@pytest.mark.django_db
def test_api_tail_since_and_scoping(api, member_token, outsider, instance_log):
    instance, directory = instance_log
    client = api(member_token)
    body = client.get(logs_url(instance, "?tail=1")).json()
    assert body["lines"] == [format_line(STEP_FAILED)] and body["ended"] is False
    append(directory, "more\n")
    after = client.get(logs_url(instance, f"?since={body['next']}")).json()
    assert after["lines"] == ["more"]
    from tests.conftest import session

    assert session(outsider).get(logs_url(instance)).status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["?since=abc", "?tail=-1", "?tail=100000", "?follow=maybe"])
def test_api_bad_query_is_400(api, member_token, instance_log, query):
    instance, _ = instance_log
    response = api(member_token).get(logs_url(instance, query))
    assert response.status_code == 400, response.content


@pytest.mark.django_db(transaction=True)
def test_api_follow_answers_when_a_line_is_appended(api, member_token, instance_log):
    instance, directory = instance_log
    client = api(member_token)
    start = client.get(logs_url(instance)).json()["next"]
    timer = threading.Timer(1.0, append, (directory, "appended later\n"))
    timer.start()
    began = time.monotonic()
    body = client.get(logs_url(instance, f"?since={start}&follow=1")).json()
    waited = time.monotonic() - began
    timer.join()
    assert body["lines"] == ["appended later"]
    assert 0.9 < waited < 5
