"""Small builders for domain objects, going through the services like real callers do."""

from __future__ import annotations

from datetime import UTC, datetime

from portal.core.actors import Actor
from portal.deployments.models import StageAnalysis
from portal.deployments.services import create_deployment
from portal.registry.services import create_model, register_version


def make_model(team, slug: str = "ranker", task: str = "chat"):
    return create_model(team=team, slug=slug, task=task)


def make_version(model, artifact_root, **overrides):
    spec = {
        "artifact_uri": f"file://{artifact_root}/{model.slug}",
        "engine_args": {"dtype": "auto"},
    }
    spec.update(overrides)
    return register_version(model=model, **spec)


#: A Python-backend version whose interface is a text in, tags out.
TAGGER_IO = {
    "inputs": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
    "outputs": [{"name": "TAGS", "data_type": "TYPE_STRING", "dims": [-1]}],
}


def make_python_version(model, artifact_root, io_spec: dict):
    return make_version(
        model,
        artifact_root,
        backend="python",
        api_surface="grpc",
        engine_args={},
        io_spec=io_spec,
        python_model="class TritonPythonModel:\n    def execute(self, requests):\n        return []\n",
    )


def make_stage_analysis(deployment, **overrides) -> StageAnalysis:
    """A kept canary analysis of stage 1, a rollback of v2 to v1 on a latency fail, over the
    minute from 12:00 on 2026-12-07; ``overrides`` change any field."""
    fields = {
        "stage": 1,
        "percent": 10,
        "baseline_version": 1,
        "canary_version": 2,
        "window_start": datetime(2026, 12, 7, 12, 0, tzinfo=UTC),
        "window_end": datetime(2026, 12, 7, 12, 1, tzinfo=UTC),
        "decision": "rollback",
        "action": "rolled back to v1",
        "score": 0.0,
        "reason": "critical metric failed: latency_s fail",
        "verdicts": [{"name": "latency_s", "kind": "latency", "verdict": "fail", "reason": "3x"}],
        **overrides,
    }
    return StageAnalysis.objects.create(deployment=deployment, **fields)


def make_deployment(model, version, instance_type, strategy: str = "red_black", **overrides):
    return create_deployment(
        model=model,
        strategy=strategy,
        version=version,
        instance_type=instance_type,
        actor=Actor(label="user:test"),
        **overrides,
    )
