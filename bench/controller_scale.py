"""Controller scale benchmark: what one pass over every deployment costs as their number grows.

Run from the repository root (Redis on 127.0.0.1:6379; the database is a SQLite file, as in
``./dev run``, unless ``BENCH_DATABASE_URL`` names another)::

    python bench/controller_scale.py --quick       # 10 and 100 deployments: about a minute
    python bench/controller_scale.py               # the recorded run: 10, 100 and 1,000

No instance process runs: instances are entries of the in-memory launcher the controller tests
use (``tests/deployments/memory_launcher.py``), so what is measured is the controller itself
(its database queries, its Redis calls, the routing table) and nothing it waits on. For each
``N``, ``N`` models each get one Red-Black deployment of 2 replicas, driven by the controller
itself until every one serves (the instances are made ready between passes). Then:

- **serving pass**: ``--passes`` passes of ``controller.reconcile`` over every deployment in
  turn, as one worker does when each is due (every ``RECONCILE_IDLE_INTERVAL_SECONDS`` for a
  serving deployment, ``RECONCILE_INTERVAL_SECONDS`` during a rollout): the pass time, the
  p50/p99 of one reconcile, and the SQL queries per reconcile;
- **route change**: for ``--changes`` deployments, one instance fails its health check and
  recovers, each reconciled once: these reconciles change the routing table and publish it.

Results go to ``bench/results/controller_scale.json`` and a Markdown summary next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine_info  # noqa: E402

LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
REPLICAS = 2


def configure(tmp: Path) -> dict[str, str]:
    env = {
        "SECRET_KEY": "bench-only",
        "DATABASE_URL": os.environ.get("BENCH_DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}"),
        "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
        "PORTAL_VAR_DIR": str(tmp / "var"),
        "MODEL_CACHE_ROOT": str(tmp / "cache"),
        "ARTIFACT_FILE_ROOTS": str(tmp / "artifacts"),
        "INSTANCE_LAUNCHER": LAUNCHER,
        "RECONCILE_INTERVAL_SECONDS": "0.25",
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    return env


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class QueryCounter:
    """Counts the SQL statements run on the default connection while installed."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def build(n: int, start: int) -> list[int]:
    """``n`` models with one ready version and one Red-Black deployment each (pending)."""
    from portal.accounts.models import Team
    from portal.core.actors import Actor
    from portal.deployments.models import InstanceType
    from portal.deployments.services import create_deployment
    from portal.registry.lifecycle import transition_version
    from portal.registry.services import create_model, register_version

    actor = Actor(label="bench")
    team, _ = Team.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    instance_type, _ = InstanceType.objects.get_or_create(name="cpu-local")
    ids = []
    for i in range(start, start + n):
        model = create_model(team=team, slug=f"m{i}", task="chat")
        version = register_version(
            model=model,
            artifact_uri=f"file://{os.environ['ARTIFACT_FILE_ROOTS']}/m{i}",
            engine_args={"dtype": "auto"},
        )
        for state in ("materializing", "materialized", "packaging", "ready"):
            transition_version(version, state)
        deployment = create_deployment(
            model=model,
            strategy="red_black",
            version=version,
            instance_type=instance_type,
            actor=actor,
            replicas=REPLICAS,
            bake_seconds=0,
        )
        ids.append(deployment.pk)
    return ids


def bring_up(ids: list[int]) -> dict[str, Any]:
    """Reconcile every deployment not yet serving, pass after pass, with the instances made
    ready in between, until all serve."""
    from portal.deployments.models import Deployment
    from portal.deployments.rollout import controller
    from portal.deployments.runtime.launchers.base import Health
    from tests.deployments.memory_launcher import MemoryLauncher

    started = time.perf_counter()
    passes = 0
    waiting = set(ids) - set(
        Deployment.objects.filter(observed_state="serving").values_list("pk", flat=True)
    )
    while waiting:
        passes += 1
        if passes > 20:
            raise SystemExit(f"{len(waiting)} deployment(s) still not serving after 20 passes")
        for pk in sorted(waiting):
            controller.reconcile(pk)
        MemoryLauncher.set_health(1, Health.READY)
        serving = Deployment.objects.filter(pk__in=waiting, observed_state="serving")
        waiting -= set(serving.values_list("pk", flat=True))
    return {"passes": passes, "seconds": round(time.perf_counter() - started, 2)}


def timed_reconciles(ids: list[int]) -> tuple[list[float], list[int]]:
    from django.db import connection

    from portal.deployments.rollout import controller

    seconds, queries = [], []
    for pk in ids:
        counter = QueryCounter()
        with connection.execute_wrapper(counter):
            began = time.perf_counter()
            controller.reconcile(pk)
            seconds.append(time.perf_counter() - began)
        queries.append(counter.count)
    return seconds, queries


def summary(seconds: list[float], queries: list[int]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "reconciles": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
        "queries_mean": round(statistics.mean(queries), 2),
        "queries_max": max(queries),
    }


def measure(n: int, ids: list[int], passes: int, changes: int) -> dict[str, Any]:
    from portal.deployments.models import Deployment
    from portal.deployments.runtime.launchers.base import Health
    from tests.deployments.memory_launcher import MemoryLauncher

    assert Deployment.objects.filter(observed_state="serving").count() == n
    pass_seconds, all_seconds, all_queries = [], [], []
    for _ in range(passes):
        seconds, queries = timed_reconciles(ids)
        pass_seconds.append(sum(seconds))
        all_seconds += seconds
        all_queries += queries
    result: dict[str, Any] = {
        "deployments": n,
        "instances": n * REPLICAS,
        "pass_seconds": [round(s, 3) for s in pass_seconds],
        "serving": summary(all_seconds, all_queries),
    }
    # A routing change: one instance fails its health check, then recovers.
    sample = ids[:: max(1, len(ids) // changes)][:changes]
    change_seconds, change_queries = [], []
    for pk in sample:
        [name] = [
            name
            for name, entry in MemoryLauncher.table.items()
            if entry[0].endswith(f"-d{pk}") and entry[2] == Health.READY
        ][:1]
        for health in (Health.UNHEALTHY, Health.READY):
            MemoryLauncher.table[name][2] = health
            seconds, queries = timed_reconciles([pk])
            change_seconds += seconds
            change_queries += queries
    result["route_change"] = summary(change_seconds, change_queries)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 and 100 deployments only")
    parser.add_argument("--sizes", type=int, nargs="*", help="deployment counts (ascending)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([10, 100] if args.quick else [10, 100, 1000])
    with tempfile.TemporaryDirectory() as tmp_name:
        env = configure(Path(tmp_name))
        import django

        django.setup()
        import redis
        from django.conf import settings
        from django.core.management import call_command

        from tests.deployments.memory_launcher import MemoryLauncher

        call_command("migrate", verbosity=0)
        client = redis.Redis.from_url(env["REDIS_URL"])
        client.flushdb()
        MemoryLauncher.reset()
        runs: list[dict[str, Any]] = []
        ids: list[int] = []
        try:
            for n in sizes:
                ids += build(n - len(ids), len(ids))
                setup = bring_up(ids)
                run = measure(n, ids, args.passes, args.changes)
                run["bring_up"] = setup
                runs.append(run)
                print(json.dumps(run), flush=True)
        finally:
            client.flushdb()
        intervals = {
            "reconcile_interval_seconds": settings.RECONCILE_INTERVAL_SECONDS,
            "idle_interval_seconds": settings.RECONCILE_IDLE_INTERVAL_SECONDS,
        }
    result = {
        "database": env["DATABASE_URL"].split(":", 1)[0],
        "replicas": REPLICAS,
        **intervals,
        "runs": runs,
        "machine": machine_info(("django", "redis")),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "controller_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "controller_scale.md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Controller passes over N serving Red-Black deployments of {result['replicas']} "
        f"replicas each, in-memory launcher, {result['database']} database, one worker.",
        "",
        "| N | pass s (median) | reconcile p50 ms | p99 ms | queries/reconcile (mean, max) "
        "| route change p50 ms | p99 ms | queries (mean, max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        s, c = run["serving"], run["route_change"]
        lines.append(
            f"| {run['deployments']} | {statistics.median(run['pass_seconds']):.3f} | "
            f"{s['p50_ms']} | {s['p99_ms']} | {s['queries_mean']}, {s['queries_max']} | "
            f"{c['p50_ms']} | {c['p99_ms']} | {c['queries_mean']}, {c['queries_max']} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
