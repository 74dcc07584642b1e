"""Small builders for domain objects, going through the services like real callers do."""

from __future__ import annotations

from portal.core.actors import Actor
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


def make_deployment(model, version, instance_type, strategy: str = "red_black", **overrides):
    return create_deployment(
        model=model,
        strategy=strategy,
        version=version,
        instance_type=instance_type,
        actor=Actor(label="user:test"),
        **overrides,
    )
