"""What the portal's live pages and the metrics scrape cost.

Run from the repository root (Redis on 127.0.0.1:6379; the database is a SQLite file, as in
``./dev run``, unless ``BENCH_DATABASE_URL`` names another)::

    python bench/portal_pages.py            # about a minute

Every open deployment page polls its live fragment every 2 s and its charts every 15 s, so
their render time is what one web worker spends per open page. Measured in-process with
Django's test client (no network), on a deployment the size of a busy rollout: 50 timeline
events, 8 instances, and an hour of points (240) for each of 3 deployments of one model:

- the live fragment rendered in full, and answered 204 (nothing changed since the last poll);
- the deployment's charts (240 points) and the model's (3 deployments merged, 720 points);
- the dashboard of a team with 50 models.

Then one scrape pass (``portal.metrics.services.scrape_live_instances``) over 1, 8 and 32
instances served by loopback HTTP servers that answer a real engine's exposition. Results go to
``bench/results/portal_pages.json`` and a Markdown summary next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine_info  # noqa: E402

POINTS_PER_HOUR = 240  # one every 15 s


def configure(tmp: Path) -> None:
    os.environ.update(
        {
            "SECRET_KEY": "bench-only",
            "DATABASE_URL": os.environ.get(
                "BENCH_DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}"
            ),
            "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
            "PORTAL_VAR_DIR": str(tmp / "var"),
            "LOG_LEVEL": "WARNING",
        }
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


def timed(call, repeats: int) -> dict[str, float]:
    """p50 and p99 in milliseconds of ``call()`` over ``repeats`` runs (after two warm-ups)."""
    call()
    call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 2),
        "runs": repeats,
    }


def build_world() -> dict[str, Any]:
    """A team with 50 models; one model with 3 deployments, the first mid-rollout with 8
    instances and 50 events, each with an hour of metric points."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from portal.accounts.models import Membership, Team
    from portal.deployments.models import (
        Deployment,
        DeploymentEvent,
        Instance,
        InstanceType,
        ObservedState,
    )
    from portal.metrics.models import MetricPoint
    from portal.registry.models import Model, ModelVersion, PlatformRelease

    team = Team.objects.create(slug="bench", name="Bench")
    user = get_user_model().objects.create_user("bench", password="bench")
    Membership.objects.create(team=team, user=user, role="member")
    release = PlatformRelease.objects.get(is_default=True)  # the migrations' default
    instance_type, _ = InstanceType.objects.get_or_create(name="cpu-local")
    models = [
        Model.objects.create(team=team, slug=f"model-{i:02d}", task="chat") for i in range(50)
    ]
    model = models[0]
    versions = [
        ModelVersion.objects.create(
            model=model,
            number=n,
            artifact_uri=f"file:///weights/{n}",
            release=release,
            state="ready",
        )
        for n in (1, 2, 3)
    ]
    now = timezone.now()
    deployments = []
    for index, version in enumerate(versions):
        deployment = Deployment.objects.create(
            model=model,
            strategy="red_black" if index == 0 else "versioned",
            target_version=versions[1] if index == 0 else version,
            previous_version=versions[0] if index == 0 else None,
            instance_type=instance_type,
            replicas=4,
            observed_state=ObservedState.PROGRESSING if index == 0 else ObservedState.SERVING,
            current_stage=2,
            stages=[25, 50, 100],
            traffic={1: 50, 2: 50} if index == 0 else {version.number: 100},
        )
        deployments.append(deployment)
        MetricPoint.objects.bulk_create(
            MetricPoint(
                deployment=deployment,
                at=now - timedelta(seconds=15 * i),
                prompt_tokens_per_s=120.0 + i % 7,
                generation_tokens_per_s=900.0 + i % 11,
                requests_per_s=6.0,
                errors_per_s=0.0,
                ttft_p50=0.05,
                ttft_p99=0.2,
                e2e_p50=0.9,
                e2e_p99=2.5,
                kv_cache_usage=0.4,
                prefix_cache_hit_rate=0.3,
                sources_up=4,
                sources_down=0,
                ttft_buckets={"0.05": 40.0, "0.1": 80.0, "0.25": 90.0, "+Inf": 90.0},
                e2e_buckets={"0.5": 10.0, "1.0": 50.0, "2.5": 88.0, "+Inf": 90.0},
            )
            for i in range(POINTS_PER_HOUR)
        )
    busy = deployments[0]
    for i in range(8):
        Instance.objects.create(
            deployment=busy,
            version=versions[i % 2],
            name=f"bench-model-00-{i}",
            state="ready",
            health_message="passed its health check",
        )
    DeploymentEvent.objects.bulk_create(
        DeploymentEvent(
            deployment=busy,
            kind="state",
            actor_label="controller",
            message=f"Step {i}: something the controller did.",
        )
        for i in range(50)
    )
    return {"team": team, "user": user, "model": model, "deployment": busy}


def bench_pages(world: dict[str, Any], repeats: int) -> dict[str, Any]:
    import re

    from django.test import Client
    from django.urls import reverse

    client = Client(SERVER_NAME="127.0.0.1")
    client.force_login(world["user"])
    team, pk, model = world["team"].slug, world["deployment"].pk, world["model"].slug
    live = reverse("web:deployment_live", args=[team, pk])
    tag = re.search(r"tag=([0-9a-f]+)", client.get(live).content.decode()).group(1)

    def get(url: str, expect: int, **params: str):
        def call() -> None:
            status = client.get(url, params).status_code
            assert status == expect, (url, status)

        return call

    return {
        "live fragment (full render)": timed(get(live, 200), repeats),
        "live fragment (unchanged: 204)": timed(get(live, 204, tag=tag), repeats),
        "deployment charts (240 points)": timed(
            get(reverse("web:deployment_metrics", args=[team, pk]), 200), repeats
        ),
        "model charts (3 deployments, 720 points)": timed(
            get(reverse("web:model_metrics", args=[team, model]), 200), repeats
        ),
        "dashboard (50 models)": timed(get(reverse("web:dashboard", args=[team]), 200), repeats),
    }


def bench_scrape(world: dict[str, Any], counts: tuple[int, ...]) -> dict[str, Any]:
    from contextlib import ExitStack

    from portal.deployments.models import Instance
    from portal.metrics.services import scrape_live_instances
    from tests.metrics.helpers import Answer, EngineExposition, loopback_source

    engine = EngineExposition()
    engine.serve(ok=1000)
    body = engine.text()
    deployment = world["deployment"]
    results = {}
    for count in counts:
        Instance.objects.filter(deployment=deployment).delete()
        with ExitStack() as stack:
            for i in range(count):
                source = stack.enter_context(loopback_source(Answer(body=body)))
                Instance.objects.create(
                    deployment=deployment,
                    version=deployment.target_version,
                    name=f"scrape-{count}-{i}",
                    state="ready",
                    endpoints={"metrics": source.url},
                )
            results[f"{count} instance(s)"] = timed(scrape_live_instances, 10)
    return {"bytes_per_exposition": len(body), **results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        configure(Path(tmp))
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        world = build_world()
        results = {
            "machine": machine_info(("django", "django-htmx", "prometheus-client")),
            "database": os.environ["DATABASE_URL"].split(":")[0],
            "pages": bench_pages(world, args.repeats),
            "scrape_pass": bench_scrape(world, (1, 8, 32)),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "portal_pages.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Portal pages and metrics scrape",
        "",
        f"Database: {results['database']}; machine: {results['machine'].get('cpu_model')}, "
        f"{results['machine'].get('cpu_count')} CPUs.",
        "",
        "| what | p50 | p99 |",
        "|---|---:|---:|",
    ]
    for name, timing in {
        **results["pages"],
        **{
            f"scrape pass, {k}": v for k, v in results["scrape_pass"].items() if isinstance(v, dict)
        },
    }.items():
        lines.append(f"| {name} | {timing['p50_ms']} ms | {timing['p99_ms']} ms |")
    (args.out / "portal_pages.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
