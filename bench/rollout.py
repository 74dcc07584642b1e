"""Rollout benchmark: callers through the gateway in steady state and during a Red-Black rollout,
and how long the controller takes to act once a step's condition holds.

Run from the repository root (Redis on 127.0.0.1:6379; the database is a SQLite file, as in
``./dev run``, unless ``BENCH_DATABASE_URL`` names another)::

    python bench/rollout.py --quick    # 1 replica, short bakes: about 2 minutes
    python bench/rollout.py            # the recorded run: 2 replicas, stages 25/50/100

It runs the whole platform on loopback: a Celery worker with the rollout controller, the local
gateway, and the random-weights demo model registered twice (v1, v2) and served by real instance
processes. ``--clients`` callers send completions through the gateway without pause:

- **steady**: v1 serving on every replica, for ``--seconds``;
- **rollout**: v1 → v2 Red-Black, from the update until v2 serves 100% and v1 is drained.

For each phase: requests served and failed, requests/s, p50/p99 latency. Controller overhead
per step is the time from the moment a step's condition became true to the event of the next
step: a bake's end (bake start + bake seconds, both recorded) to the next stage's traffic shift.
Results go to ``bench/results/rollout.json`` and a Markdown summary next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import free_port, machine_info  # noqa: E402


def configure(tmp: Path) -> dict[str, str]:
    env = {
        "SECRET_KEY": "bench-only",
        # The embedded default (a SQLite file), unless BENCH_DATABASE_URL names another.
        "DATABASE_URL": os.environ.get("BENCH_DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}"),
        "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
        "PORTAL_VAR_DIR": str(tmp / "var"),
        "MODEL_CACHE_ROOT": str(tmp / "cache"),
        "ARTIFACT_FILE_ROOTS": str(tmp / "artifacts"),
        "INSTANCE_RUN_ROOT": str(tmp / "instances"),
        "INSTANCE_DRAIN_SECONDS": "10",
        "RECONCILE_INTERVAL_SECONDS": "0.25",
    }
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    return env


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Callers:
    def __init__(self, url: str, model: str, clients: int, key: str) -> None:
        self.url, self.model, self.clients, self.key = url, model, clients, key
        self.rows: list[tuple[float, float, int]] = []  # (start, seconds, status)
        self.stop = threading.Event()

    def run(self) -> None:
        import httpx

        body = {"model": self.model, "prompt": "Hello", "max_tokens": 3}
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.key}"}) as client:
            while not self.stop.is_set():
                start = time.time()
                try:
                    status = client.post(self.url + "/completions", json=body).status_code
                except httpx.HTTPError:
                    status = 0
                self.rows.append((start, time.time() - start, status))

    def __enter__(self) -> Callers:
        self.threads = [threading.Thread(target=self.run) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def summary(self, since: float, until: float) -> dict[str, Any]:
        rows = [r for r in self.rows if since <= r[0] < until]
        served = [r[1] * 1000 for r in rows if r[2] == 200]
        return {
            "seconds": round(until - since, 1),
            "served": len(served),
            "failed": len(rows) - len(served),
            "requests_per_second": round(len(served) / (until - since), 1),
            "p50_ms": round(percentile(served, 0.5), 1),
            "p99_ms": round(percentile(served, 0.99), 1),
        }


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0, help="steady-state phase length")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    replicas, stages, bake = (1, [50, 100], 3) if args.quick else (2, [25, 50, 100], 8)
    seconds = args.seconds or (10 if args.quick else 30)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = configure(tmp)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        import redis

        redis.Redis.from_url(env["REDIS_URL"]).flushdb()
        result = run(tmp, replicas, stages, bake, seconds, args.clients)
    result["machine"] = machine_info(("django", "celery", "uvicorn", "aiohttp"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rollout.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "rollout.md").write_text(markdown(result))
    print(markdown(result))


def run(
    tmp: Path, replicas: int, stages: list[int], bake: int, seconds: float, clients: int
) -> dict[str, Any]:
    from portal.core.actors import Actor
    from portal.deployments.models import Deployment, InstanceType
    from portal.deployments.services import create_deployment, update_deployment
    from portal.deployments.traffic.caller_keys import issue_caller_key

    actor = Actor(label="bench")
    gateway, worker, port = start_platform()
    try:
        model, versions = demo_versions(tmp, 2)
        instance_type = InstanceType.objects.get(name="cpu-local")
        key = issue_caller_key(team=model.team, name="bench").plaintext
        deployment = create_deployment(
            model=model,
            strategy="red_black",
            version=versions[0],
            instance_type=instance_type,
            actor=actor,
            replicas=replicas,
            stages=stages,
            bake_seconds=bake,
        )

        def serving(number: int) -> bool:
            deployment.refresh_from_db()
            return (
                deployment.observed_state == "serving"
                and deployment.target_version.number == number
                and not deployment.instances.exclude(state__in=["stopped", "failed"])
                .exclude(version__number=number)
                .exists()
            )

        wait(lambda: serving(1), 300, "v1 to serve")
        url = f"http://127.0.0.1:{port}/models/bench/chat/v1"
        with Callers(url, "bench--chat", clients, key) as callers:
            time.sleep(3)  # warm up
            steady_from = time.time()
            time.sleep(seconds)
            steady_to = rollout_from = time.time()
            update_deployment(deployment, actor=actor, version=versions[1])
            wait(lambda: serving(2), 600, "v2 to serve")
            rollout_to = time.time()
        overhead = controller_overhead(Deployment.objects.get(pk=deployment.pk), bake)
        return {
            "replicas": replicas,
            "stages": stages,
            "bake_seconds": bake,
            "clients": clients,
            "steady": callers.summary(steady_from, steady_to),
            "rollout": callers.summary(rollout_from, rollout_to),
            "controller_overhead_ms": overhead,
        }
    finally:
        stop_platform(gateway, worker, tmp / "instances")


def start_platform() -> tuple[subprocess.Popen, subprocess.Popen, int]:
    """The local gateway and a Celery worker running the controller, as ``./dev run`` starts
    them; returns both processes and the gateway's port."""
    port = free_port()
    gateway = subprocess.Popen(
        [
            *(sys.executable, "-m", "serving.gateway", "--port", str(port)),
            *("--redis-url", os.environ["REDIS_URL"]),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "portal", "worker", "--pool", "solo"),
            *("--loglevel", "WARNING", "--hostname", f"bench-{os.getpid()}@%h"),
        ],
        cwd=ROOT,
    )
    assert gateway.stdout is not None and gateway.stdout.readline().startswith("GATEWAY READY")
    return gateway, worker, port


def stop_platform(gateway: subprocess.Popen, worker: subprocess.Popen, run_root: Path) -> None:
    worker.terminate()
    worker.wait()
    gateway.terminate()
    gateway.wait()
    kill_instances(run_root)


def demo_versions(tmp: Path, count: int) -> tuple[Any, list[Any]]:
    """Team ``bench``'s model ``chat`` with ``count`` versions of the random-weights demo model,
    each ready to deploy (the cpu-local instance type exists)."""
    from portal.accounts.models import Team
    from portal.deployments.models import InstanceType
    from portal.registry.models import PlatformRelease, VersionState
    from portal.registry.services import create_model, register_version
    from serving.demo_model import make_demo_model

    team, _ = Team.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    PlatformRelease.objects.filter(is_default=True).exists() or call_bootstrap()
    InstanceType.objects.get_or_create(name="cpu-local")
    source = tmp / "artifacts" / "chat"
    make_demo_model(source)
    model = create_model(team=team, slug="chat", task="chat")
    versions = [
        register_version(model=model, artifact_uri=f"file://{source}") for _ in range(count)
    ]
    for version in versions:
        wait(
            lambda v=version: v.refresh_from_db() or v.state == VersionState.READY,
            180,
            "versions to be ready",
        )
    return model, versions


def call_bootstrap() -> None:
    from django.core.management import call_command

    call_command("bootstrap_demo", verbosity=0)


def controller_overhead(deployment: Any, bake: int) -> dict[str, Any]:
    """From each bake's end (recorded exactly: its start + bake seconds) to the controller's
    event that acts on it; the controller looks every ``RECONCILE_INTERVAL_SECONDS``."""
    gaps = [
        (e.created_at.timestamp() - e.data["bake_ended_at"]) * 1000
        for e in deployment.events.order_by("created_at")
        if "bake_ended_at" in e.data
    ]
    return {
        "per_step_ms": [round(g, 1) for g in gaps],
        "max_ms": round(max(gaps), 1) if gaps else None,
        "definition": "a stage's bake end (start + bake_seconds) to the event recording it",
    }


def kill_instances(run_root: Path) -> None:
    import psutil

    for record in run_root.glob("*/*/instance.json"):
        try:
            pid = json.loads(record.read_text())["pid"]
            process = psutil.Process(pid)
            for child in process.children(recursive=True):
                child.kill()
            process.kill()
        except (psutil.Error, KeyError, ValueError, TypeError):
            pass
    shutil.rmtree(run_root, ignore_errors=True)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Red-Black rollout, {result['replicas']} replica(s), stages {result['stages']}, "
        f"bake {result['bake_seconds']} s, {result['clients']} callers without pause.",
        "",
        "| phase | seconds | served | failed | req/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase in ("steady", "rollout"):
        r = result[phase]
        lines.append(
            f"| {phase} | {r['seconds']} | {r['served']} | {r['failed']} | "
            f"{r['requests_per_second']} | {r['p50_ms']} | {r['p99_ms']} |"
        )
    overhead = result["controller_overhead_ms"]
    lines += ["", f"Controller overhead per step (ms): {overhead['per_step_ms']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
