"""Removing abandoned staging areas: failed copies nobody retried past the grace period and
deleted versions go, with the blobs only they linked; a copy in progress, a retry, a copy within
the grace period and a present version stay; a removal killed midway is finished; the admin
shows what is waiting to go and when."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.template.defaultfilters import filesizeformat
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.cache import cleanup, tasks
from portal.cache.models import CopyState, Materialization
from portal.cache.services import Lease
from portal.cache.store import ContentStore, LedgerEntry
from portal.registry.models import ModelVersion, VersionState
from tests.factories import make_model, make_version

pytestmark = pytest.mark.django_db

KiB = 1024
GRACE = 2 * 86400


@pytest.fixture(autouse=True)
def _grace(settings, clean_redis):
    settings.MODEL_CACHE_STAGING_GRACE_SECONDS = GRACE


@pytest.fixture
def store(settings) -> ContentStore:
    return ContentStore(settings.MODEL_CACHE_ROOT)


@pytest.fixture
def cache_model(team, release):
    return make_model(team)


def partial_copy(store: ContentStore, version_id: int, verified: bytes, partial: bytes) -> None:
    """What a failed copy leaves: one file verified and linked into the blobs (in the ledger),
    one partial file with its part journal, and the source marker."""
    staging = store.staging(f"version-{version_id}")
    staging.keep_only_for("file:///weights")
    done = staging.file("model-00001.safetensors")
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_bytes(verified)
    sha = hashlib.sha256(verified).hexdigest()
    store.adopt(done, sha)
    staging.record(LedgerEntry("model-00001.safetensors", sha, len(verified)))
    staging.file("model-00002.safetensors").write_bytes(partial)
    journal = staging.part_journal("model-00002.safetensors")
    journal.parent.mkdir(parents=True, exist_ok=True)
    journal.write_text("0 1024\n")


def version_in(model, artifact_root, name: str, copy: CopyState, *, failed_ago=None, **state):
    version = make_version(model, artifact_root, artifact_uri=f"file://{artifact_root}/{name}")
    ModelVersion.objects.filter(pk=version.pk).update(**state)
    finished = None if failed_ago is None else timezone.now() - failed_ago
    Materialization.objects.update_or_create(
        version=version,
        defaults={"tree": version.cache_tree, "state": copy, "finished_at": finished},
    )
    return version


def failed_version(model, artifact_root, name: str, ago: timedelta):
    return version_in(
        model, artifact_root, name, CopyState.FAILED, failed_ago=ago, state=VersionState.FAILED
    )


def area(store: ContentStore, version) -> os.PathLike:
    return store.staging(f"version-{version.pk}").path


def test_failed_copy_past_grace_is_removed_and_its_blobs_collected(
    store, cache_model, artifact_root
):
    version = failed_version(cache_model, artifact_root, "old", timedelta(days=3))
    partial_copy(store, version.pk, b"v" * 8 * KiB, b"p" * 3 * KiB)
    usage = store.usage()
    assert usage.blob_bytes == 8 * KiB and usage.staging_bytes > 3 * KiB

    report = cleanup.clean_up_staging()

    assert [a.key for a in report.removed] == [f"version-{version.pk}"]
    assert "failed" in report.removed[0].reason
    assert not area(store, version).exists()
    assert report.blob_bytes_freed == 8 * KiB
    assert report.staging_bytes_freed >= 3 * KiB  # the partial file (and ledger, marker)
    assert report.freed_bytes == report.blob_bytes_freed + report.staging_bytes_freed
    after = store.usage()
    assert (after.blob_count, after.blob_bytes, after.staging_bytes) == (0, 0, 0)
    assert store.trash_leftovers() == []
    # Nothing left to do the second time.
    assert cleanup.clean_up_staging().removed == []


def test_failed_copy_within_grace_is_kept_and_counted_in_usage(store, cache_model, artifact_root):
    version = failed_version(cache_model, artifact_root, "recent", timedelta(days=1))
    partial_copy(store, version.pk, b"v" * 8 * KiB, b"p" * 3 * KiB)

    report = cleanup.clean_up_staging()

    assert report.removed == []
    assert (area(store, version) / "files" / "model-00002.safetensors").is_file()
    assert store.usage().staging_bytes >= 3 * KiB
    assert store.usage().blob_bytes == 8 * KiB
    # The same area goes once the grace period has passed.
    later = cleanup.clean_up_staging(now=timezone.now() + timedelta(days=1, hours=1))
    assert [a.key for a in later.removed] == [f"version-{version.pk}"]


def test_a_copy_holding_the_lease_is_never_removed(store, cache_model, artifact_root, settings):
    version = failed_version(cache_model, artifact_root, "busy", timedelta(days=3))
    partial_copy(store, version.pk, b"v" * KiB, b"p" * KiB)
    lease = Lease(f"model-cache:materialize:{version.pk}", settings.MODEL_CACHE_LEASE_SECONDS)
    assert lease.acquire()
    try:
        report = cleanup.clean_up_staging()
    finally:
        lease.release()

    assert report.removed == [] and report.busy == [f"version-{version.pk}"]
    assert (area(store, version) / "ledger.jsonl").is_file()
    assert store.usage().blob_bytes == KiB
    # Released, the next run takes it (the state says it is still abandoned).
    assert [a.key for a in cleanup.clean_up_staging().removed] == [f"version-{version.pk}"]


def test_a_retried_version_keeps_its_area_even_with_an_old_failure(
    store, cache_model, artifact_root
):
    # Retry sends the version back to registered; the row stays failed until the copy starts.
    version = version_in(
        cache_model,
        artifact_root,
        "retried",
        CopyState.FAILED,
        failed_ago=timedelta(days=5),
        state=VersionState.REGISTERED,
    )
    partial_copy(store, version.pk, b"v" * KiB, b"p" * KiB)

    assert cleanup.clean_up_staging().removed == []
    assert area(store, version).is_dir()


def test_deleted_version_area_is_removed(store, cache_model, artifact_root):
    version = failed_version(cache_model, artifact_root, "gone", timedelta(hours=1))
    partial_copy(store, version.pk, b"v" * 4 * KiB, b"p" * KiB)
    version_id = version.pk
    ModelVersion.objects.filter(pk=version_id).delete()

    report = cleanup.clean_up_staging()

    assert [(a.key, a.reason) for a in report.removed] == [
        (f"version-{version_id}", "the version was deleted")
    ]
    assert not store.staging(f"version-{version_id}").path.exists()
    assert report.blob_bytes_freed == 4 * KiB


@pytest.mark.parametrize("copy", [CopyState.PRESENT, CopyState.COPYING, CopyState.PENDING])
def test_present_or_copying_versions_are_never_removed(store, cache_model, artifact_root, copy):
    version = version_in(
        cache_model,
        artifact_root,
        "live",
        copy,
        failed_ago=timedelta(days=30),
        state=VersionState.READY if copy == CopyState.PRESENT else VersionState.MATERIALIZING,
    )
    partial_copy(store, version.pk, b"v" * KiB, b"p" * KiB)

    report = cleanup.clean_up_staging(now=timezone.now() + timedelta(days=365))

    assert report.removed == []
    assert area(store, version).is_dir()
    assert store.usage().blob_bytes == KiB


def test_unknown_areas_go_after_the_grace_period_by_mtime(store):
    stray = store.staging_root / "scratch-from-an-old-release"
    (stray / "files").mkdir(parents=True)
    (stray / "files" / "x.bin").write_bytes(b"x" * KiB)

    assert cleanup.clean_up_staging().removed == []
    assert stray.is_dir()

    old = time.time() - GRACE - 3600
    for path in (stray / "files" / "x.bin", stray / "files", stray):
        os.utime(path, (old, old))
    report = cleanup.clean_up_staging()
    assert [a.key for a in report.removed] == ["scratch-from-an-old-release"]
    assert not stray.exists()


def test_a_removal_killed_midway_is_finished_by_the_next_run(store, cache_model, artifact_root):
    version = failed_version(cache_model, artifact_root, "killed", timedelta(days=3))
    partial_copy(store, version.pk, b"v" * 6 * KiB, b"p" * 2 * KiB)
    # Killed right after the rename: the area is out of service, its files still in trash.
    doomed = store.staging(f"version-{version.pk}").retire()
    assert doomed is not None and doomed.parent == store.trash
    assert not area(store, version).exists()
    # ... and partly deleted.
    (doomed / "ledger.jsonl").unlink()

    report = cleanup.clean_up_staging()

    assert report.leftovers == 1
    assert store.trash_leftovers() == []
    assert report.staging_bytes_freed >= 2 * KiB
    assert report.blob_bytes_freed == 6 * KiB
    assert store.usage().blob_count == 0


def test_retire_of_a_missing_area_is_a_no_op(store):
    assert store.staging("version-999999").retire() is None


def test_the_celery_task_runs_the_clean_up(store, cache_model, artifact_root):
    version = failed_version(cache_model, artifact_root, "task", timedelta(days=3))
    partial_copy(store, version.pk, b"v" * KiB, b"p" * KiB)

    result = tasks.clean_up_staging.apply().get()

    assert result["removed"] == [f"version-{version.pk}"]
    assert result["busy"] == [] and result["freed_bytes"] >= 2 * KiB
    assert not area(store, version).exists()


def test_admin_changelist_shows_partial_downloads_and_when_they_go(
    store, cache_model, artifact_root
):
    recent = failed_version(cache_model, artifact_root, "recent", timedelta(days=1))
    partial_copy(store, recent.pk, b"v" * 8 * KiB, b"p" * 4 * KiB)
    finished_at = Materialization.objects.get(version=recent).finished_at
    superuser = get_user_model().objects.create_superuser(
        username="root", email="root@example.com", password="pw-root"
    )
    client = Client()
    client.force_login(superuser)

    url = reverse("admin:cache_materialization_changelist")
    page = client.get(url).content.decode()

    assert 'id="partial-downloads"' in page
    assert "removed 2 days after the failure" in page
    held = cleanup.tree_size(area(store, recent)).total_bytes
    assert held > 12 * KiB  # both files, the ledger, the journal and the marker
    assert f"{recent}: {filesizeformat(held)} in staging" in page
    remove_after = timezone.localtime(finished_at + timedelta(seconds=GRACE))
    assert f"removed after {remove_after:%Y-%m-%d %H:%M} UTC" in page
    usage = store.usage()
    assert usage.staging_bytes > 4 * KiB
    # The usage line counts the staging bytes in the total.
    assert f"{filesizeformat(usage.blob_bytes + usage.staging_bytes)} used in all" in page
    assert "8.0\xa0KB in 1 distinct files" in page
