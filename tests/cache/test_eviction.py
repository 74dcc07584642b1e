"""Keeping the cache within its size: least recently deployed first, never a version in use or
pinned, and shared files survive as long as any version links them."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.cache import services
from portal.cache.models import CopyState, Materialization
from portal.cache.store import ContentStore
from portal.deployments.models import ObservedState
from portal.registry.packaging import weights_dir
from tests.factories import make_deployment, make_model, make_version

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024
SHARED = os.urandom(MiB)


def materialized_version(model, artifact_root, name: str, size_mib: int, days_ago: int | None):
    source = artifact_root / name
    source.mkdir()
    (source / "own.safetensors").write_bytes(os.urandom(size_mib * MiB))
    (source / "shared.safetensors").write_bytes(SHARED)
    version = make_version(model, artifact_root, artifact_uri=f"file://{source}")
    assert services.materialize(version.pk) == "materialized"
    if days_ago is not None:
        Materialization.objects.filter(version=version).update(
            last_used_at=timezone.now() - timedelta(days=days_ago)
        )
    return version


@pytest.fixture
def four_versions(worker_cache, artifact_root, team, release):
    model = make_model(team)
    return {
        "never_used": materialized_version(model, artifact_root, "a", 2, None),
        "old": materialized_version(model, artifact_root, "b", 2, 30),
        "pinned": materialized_version(model, artifact_root, "c", 2, 40),
        "live": materialized_version(model, artifact_root, "d", 2, 50),
    }


def test_eviction_takes_least_recently_deployed_unused_unpinned_versions(
    four_versions, worker_cache, cpu_instance_type
):
    v = four_versions
    Materialization.objects.filter(version=v["pinned"]).update(pinned=True)
    deployment = make_deployment(v["live"].model, v["live"], cpu_instance_type)
    deployment.observed_state = ObservedState.SERVING
    deployment.save()
    # A deploy counts as a use; age it so only the live deployment itself protects it.
    Materialization.objects.filter(version=v["live"]).update(
        last_used_at=timezone.now() - timedelta(days=50)
    )
    assert ContentStore(worker_cache).usage().blob_bytes == 4 * 2 * MiB + MiB

    # Room for three versions' own files plus the shared one: one must go, the oldest unused.
    report = services.evict(capacity=3 * 2 * MiB + MiB)

    assert report.evicted == [v["never_used"].pk]
    report = services.evict(capacity=2 * 2 * MiB + MiB)
    assert report.evicted == [v["old"].pk]
    # Pinned and live versions stay even when the cache is still over its size.
    report = services.evict(capacity=1)
    assert report.evicted == []
    for name in ("pinned", "live"):
        assert (weights_dir(v[name]) / "own.safetensors").is_file()
        assert (weights_dir(v[name]) / "shared.safetensors").read_bytes() == SHARED
    for name in ("never_used", "old"):
        assert not weights_dir(v[name]).exists()
        assert Materialization.objects.get(version=v[name]).state == CopyState.EVICTED
    assert ContentStore(worker_cache).usage().blob_bytes == 2 * 2 * MiB + MiB


def test_deploying_an_evicted_version_copies_it_back(
    four_versions, worker_cache, cpu_instance_type, monkeypatch
):
    version = four_versions["old"]
    services.evict(capacity=1)
    assert not services.weights_present(version)
    requested = []
    monkeypatch.setattr(services, "request_materialization", requested.append)

    make_deployment(version.model, version, cpu_instance_type)

    record = Materialization.objects.get(version=version)
    assert record.state == CopyState.PENDING
    assert requested == [version]
    assert services.materialize(version.pk) == "materialized"
    assert services.weights_present(version)
    version.refresh_from_db()
    assert version.state == "materialized"  # its lifecycle is untouched by the copy-back
