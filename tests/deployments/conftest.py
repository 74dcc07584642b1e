"""The rollout tests' world: the demo model registered as versions, the local gateway, a real
Celery worker running the controller, and instances as real serving processes."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from portal.core.actors import Actor
from portal.deployments.models import Deployment
from portal.deployments.services import create_deployment
from portal.deployments.traffic.caller_keys import issue_caller_key
from portal.registry.models import ModelVersion, VersionState
from portal.registry.services import create_model, register_version
from serving.demo_model import make_demo_model
from tests.conftest import start_celery_worker, stop_process_group
from tests.deployments.memory_launcher import MemoryLauncher
from tests.deployments.rollout_helpers import (
    kill_instance_processes,
    start_gateway,
    wait_for,
)

USER = Actor(label="user:test")


@pytest.fixture
def memory_launcher(settings, clean_redis):
    """The controller on :class:`MemoryLauncher`, a launcher the test moves by hand (a module
    uses it with ``pytestmark = pytest.mark.usefixtures("memory_launcher")``)."""
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    MemoryLauncher.reset()
    yield
    MemoryLauncher.reset()


@pytest.fixture(scope="session")
def demo_weights(tmp_path_factory) -> Path:
    return make_demo_model(tmp_path_factory.mktemp("demo") / "weights")


@dataclass
class RolloutWorld:
    gateway_url: str
    run_root: Path
    artifact_root: Path
    worker: object
    team: object
    instance_type: object
    #: A caller key of the team for all its models (see :func:`issue_gateway_key`).
    caller_key: str = ""

    def model(self, slug: str = "chat"):
        return create_model(team=self.team, slug=slug, task="chat")

    def version(self, model, **spec) -> ModelVersion:
        """Register the demo model as the model's next version and wait until it is ready."""
        source = self.artifact_root / model.slug
        if not source.exists():
            shutil.copytree(self._weights, source)
        version = register_version(model=model, artifact_uri=f"file://{source}", **spec)

        def ready():
            version.refresh_from_db()
            assert version.state != VersionState.FAILED, version.failure_reason
            return version.state == VersionState.READY

        wait_for(ready, 120, f"v{version.number} to be ready")
        return version

    def deploy(self, model, version, **options) -> Deployment:
        return create_deployment(
            model=model,
            version=version,
            instance_type=self.instance_type,
            actor=USER,
            strategy=options.pop("strategy", "red_black"),
            **options,
        )

    @property
    def auth(self) -> dict[str, str]:
        """The headers of a caller with the world's key."""
        return {"Authorization": f"Bearer {self.caller_key}"}

    def endpoint(self, model, version: int | None = None) -> str:
        path = f"{self.team.slug}/{model.slug}"
        if version is not None:
            path += f"/versions/{version}"
        return f"{self.gateway_url}/models/{path}"

    _weights: Path = Path()


def issue_gateway_key(team, gateway_url: str) -> str:
    """A caller key of ``team`` for all its models, issued as the keys page does, once the
    gateway at ``gateway_url`` accepts it (published when the transaction commits)."""
    plaintext = issue_caller_key(team=team, name="tests").plaintext
    wait_for(
        lambda: (
            httpx.get(
                f"{gateway_url}/models/{team.slug}/none/v1/models",
                headers={"Authorization": f"Bearer {plaintext}"},
            ).status_code
            != 401
        ),
        10,
        "the gateway to take the caller key",
    )
    return plaintext


@pytest.fixture
def rollout_world(
    worker_cache,
    monkeypatch,
    settings,
    tmp_path,
    clean_redis,
    transactional_db,
    team,
    release,
    cpu_instance_type,
    artifact_root,
    demo_weights,
):
    run_root = tmp_path / "instances"
    env = {
        "INSTANCE_RUN_ROOT": str(run_root),
        "INSTANCE_DRAIN_SECONDS": "10",
        "RECONCILE_INTERVAL_SECONDS": "0.25",
        "RECONCILE_IDLE_INTERVAL_SECONDS": "1",
        "RECONCILE_STALE_SECONDS": "2",
        "ROLLOUT_MIN_REQUESTS": "5",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings.INSTANCE_RUN_ROOT = run_root
    settings.RECONCILE_STALE_SECONDS = 2.0
    gateway, gateway_url = start_gateway(settings.REDIS_URL)
    worker = start_celery_worker("rollout")
    world = RolloutWorld(gateway_url, run_root, artifact_root, worker, team, cpu_instance_type)
    world._weights = demo_weights
    try:
        world.caller_key = issue_gateway_key(team, gateway_url)
        yield world
    finally:
        stop_process_group(world.worker)  # type: ignore[arg-type]
        kill_instance_processes(run_root)
        stop_process_group(gateway)
