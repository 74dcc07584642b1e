"""Autoscaling benchmark: how long a load step takes to get an extra instance serving, and how long
a request held for a deployment scaled to zero waits, each cut into its parts.

Run from the repository root (Redis on 127.0.0.1:6379; the database is a SQLite file, as in
``./dev run``, unless ``BENCH_DATABASE_URL`` names another)::

    python bench/autoscaling.py     # about 2 minutes

The whole platform on loopback, as ``bench/rollout.py`` runs it: a Celery worker with the
controller, the local gateway, and the random-weights demo model served by real instance
processes, with the policy min 1, max 2, in-flight requests per instance target 1, up window 0,
down window 3 s, scale to zero after 10 s.

- **load step**: ``--clients`` callers start sending completions without pause. Parts: the
  controller's decision (load start → the "Scaled 1 → 2" event), the launch (decision → the
  instance's process started), the process start (→ its first start-up step), each start-up
  step from the instance's log (``start_engine`` is the model load, ``start_frontend`` the
  OpenAI front end), the health check seen, and the table published (→ first request answered
  by the new instance).
- **cold start**: callers stop; once the deployment is asleep, one completion is sent. Parts:
  the gateway's wake reaching the controller (request → the "Waking" event), the launch, the
  process start, the model load, and readiness to the answer.

Requests failed in both phases are counted (the goal is 0). Results go to
``bench/results/autoscaling.json`` and a Markdown summary next to it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine_info  # noqa: E402
from bench.rollout import (  # noqa: E402
    configure,
    demo_versions,
    start_platform,
    stop_platform,
    wait,
)

MODEL = "bench--chat"
POLICY = {
    "min_replicas": 1,
    "max_replicas": 2,
    "scale_metric": "in_flight",
    "scale_target": 1.0,
    "scale_up_window_seconds": 0,
    "scale_down_window_seconds": 3,
    "scale_to_zero_after_seconds": 10,
}


class Callers:
    """Callers sending completions one after another; each answer is kept with the time it
    came back and the instance that served it."""

    def __init__(self, url: str, key: str, clients: int) -> None:
        self.url, self.key, self.clients = url, key, clients
        self.rows: list[tuple[float, int, str]] = []  # (answered at, status, served by)
        self.stop = threading.Event()

    def run(self) -> None:
        import httpx

        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 48, "ignore_eos": True}
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=120, headers=headers) as client:
            while not self.stop.is_set():
                try:
                    answer = client.post(self.url + "/completions", json=body)
                    row = (time.time(), answer.status_code, answer.headers.get("x-served-by", ""))
                except httpx.HTTPError:
                    row = (time.time(), 0, "")
                self.rows.append(row)

    def __enter__(self) -> Callers:
        self.threads = [threading.Thread(target=self.run) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def failed(self) -> int:
        return sum(1 for _, status, _ in self.rows if status != 200)

    def first_served_by(self, name: str) -> float | None:
        return min(
            (at for at, status, by in self.rows if by == name and status == 200), default=None
        )


def startup_steps(run_root: Path, name: str) -> dict[str, Any]:
    """The instance's start-up steps from its log: the first one's time, and each duration."""
    [log] = run_root.glob(f"*/{name}/instance.log")
    steps: dict[str, float] = {}
    first_ts = None
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "step":
            steps[record["step"]] = record["duration_s"]
            if first_ts is None:
                first_ts = record["ts"] - record["duration_s"]
    return {"first_step_at": first_ts, "steps": steps}


def parts_of_a_start(run_root: Path, instance: Any, after: float) -> dict[str, float]:
    """From ``after`` (a decision or a wake) to the instance's readiness, in parts (ms)."""
    launched = instance.created_at.timestamp()
    log = startup_steps(run_root, instance.name)
    steps = log["steps"]
    ready = instance.ready_at.timestamp()
    return {
        "launch_ms": round((launched - after) * 1000),
        "process_start_ms": round((log["first_step_at"] - launched) * 1000),
        # start_engine is the model load; start_frontend the OpenAI front end's process.
        **{f"step_{name}_ms": round(seconds * 1000) for name, seconds in steps.items()},
        "health_check_seen_ms": round((ready - log["first_step_at"] - sum(steps.values())) * 1000),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = configure(tmp)
        os.environ["RECONCILE_IDLE_INTERVAL_SECONDS"] = "1"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        import redis

        redis.Redis.from_url(env["REDIS_URL"]).flushdb()
        result = run(tmp, args.clients)
    result["machine"] = machine_info(("django", "celery", "aiohttp"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "autoscaling.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "autoscaling.md").write_text(markdown(result))
    print(markdown(result))


def run(tmp: Path, clients: int) -> dict[str, Any]:
    import httpx

    from portal.core.actors import Actor
    from portal.deployments.models import Deployment, InstanceType
    from portal.deployments.services import create_deployment
    from portal.deployments.traffic.caller_keys import issue_caller_key

    actor = Actor(label="bench")
    gateway, worker, port = start_platform()
    run_root = tmp / "instances"
    try:
        model, [version] = demo_versions(tmp, 1)
        team = model.team
        instance_type = InstanceType.objects.get(name="cpu-local")
        key = issue_caller_key(team=team, name="bench").plaintext
        deployment = create_deployment(
            model=model,
            strategy="red_black",
            version=version,
            instance_type=instance_type,
            actor=actor,
            replicas=1,
            scaling=POLICY,
        )

        def fresh() -> Deployment:
            return Deployment.objects.get(pk=deployment.pk)

        wait(lambda: fresh().observed_state == "serving", 300, "serving")
        url = f"http://127.0.0.1:{port}/models/bench/chat"
        wait(
            lambda: (
                httpx.get(url + "/models", headers={"Authorization": f"Bearer {key}"}).status_code
                == 200
            ),
            30,
            "the gateway to take the key",
        )
        first = fresh().instances.get(state="ready")

        # --- load step ------------------------------------------------------------------------
        with Callers(url, key, clients) as callers:
            step_at = time.time()
            wait(lambda: fresh().instances.filter(state="ready").count() == 2, 300, "2 ready")
            extra = fresh().instances.exclude(pk=first.pk).get(state="ready")
            wait(lambda: callers.first_served_by(extra.name) is not None, 60, "served by it")
            decision = fresh().events.filter(kind="scaling").order_by("created_at").first()
            assert decision is not None
            decided_at = decision.created_at.timestamp()
            step_parts = {
                "decision_ms": round((decided_at - step_at) * 1000),
                **parts_of_a_start(run_root, extra, decided_at),
                "ready_to_first_served_ms": round(
                    (callers.first_served_by(extra.name) - extra.ready_at.timestamp()) * 1000
                ),
            }
            step_total = round((callers.first_served_by(extra.name) - step_at) * 1000)
        load = {
            "total_ms": step_total,
            "parts": step_parts,
            "decision": decision.message,
            "requests": len(callers.rows),
            "failed": callers.failed(),
        }

        # --- cold start -----------------------------------------------------------------------
        wait(lambda: fresh().scaling.asleep, 120, "scaled to zero")
        wait(
            lambda: not fresh().instances.exclude(state__in=["stopped", "failed"]).exists(),
            60,
            "no instance",
        )
        asked_at = time.time()
        answer = httpx.post(
            url + "/completions",
            json={"model": MODEL, "prompt": "Hello", "max_tokens": 3},
            headers={"Authorization": f"Bearer {key}"},
            timeout=180,
        )
        answered_at = time.time()
        woken = fresh().events.filter(kind="scaling", data__woken=True).latest("created_at")
        woken_at = woken.created_at.timestamp()
        cold = fresh().instances.get(state="ready")
        cold_parts = {
            "wake_reaches_controller_ms": round((woken_at - asked_at) * 1000),
            **parts_of_a_start(run_root, cold, woken_at),
            "ready_to_answer_ms": round((answered_at - cold.ready_at.timestamp()) * 1000),
        }
        wait(lambda: fresh().scaling.cold_start_seconds is not None, 30, "cold start recorded")
        cold_start = {
            "status": answer.status_code,
            "held_ms": round((answered_at - asked_at) * 1000),
            "parts": cold_parts,
            "recorded_cold_start_s": fresh().scaling.cold_start_seconds,
        }
        return {"policy": POLICY, "clients": clients, "load_step": load, "cold_start": cold_start}
    finally:
        stop_platform(gateway, worker, run_root)


def markdown(result: dict[str, Any]) -> str:
    load, cold = result["load_step"], result["cold_start"]
    lines = [
        f"Autoscaling on the demo model, policy {result['policy']}, {result['clients']} callers.",
        "",
        f"**Load step → extra instance serving: {load['total_ms']} ms**, "
        f"{load['requests']} requests, {load['failed']} failed. Decision: {load['decision']}",
        "",
        "| part | ms |",
        "|---|---|",
        *(f"| {name} | {ms} |" for name, ms in load["parts"].items()),
        "",
        f"**Cold start of a held request: {cold['held_ms']} ms** (status {cold['status']}; "
        f"the controller recorded {cold['recorded_cold_start_s']} s from wake to ready).",
        "",
        "| part | ms |",
        "|---|---|",
        *(f"| {name} | {ms} |" for name, ms in cold["parts"].items()),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
