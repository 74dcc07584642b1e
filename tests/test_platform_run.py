"""The README's run and demo commands, as a new user runs them: the whole platform comes up and
is healthy, the demo models are registered and rolled out, the LLM answers the official OpenAI
client and the embedding model tritonclient, and the pages are photographed; ``--check`` then stops everything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis

from tests.conftest import stop_process_group
from tests.isolation import spare_redis_url
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
REDIS_DB_URL = spare_redis_url()  # the platform under test must not share the tests' database

# It runs a whole platform: one at a time with the rollout tests (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("platform")]


def test_dev_demo_brings_up_the_platform_and_calls_the_demo_model(tmp_path):
    redis.Redis.from_url(REDIS_DB_URL).flushdb()
    port, gateway_port = free_port(), free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {"DATABASE_URL", "SECRET_KEY", "DEBUG", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"}
    }
    env.update(
        PORTAL_VAR_DIR=str(tmp_path / "var"),
        PORTAL_PORT=str(port),
        GATEWAY_PORT=str(gateway_port),
        GATEWAY_METRICS_PORT=str(free_port()),
        REDIS_URL=REDIS_DB_URL,
        VENV=sys.prefix,
    )
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(
        ["bash", "dev", "demo", "--check"], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        body = wait_until_healthy(
            f"http://127.0.0.1:{port}/healthz", proc, tmp_path / "run.log", timeout=120
        )
        assert body["checks"]["database"]["detail"] == "sqlite"  # the embedded default
        token = (tmp_path / "var" / "demo-token").read_text().strip()
        teams = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/teams/", headers={"Authorization": f"Bearer {token}"}
        ).json()
        assert [team["slug"] for team in teams["results"]] == ["demo"]
        # The demo model is registered, copied, packaged and rolled out by the platform itself.
        deployment = wait_for_deployment(port, token, proc, tmp_path / "run.log", timeout=240)
        assert deployment["endpoint"] == f"http://127.0.0.1:{gateway_port}/models/demo/tiny"
        # The demo caller key ./dev run issued; without one the gateway says 401.
        caller_key = (tmp_path / "var" / "demo-caller-key").read_text().strip()
        anonymous = openai.OpenAI(base_url=deployment["endpoint"], api_key="no-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        client = openai.OpenAI(base_url=deployment["endpoint"], api_key=caller_key)
        reply = client.chat.completions.create(
            model="demo--tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        # demo_check passes, and --check then stops the whole platform by itself.
        returncode = proc.wait(timeout=180)
    finally:
        stop_process_group(proc, signal.SIGINT, grace=30)  # honcho stops its processes on SIGINT
        log.close()
        redis.Redis.from_url(REDIS_DB_URL).flushdb()
    output = (tmp_path / "run.log").read_text()
    assert returncode == 0, output[-4000:]
    assert "Demo ready." in output and "Demo check passed." in output
    assert "JSON-schema answer: {" in output
    # The embedding demo, on the Python backend, answered tritonclient through the gateway.
    assert "==> the embedding demo serves at" in output and "embeddings: 384 dimensions" in output
    assert "Stopped 2 local instance(s)." in output  # nothing outlives ./dev demo
    if Path("/usr/bin/chromium").exists():
        shots = sorted(p.name for p in (tmp_path / "var" / "demo-screenshots").glob("*.png"))
        assert shots == [
            "dashboard.png",
            "deployment.png",
            "embedding-deployment.png",
            "model.png",
            "version.png",
        ]


def wait_for_deployment(port: int, token: str, proc, log: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"./dev run exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        answer = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/deployments/",
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        tiny = [d for d in answer["results"] if d["endpoint"].endswith("/models/demo/tiny")]
        if tiny:
            last = tiny[0]
            if last["observed_state"] == "serving" and last["instances"]:
                return last
        time.sleep(1)
    pytest.fail(f"the demo deployment never served; last: {last}\n{log.read_text()[-4000:]}")


def wait_for_line(text: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        if proc.poll() is not None:
            pytest.fail(f"./dev run exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        time.sleep(1)
    pytest.fail(f"{text!r} never appeared:\n{log.read_text()[-4000:]}")


def wait_until_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"./dev run exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            response = httpx.get(url, timeout=5)
            last = response.json()
            if response.status_code == 200:
                return last
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(1)
    pytest.fail(f"/healthz never turned green; last answer: {last}\n{log.read_text()[-4000:]}")
