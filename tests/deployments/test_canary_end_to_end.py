"""Canary analysis end to end: real serving processes behind the real gateway, the controller in
a real Celery worker, callers under continuous load through the gateway, and the judgement made
from the instances' own front ends' observations (``GET /observations``).

A v2 equal to v1 (the same weights) is promoted; a v2 that is slower (a larger random model:
more compute per decode step on the same CPU) is rolled back by the latency verdict. Neither
fails a caller's request. The judge's error rates themselves are measured by
``bench/canary_judge.py``; here the test policy's bound is wide (50%) so that two equal
processes on a busy machine are never told apart by chance, and the slow version is far beyond
it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from django.conf import settings

from portal.deployments import services
from portal.deployments.models import Deployment, StageAnalysis
from portal.registry.services import register_version
from serving.demo_model import make_demo_model
from tests.deployments.conftest import USER
from tests.deployments.rollout_helpers import Load, explain, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVED_NAME = "search--chat"
#: Latency judged (critical, 50% bound on the median), errors judged; tokens reported only.
#: The load sends whole (not streamed) completions: no time to first token to judge. With two
#: scored metrics one marginal scores 87.5, so the pass score is 85: a v2 process started
#: minutes after v1 was measured 21% slower at the median with p = 0.002 on this busy machine
#: (significant, within the bound: marginal), which must not hold an equal version.
MIN_SAMPLES = 100
POLICY = {
    "metrics": [
        {"name": "latency_s", "min_samples": MIN_SAMPLES, "max_change": 0.5, "critical": True},
        {"name": "error_rate", "min_samples": MIN_SAMPLES},
        {"name": "completion_tokens", "min_samples": MIN_SAMPLES, "report_only": True},
    ],
    "pass_score": 85,
    "marginal_score": 50,
}


def state(deployment: Deployment) -> Deployment:
    deployment.refresh_from_db()
    return deployment


def settled_on(deployment: Deployment, version: int, timeout: float = 300) -> Deployment:
    def done():
        d = state(deployment)
        assert d.observed_state not in ("failed", "aborted"), d.status_message
        return d.observed_state == "serving" and d.target_version.number == version and d

    return wait_for(
        done,
        timeout,
        f"v{version} serving",
        explain=lambda: explain(deployment, settings.INSTANCE_RUN_ROOT),
    )


def roll_out(world, model, v1, v2) -> tuple[Deployment, Load]:
    deployment = world.deploy(
        model,
        v1,
        replicas=1,
        stages=[50, 100],
        bake_seconds=15,
        canary_analysis=True,
        canary_policy=POLICY,
    )
    settled_on(deployment, 1)
    load = Load(world.endpoint(model), SERVED_NAME, clients=3, max_tokens=8, key=world.caller_key)
    return deployment, load


class KServeCallers:
    """A KServe v2 caller beside the OpenAI load: ``generate`` through the gateway, which
    observes these (the front ends do not see them)."""

    def __init__(self, url: str, key: str) -> None:
        self.url = f"{url}/v2/models/{SERVED_NAME}/generate"
        self.key = key
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"text_input": "Hello", "max_tokens": 2}
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.key}"}) as http:
            while not self._stop.is_set():
                try:
                    self.statuses.append(http.post(self.url, json=body).status_code)
                except httpx.HTTPError:
                    self.statuses.append(0)
                self._stop.wait(0.05)

    def __enter__(self) -> KServeCallers:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_an_equal_new_version_is_promoted(rollout_world):
    world = rollout_world
    model = world.model("chat")
    v1, v2 = world.version(model), world.version(model)
    deployment, load = roll_out(world, model, v1, v2)
    with load, KServeCallers(world.endpoint(model), world.caller_key) as kserve:
        services.update_deployment(deployment, actor=USER, version=v2)
        settled_on(deployment, 2)
    assert load.failures() == []
    assert kserve.statuses and set(kserve.statuses) == {200}
    analyses = list(StageAnalysis.objects.filter(deployment=deployment))
    assert analyses, "no bake was judged"
    final = analyses[-1]
    assert (final.stage, final.decision, final.action) == (1, "promote", "the rollout went on")
    assert [a.decision for a in analyses[:-1]] == ["not_enough_data"] * (len(analyses) - 1)
    for side in ("baseline", "canary"):
        assert final.sample[side]["requests"] >= MIN_SAMPLES, final.sample
        assert final.sample[side]["unread"] == []
        # The KServe requests the gateway observed are judged with the OpenAI ones.
        assert final.sample[side]["kserve_requests"] > 0, final.sample
    latency = next(v for v in final.verdicts if v["name"] == "latency_s")
    assert latency["verdict"] in ("pass", "marginal"), latency


def test_a_slower_new_version_is_rolled_back_by_the_latency_verdict(rollout_world):
    world = rollout_world
    model = world.model("chat")
    v1 = world.version(model)
    # The same tokenizer and interface, 64 times the compute per token (hidden 512, 8 layers).
    bigger = make_demo_model(world.artifact_root / "bigger", hidden_size=512, layers=8)
    v2 = register_version(model=model, artifact_uri=f"file://{bigger}")
    wait_for(lambda: state_of(v2) == "ready", 180, "the larger v2 to be ready")
    deployment, load = roll_out(world, model, v1, v2)
    with load:
        services.update_deployment(deployment, actor=USER, version=v2)
        settled_on(deployment, 1, timeout=400)
        started = time.time()
        wait_for(lambda: load.mix(since=started)["v1"] > 10, 60, "v1 answering alone")
    assert load.failures() == []
    d = state(deployment)
    assert "canary analysis of stage 1: critical metric failed: latency_s fail" in (
        d.status_message
    ), d.status_message
    final = StageAnalysis.objects.filter(deployment=deployment).last()
    assert (final.decision, final.action) == ("rollback", "rolled back to v1")
    latency = next(v for v in final.verdicts if v["name"] == "latency_s")
    assert latency["ratio"] > 1.5 and latency["p_value"] < 0.01, latency


def state_of(version) -> str:
    version.refresh_from_db()
    assert version.state != "failed", version.failure_reason
    return version.state
