"""Materializing through FSx for Lustre: the product's FSx mode end to end, on a stand-in.

The FSx API is a real boto3 client under botocore's ``Stubber`` (request shapes checked against
the service model); S3 listing and checksums come from moto's server as in copy mode; ``lfs`` is
``fake_lfs.py``, which restores released files asynchronously from an archive directory, the
way Lustre's copytool fills them from S3. What FSx itself does on an import task (released files
appear under the association's directory) the test does, in ``FsxWorld.import_objects``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber
from django.db import connection

from portal.cache import fsx_copy, services
from portal.cache.models import CopyState, Materialization
from portal.cache.store import ContentStore
from portal.core.actors import Actor
from portal.registry.models import ModelVersion, VersionState
from portal.registry.packaging import weights_dir
from portal.registry.services import retry_version
from tests.cache.conftest import BUCKET
from tests.cache.helpers import MiB, blob, tree_files, upload
from tests.factories import make_model, make_version

pytestmark = pytest.mark.django_db(transaction=True)

FS = "fs-0123456789abcdef0"
DRA = "dra-0123456789abcdef0"
TASK = "task-0123456789abcdef0"
NOW = datetime(2026, 1, 1, tzinfo=UTC)
FAKE_LFS = Path(__file__).with_name("fake_lfs.py")


class FsxWorld:
    """A mount point, the archive behind it, the stand-in ``lfs`` and a stubbed FSx API."""

    def __init__(self, root: Path, s3) -> None:
        self.s3 = s3
        self.mount = root / "fsx"
        self.archive = root / "archive"
        self.state = root / "lfs-state"
        for path in (self.mount, self.archive, self.state):
            path.mkdir(parents=True)
        self.lfs = root / "lfs"
        self.lfs.write_text(
            f"#!/bin/sh\nexec {sys.executable} {FAKE_LFS} --state {self.state} "
            f'--archive {self.archive} --mount {self.mount} "$@"\n'
        )
        self.lfs.chmod(0o755)
        self.client = boto3.client(
            "fsx", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        self.stubber = Stubber(self.client)

    def upload(self, prefix: str, files: dict[str, bytes]) -> str:
        return upload(self.s3, prefix, files)

    def import_objects(self, fs_path: str, prefix: str, files: dict[str, bytes]) -> Path:
        """FSx's side of an import: each object appears as a released file of its size."""
        directory = self.mount / fs_path.strip("/") / prefix
        for name, data in files.items():
            stub = directory / name
            stub.parent.mkdir(parents=True, exist_ok=True)
            with stub.open("wb") as handle:
                handle.truncate(len(data))  # sparse: no bytes on the file system yet
            archived = self.archive / stub.relative_to(self.mount)
            archived.parent.mkdir(parents=True, exist_ok=True)
            archived.write_bytes(data)
        return directory

    def fail_restore(self, name: str, after_bytes: int) -> None:
        (self.state / "fail").write_text(f"{name} {after_bytes}\n")

    def lfs_calls(self) -> list[list[str]]:
        log = self.state / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def restored_paths(self) -> list[str]:
        return [p for call in self.lfs_calls() if call[0] == "hsm_restore" for p in call[1:]]

    # --- the FSx API, in the order the FSx mode calls it ---------------------------------

    def expect_file_system(self, lifecycle: str = "AVAILABLE") -> None:
        self.stubber.add_response(
            "describe_file_systems",
            {"FileSystems": [{"FileSystemId": FS, "Lifecycle": lifecycle}]},
            {"FileSystemIds": [FS]},
        )

    def expect_associations(self, *associations: dict) -> None:
        self.stubber.add_response(
            "describe_data_repository_associations",
            {"Associations": list(associations)},
            {"Filters": [{"Name": "file-system-id", "Values": [FS]}]},
        )

    def expect_import(self, uri: str) -> None:
        self.stubber.add_response(
            "create_data_repository_task",
            {"DataRepositoryTask": task("PENDING")},
            {
                "Type": "IMPORT_METADATA_FROM_REPOSITORY",
                "FileSystemId": FS,
                "Paths": [uri.rstrip("/") + "/"],
                "Report": {"Enabled": False},
                "ClientRequestToken": ANY,
            },
        )
        for lifecycle in ("EXECUTING", "SUCCEEDED"):
            self.stubber.add_response(
                "describe_data_repository_tasks",
                {"DataRepositoryTasks": [task(lifecycle)]},
                {"TaskIds": [TASK]},
            )

    def expect_copy(self, uri: str, *associations: dict) -> None:
        self.expect_file_system()
        self.expect_associations(*(associations or (association(),)))
        self.expect_import(uri)


def association(
    s3_path: str = f"s3://{BUCKET}/", fs_path: str = "/weights", lifecycle: str = "AVAILABLE", **s3
) -> dict:
    return {
        "AssociationId": DRA,
        "FileSystemId": FS,
        "Lifecycle": lifecycle,
        "FileSystemPath": fs_path,
        "DataRepositoryPath": s3_path,
        "S3": s3 or {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
    }


def task(lifecycle: str) -> dict:
    return {
        "TaskId": TASK,
        "Lifecycle": lifecycle,
        "Type": "IMPORT_METADATA_FROM_REPOSITORY",
        "CreationTime": NOW,
    }


@pytest.fixture
def world(tmp_path, s3, worker_cache, settings, monkeypatch):
    w = FsxWorld(tmp_path / "world", s3)
    settings.MODEL_CACHE_FSX_FILE_SYSTEM_ID = FS
    settings.MODEL_CACHE_FSX_MOUNT = w.mount
    settings.MODEL_CACHE_FSX_LFS = str(w.lfs)
    settings.MODEL_CACHE_FSX_POLL_SECONDS = 0.02
    settings.MODEL_CACHE_FSX_TIMEOUT_SECONDS = 60
    settings.MODEL_CACHE_PROGRESS_INTERVAL = 0.05
    monkeypatch.setenv("FAKE_LFS_CHUNK", str(256 * 1024))
    monkeypatch.setattr(fsx_copy, "fsx_client", lambda: w.client)
    with w.stubber:
        yield w
        w.stubber.assert_no_pending_responses()


def test_a_version_is_restored_by_the_file_system_and_published_as_in_copy_mode(
    world, worker_cache, team, release, monkeypatch
):
    files = {
        "model.safetensors": blob(6 * MiB + 17, 1),
        "config.json": b'{"model_type": "llama"}',
        "tokenizer/tokenizer.json": b'{"version": "1.0"}',
    }
    uri = world.upload("llama/v1", files)
    imported = world.import_objects("/weights", "llama/v1", files)
    world.expect_copy(uri)
    monkeypatch.setenv("FAKE_LFS_DELAY", "0.03")  # about 0.7 s for the big file
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    # Progress comes from the file system while the restore runs.
    seen: list[int] = []

    def copy() -> None:
        try:
            seen.append(services.materialize(version.pk))
        finally:
            connection.close()  # this thread's own connection

    copying = threading.Thread(target=copy)
    copying.start()
    partial = []
    while copying.is_alive():
        record = Materialization.objects.filter(version=version).first()
        if record and record.state == CopyState.COPYING and record.bytes_done > 0:
            partial.append(record.bytes_done)
        time.sleep(0.02)
    copying.join()

    assert seen == ["materialized"]
    version.refresh_from_db()
    assert version.state == VersionState.MATERIALIZED
    assert tree_files(version) == files
    total = sum(len(d) for d in files.values())
    assert any(0 < done < total for done in partial), partial
    record = Materialization.objects.get(version=version)
    assert (record.bytes_total, record.bytes_done, record.bytes_fetched) == (total, total, total)
    manifest = ContentStore(worker_cache).manifest(record.tree)
    assert manifest["fsx"] == {"file_system_id": FS, "association_id": DRA}
    assert record.through == f"FSx file system {FS}"
    # One restore request for every file; the restored files moved into the cache.
    assert sorted(world.restored_paths()) == sorted(str(imported / name) for name in files)
    assert [c[0] for c in world.lfs_calls()].count("hsm_restore") == 1
    assert not any(p.is_file() for p in imported.rglob("*"))
    assert not any((worker_cache / "staging").iterdir())
    # The cache owns the bytes alone: blob + the version's tree, nothing in the linked directory.
    model = weights_dir(version) / "model.safetensors"
    assert model.stat().st_nlink == 2
    # So eviction frees the bytes as in copy mode.
    report = services.evict(capacity=1)
    assert report.evicted == [version.pk] and report.freed_bytes == total
    assert not weights_dir(version).exists()


def test_a_restore_that_fails_part_way_fails_the_version_and_a_retry_finishes_it(
    world, worker_cache, team, release
):
    files = {"a.safetensors": blob(2 * MiB, 2), "b.safetensors": blob(3 * MiB, 3)}
    uri = world.upload("m/v1", files)
    imported = world.import_objects("/weights", "m/v1", files)
    world.fail_restore("b.safetensors", 1 * MiB)
    world.expect_copy(uri)
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    record = Materialization.objects.get(version=version)
    assert version.state == VersionState.FAILED
    assert "b.safetensors" in record.error and "failed part-way" in record.error
    assert "released" in record.error
    assert not weights_dir(version).exists()  # nothing half-published

    # The operator retries once the data repository is fine: the file system restores b again,
    # a (verified by the first attempt) is not asked for again.
    (world.state / "fail").unlink()
    world.expect_copy(uri)
    retry_version(version, actor=Actor(label="user:test"))
    assert services.materialize(version.pk) == "materialized"
    assert tree_files(version) == files
    assert world.restored_paths().count(str(imported / "a.safetensors")) == 1
    assert world.restored_paths().count(str(imported / "b.safetensors")) == 2


OTHER = "dra-0aaaaaaaaaaaaaaaa"


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("file system updating", "is UPDATING, not AVAILABLE"),
        ("no association on the bucket", "No data repository association"),
        ("association on another prefix", "outside every association"),
        ("association misconfigured", "MISCONFIGURED, not AVAILABLE: Access denied"),
        ("association exports to S3", "would delete the artifact's objects"),
        ("lfs missing", "Cannot run"),
        ("lfs failing", "hsm_restore failed (3): OST unavailable"),
    ],
)
def test_bad_fsx_setups_fail_the_version_with_the_reason_and_never_copy_instead(
    world, worker_cache, team, release, settings, case, needle
):
    files = {"w.safetensors": blob(MiB, 4), "config.json": b"{}"}
    uri = world.upload("bad/v1", files)
    world.import_objects("/weights", "bad/v1", files)
    if case == "file system updating":
        world.expect_file_system("UPDATING")
    else:
        world.expect_file_system()
        dra = {
            "no association on the bucket": association("s3://other-bucket/"),
            "association on another prefix": association(f"s3://{BUCKET}/llama/"),
            "association misconfigured": {
                **association(lifecycle="MISCONFIGURED"),
                "FailureDetails": {"Message": "Access denied to bucket weights"},
            },
            "association exports to S3": association(
                AutoExportPolicy={"Events": ["NEW", "CHANGED", "DELETED"]}
            ),
        }.get(case, association())
        world.expect_associations(dra)
    if case.startswith("lfs"):
        world.expect_import(uri)
    if case == "lfs missing":
        settings.MODEL_CACHE_FSX_LFS = str(world.lfs.with_name("no-such-lfs"))
    if case == "lfs failing":
        world.lfs.write_text("#!/bin/sh\necho 'OST unavailable' >&2\nexit 3\n")
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    record = Materialization.objects.get(version=version)
    assert version.state == VersionState.FAILED
    assert needle in record.error, record.error
    assert record.bytes_fetched == 0  # nothing was streamed through the worker instead
    assert not weights_dir(version).exists()
    assert not (worker_cache / "blobs").exists() or not any((worker_cache / "blobs").rglob("*"))


def _materialize_in_child(version_id: int) -> None:
    connection.close()  # the child opens its own connection
    services.materialize(version_id)
    os._exit(0)


def test_a_worker_killed_mid_restore_is_resumed_without_restoring_finished_files(
    world, worker_cache, team, release, settings, monkeypatch
):
    settings.MODEL_CACHE_LEASE_SECONDS = 1
    files = {"a.safetensors": blob(MiB, 5), "b.safetensors": blob(4 * MiB, 6)}
    uri = world.upload("k/v1", files)
    imported = world.import_objects("/weights", "k/v1", files)
    monkeypatch.setenv("FAKE_LFS_CHUNK", str(64 * 1024))
    monkeypatch.setenv("FAKE_LFS_DELAY", "0.05")  # b takes about 3 s to restore
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    # The first worker has its own stubbed client (a forked copy of one would leave this
    # test's stubber with responses it never saw used).
    first = FsxWorld.__new__(FsxWorld)
    first.client = boto3.client(
        "fsx", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    first.stubber = Stubber(first.client)
    first.stubber.activate()
    FsxWorld.expect_copy(first, uri)
    monkeypatch.setattr(fsx_copy, "fsx_client", lambda: first.client)
    connection.close()
    child = multiprocessing.get_context("fork").Process(
        target=_materialize_in_child, args=(version.pk,)
    )
    child.start()
    ledger = worker_cache / "staging" / f"version-{version.pk}" / "ledger.jsonl"
    deadline = time.monotonic() + 30
    while not (ledger.exists() and "a.safetensors" in ledger.read_text()):
        assert time.monotonic() < deadline and child.is_alive()
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)  # kill -9 while b is still being restored
    child.join()

    record = Materialization.objects.get(version=version)
    assert record.state == CopyState.COPYING and not weights_dir(version).exists()
    time.sleep(1.2)  # the dead worker's lease expires

    monkeypatch.setattr(fsx_copy, "fsx_client", lambda: world.client)
    world.expect_copy(uri)
    assert services.materialize(version.pk) == "materialized"

    record.refresh_from_db()
    assert record.attempts == 2
    assert tree_files(version) == files
    # a was verified by the first worker: not restored again, not counted as fetched again.
    assert world.restored_paths().count(str(imported / "a.safetensors")) == 1
    assert record.bytes_fetched == len(files["b.safetensors"])
    assert ModelVersion.objects.get(pk=version.pk).state == VersionState.MATERIALIZED


def test_buckets_fsx_does_not_serve_are_copied_through_the_worker(
    world, worker_cache, team, release, settings
):
    settings.MODEL_CACHE_FSX_BUCKETS = ["linked-bucket"]
    files = {"w.safetensors": blob(MiB, 7)}
    uri = world.upload("plain/v1", files)
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    # No FSx call is stubbed: one would fail the copy.
    assert services.materialize(version.pk) == "materialized"
    assert tree_files(version) == files
    assert world.lfs_calls() == []
    record = Materialization.objects.get(version=version)
    assert record.bytes_fetched == MiB
    assert record.through == "a worker's copy"
    assert "fsx" not in ContentStore(worker_cache).manifest(record.tree)
