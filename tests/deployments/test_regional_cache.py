"""A version's files reach a region's own model cache before it rolls out there.

The copy runs as the Celery task would (called here in-process); the rollout controller steps
on the in-memory launcher, as in ``test_waves.py``.
"""

from __future__ import annotations

import hashlib

import pytest

from portal.core.actors import Actor
from portal.deployments import services
from portal.deployments.models import Region, RegionalCopy
from portal.deployments.rollout import controller
from portal.deployments.runtime import regional_cache
from portal.deployments.runtime.launchers import version_set
from portal.deployments.runtime.launchers.base import Health
from portal.registry.models import ModelVersion
from portal.registry.packaging import packages_dir, weights_dir
from tests.deployments.memory_launcher import MemoryLauncher as M
from tests.deployments.test_controller import ready_version
from tests.factories import make_model

USER = Actor(label="user:test")


@pytest.fixture(autouse=True)
def memory_launcher(settings, clean_redis, tmp_path):
    settings.INSTANCE_LAUNCHER = "tests.deployments.memory_launcher.MemoryLauncher"
    settings.MODEL_CACHE_ROOT = tmp_path / "platform-cache"
    M.reset()
    yield
    M.reset()


def with_files(version: ModelVersion) -> ModelVersion:
    """Give a version what materialization and packaging leave in the platform's cache."""
    weights = weights_dir(version)
    (weights / "tokenizer").mkdir(parents=True)
    (weights / "config.json").write_text('{"layers": 2}')
    (weights / "tokenizer" / "vocab.txt").write_text("a\nb\n" * 1000)
    package = f"package of v{version.number}".encode()
    digest = hashlib.sha256(package).hexdigest()
    packages_dir().mkdir(parents=True, exist_ok=True)
    (packages_dir() / f"{digest}.tar").write_bytes(package)
    ModelVersion.objects.filter(pk=version.pk).update(package_digest=digest)
    version.refresh_from_db()
    return version


@pytest.fixture
def eu_west(tmp_path, db):
    return Region.objects.create(name="eu-west", model_cache_root=str(tmp_path / "eu-cache"))


@pytest.fixture
def versions(team, release, artifact_root):
    model = make_model(team, "chat")
    v1 = with_files(ready_version(model, artifact_root))
    v2 = with_files(ready_version(model, artifact_root))
    return model, v1, v2


def deploy(model, version, instance_type, region):
    return services.create_deployment(
        model=model,
        strategy="red_black",
        version=version,
        instance_type=instance_type,
        actor=USER,
        region=region,
        bake_seconds=0,
    )


def step(deployment, times=1):
    for _ in range(times):
        controller.reconcile(deployment.pk)
    deployment.refresh_from_db()
    return deployment


def test_a_rollout_waits_for_the_regions_copy_then_runs_from_it(
    versions, cpu_instance_type, eu_west, tmp_path
):
    model, v1, _ = versions
    deployment = step(deploy(model, v1, cpu_instance_type, eu_west), 3)
    assert deployment.observed_state == "pending"
    assert deployment.status_message.startswith("Copying v1 into eu-west's model cache")
    assert M.table == {}  # no instance before the files are there
    assert regional_cache.copy(v1.pk, eu_west.pk) == "ready"
    root = tmp_path / "eu-cache"
    copied = root / weights_dir(v1).relative_to(tmp_path / "platform-cache")
    assert (copied / "tokenizer" / "vocab.txt").read_text() == "a\nb\n" * 1000
    package = root / "packages" / f"{v1.package_digest}.tar"
    assert hashlib.sha256(package.read_bytes()).hexdigest() == v1.package_digest
    assert not (root / ".staging").exists() or not any((root / ".staging").iterdir())
    step(deployment, 3)
    assert M.count(1, Health.STARTING) == 1
    # The instances of that region read the package from the region's cache.
    assert version_set(deployment, v1).package_path == package
    # Copying again is a no-op.
    assert regional_cache.copy(v1.pk, eu_west.pk) == "ready"


def test_a_region_sharing_the_platforms_cache_copies_nothing(versions, cpu_instance_type, db):
    model, v1, _ = versions
    shared = Region.objects.create(name="us-west")
    deployment = step(deploy(model, v1, cpu_instance_type, shared), 3)
    assert M.count(1, Health.STARTING) == 1
    assert not RegionalCopy.objects.exists()
    assert version_set(deployment, v1).package_path == packages_dir() / f"{v1.package_digest}.tar"


def test_a_copy_killed_midway_is_done_again_whole(versions, eu_west, tmp_path, monkeypatch):
    _, v1, _ = versions
    RegionalCopy.objects.create(version=v1, region=eu_west, state="copying")
    calls = []
    real = regional_cache.copy_file

    def dies_after_one(source, dest, progress, throttle=None):
        if calls:
            raise OSError("worker killed")
        calls.append(source)
        return real(source, dest, progress, throttle)

    monkeypatch.setattr(regional_cache, "copy_file", dies_after_one)
    assert regional_cache.copy(v1.pk, eu_west.pk) == "failed"
    root = tmp_path / "eu-cache"
    assert not (root / weights_dir(v1).relative_to(tmp_path / "platform-cache")).exists()
    monkeypatch.setattr(regional_cache, "copy_file", real)
    regional_cache.prepare(eu_west, v1)  # a new rollout asks again
    assert regional_cache.copy(v1.pk, eu_west.pk) == "ready"
    assert RegionalCopy.objects.get().attempts == 2


def test_a_package_that_does_not_match_its_digest_fails_the_rollout_there(
    versions, cpu_instance_type, eu_west
):
    model, v1, v2 = versions
    deployment = deploy(model, v1, cpu_instance_type, eu_west)
    regional_cache.copy(v1.pk, eu_west.pk)
    step(deployment, 2)
    M.set_health(1, Health.READY)
    for _ in range(10):
        if step(deployment).observed_state == "serving":
            break
    assert deployment.observed_state == "serving"
    (packages_dir() / f"{v2.package_digest}.tar").write_bytes(b"tampered")
    services.update_deployment(deployment, actor=USER, version=v2)
    step(deployment)
    assert regional_cache.copy(v2.pk, eu_west.pk) == "failed"
    for _ in range(10):
        if step(deployment).observed_state == "serving":
            break
    assert deployment.target_version == v1  # rolled back: v2 never started there
    assert M.count(2, Health.STARTING, Health.READY) == 0
    assert "sha256" in RegionalCopy.objects.get(version=v2).reason
    assert "copying v2 into eu-west's model cache failed" in deployment.status_message
