"""A failed version retried from a corrected source is copied from that source, never from
what the old one left: neither its resumable staging area (a local source states no
checksums, so a same-named, same-sized file would pass as done) nor a tree it published."""

from __future__ import annotations

import hashlib

import pytest

from portal.cache import services
from portal.cache.store import LedgerEntry
from portal.core.actors import Actor
from portal.registry.lifecycle import transition_version
from portal.registry.models import VersionState
from portal.registry.packaging import weights_dir
from portal.registry.services import retry_version
from tests.factories import make_version

pytestmark = pytest.mark.django_db(transaction=True)


def source(root, name: str, content: bytes):
    (root / name).mkdir()
    (root / name / "weights.bin").write_bytes(content)
    return f"file://{root}/{name}"


def test_a_published_tree_of_the_old_source_is_replaced(
    worker_cache, artifact_root, model, release
):
    version = make_version(
        model, artifact_root, artifact_uri=source(artifact_root, "old", b"A" * 64)
    )
    assert services.materialize(version.pk) == "materialized"
    # Packaging then failed (say the author meant another checkpoint of the same size).
    transition_version(version, VersionState.PACKAGING, reason="test")
    transition_version(version, VersionState.FAILED, reason="wrong checkpoint")
    new = source(artifact_root, "new", b"B" * 64)
    retry_version(version, actor=Actor(label="user:test"), artifact_uri=new)
    assert services.materialize(version.pk) == "materialized"
    version.refresh_from_db()
    assert version.state == VersionState.MATERIALIZED
    assert (weights_dir(version) / "weights.bin").read_bytes() == b"B" * 64


def test_a_staging_area_of_the_old_source_is_not_resumed(
    worker_cache, artifact_root, model, release
):
    old = source(artifact_root, "old", b"A" * 64)
    version = make_version(model, artifact_root, artifact_uri=old)
    assert services.materialize(version.pk) == "materialized"
    transition_version(version, VersionState.PACKAGING, reason="test")
    transition_version(version, VersionState.FAILED, reason="wrong checkpoint")
    store = services.content_store()
    store.remove_tree(version.cache_tree)
    # What an attempt at the old source killed before publishing leaves: the file verified,
    # linked to its blob and in the ledger, which the next attempt resumes from.
    staging = store.staging(f"version-{version.pk}")
    staging.keep_only_for(old)
    sha = hashlib.sha256(b"A" * 64).hexdigest()
    assert store.link_existing(sha, staging.file("weights.bin"))
    staging.record(LedgerEntry("weights.bin", sha, 64))
    assert "weights.bin" in staging.ledger()
    retry_version(
        version,
        actor=Actor(label="user:test"),
        artifact_uri=source(artifact_root, "new", b"B" * 64),
    )
    assert services.materialize(version.pk) == "materialized"
    assert (weights_dir(version) / "weights.bin").read_bytes() == b"B" * 64
