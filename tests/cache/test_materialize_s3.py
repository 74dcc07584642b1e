"""Materializing from S3 over real HTTP (moto's server on loopback): full copies, dedup across
versions, checksum failures, hostile keys, concurrent requests, and a worker killed mid-copy."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import pytest
from django.db import connection

from portal.cache import services
from portal.cache.models import CopyState, Materialization
from portal.cache.sources import open_source
from portal.cache.store import ContentStore
from portal.cache.tasks import redrive_materializations
from portal.registry.models import VersionState
from portal.registry.packaging import weights_dir
from tests.cache.conftest import BUCKET
from tests.cache.helpers import MiB, blob, tree_files, upload
from tests.conftest import start_celery_worker, stop_process_group
from tests.factories import make_model, make_version

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_parts(settings):
    settings.MODEL_CACHE_PART_SIZE = 4 * MiB
    settings.MODEL_CACHE_PARALLELISM = 4


def test_full_copy_in_parallel_ranges(worker_cache, s3, small_parts, team, release):
    files = {
        "model-00001-of-00002.safetensors": blob(24 * MiB + 123, 1),
        "model-00002-of-00002.safetensors": blob(9 * MiB, 2),
        "config.json": b'{"model_type": "llama"}',
        "tokenizer/tokenizer.json": b'{"version": "1.0"}',
    }
    uri = upload(s3, "llama/v1", files)
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "materialized"

    version.refresh_from_db()
    assert version.state == VersionState.MATERIALIZED
    assert tree_files(version) == files
    record = Materialization.objects.get(version=version)
    total = sum(len(d) for d in files.values())
    assert (record.state, record.bytes_total, record.bytes_done, record.bytes_fetched) == (
        CopyState.PRESENT, total, total, total,
    )  # fmt: skip
    assert (record.files_total, record.files_done) == (4, 4)
    manifest = ContentStore(worker_cache).manifest(record.tree)
    by_path = {f["path"]: f for f in manifest["files"]}
    big = by_path["model-00001-of-00002.safetensors"]
    assert big["sha256"] == hashlib.sha256(files[big["path"]]).hexdigest()
    assert big["etag"]  # recorded from the source
    # Nothing of the copy is left behind, and a second run only notices the copy is there.
    assert not any((worker_cache / "staging").iterdir())
    assert services.materialize(version.pk) == "present"


def test_identical_files_are_stored_once_across_versions(worker_cache, s3, team, release):
    shared = blob(12 * MiB, 3)
    model = make_model(team)
    v1 = make_version(
        model, worker_cache,
        artifact_uri=upload(s3, "m/v1", {"weights.safetensors": shared, "config.json": b"{}"}),
    )  # fmt: skip
    v2 = make_version(
        model, worker_cache,
        artifact_uri=upload(s3, "m/v2", {"weights.safetensors": shared, "config.json": b"{ }"}),
    )  # fmt: skip
    assert services.materialize(v1.pk) == "materialized"
    assert services.materialize(v2.pk) == "materialized"

    a = weights_dir(v1) / "weights.safetensors"
    b = weights_dir(v2) / "weights.safetensors"
    assert a.stat().st_ino == b.stat().st_ino  # one inode: the bytes are on disk once
    usage = ContentStore(worker_cache).usage()
    assert usage.blob_count == 3
    assert usage.blob_bytes == len(shared) + 2 + 3


def test_a_stated_sha256_already_in_the_cache_is_not_fetched_again(worker_cache, s3, team, release):
    data = blob(8 * MiB, 4)
    digest = {"Metadata": {"sha256": hashlib.sha256(data).hexdigest()}}
    model = make_model(team)
    v1 = make_version(
        model, worker_cache, artifact_uri=upload(s3, "d/v1", {"w.safetensors": data}, **digest)
    )
    v2 = make_version(
        model, worker_cache, artifact_uri=upload(s3, "d/v2", {"w.safetensors": data}, **digest)
    )
    assert services.materialize(v1.pk) == "materialized"
    assert services.materialize(v2.pk) == "materialized"
    assert Materialization.objects.get(version=v2).bytes_fetched == 0
    assert tree_files(v2) == {"w.safetensors": data}


def test_checksum_mismatch_fails_the_version_and_publishes_nothing(worker_cache, s3, team, release):
    data = blob(5 * MiB, 5)
    uri = upload(s3, "bad/v1", {"w.safetensors": data}, Metadata={"sha256": "ab" * 32})
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert "Checksum mismatch for w.safetensors" in version.failure_reason
    assert "Nothing was published" in version.failure_reason
    assert not weights_dir(version).exists()
    store = ContentStore(worker_cache)
    assert not store.blob_path(hashlib.sha256(data).hexdigest()).exists()
    assert Materialization.objects.get(version=version).state == CopyState.FAILED


@pytest.mark.parametrize(
    "key", ["evil/../../outside.bin", "evil//etc/passwd", "evil/./x", "evil/a/../../b"]
)
def test_keys_that_leave_the_tree_are_rejected(worker_cache, s3, team, release, key):
    s3.put_object(Bucket=BUCKET, Key="evil/config.json", Body=b"{}")
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"payload")
    assert key in [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    version = make_version(make_model(team), worker_cache, artifact_uri=f"s3://{BUCKET}/evil")

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert "Refusing s3://weights/" in version.failure_reason
    assert not (worker_cache.parent / "outside.bin").exists()
    assert not any(p.name in ("outside.bin", "passwd", "b") for p in worker_cache.rglob("*"))


def test_missing_prefix_and_denied_access_are_explained(
    worker_cache, s3, team, release, monkeypatch
):
    model = make_model(team)
    empty = make_version(model, worker_cache, artifact_uri=f"s3://{BUCKET}/nothing-here")
    assert services.materialize(empty.pk) == "failed"
    empty.refresh_from_db()
    assert empty.failure_reason == f"No objects under s3://{BUCKET}/nothing-here."

    nobucket = make_version(model, worker_cache, artifact_uri="s3://no-such-bucket/m")
    assert services.materialize(nobucket.pk) == "failed"
    nobucket.refresh_from_db()
    assert "the bucket does not exist" in nobucket.failure_reason


def test_concurrent_requests_copy_once(worker_cache, s3, small_parts, team, release, settings):
    settings.MODEL_CACHE_MAX_BYTES_PER_SECOND = 40 * MiB  # long enough to overlap for sure
    data = blob(16 * MiB, 6)
    uri = upload(s3, "c/v1", {"w.safetensors": data})
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)
    outcomes: list[str] = []

    def run() -> None:
        try:
            outcomes.append(services.materialize(version.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join()

    # One copies; the others find it busy (or, on a very slow machine, already present).
    assert outcomes.count("materialized") == 1
    assert set(outcomes) - {"materialized"} <= {"busy", "present"}
    record = Materialization.objects.get(version=version)
    assert record.attempts == 1 and record.bytes_fetched == len(data)
    assert tree_files(version) == {"w.safetensors": data}


@pytest.fixture
def slow_copy_env(monkeypatch, settings):
    """Settings for the worker process: small ranges, a bandwidth cap so the copy takes a few
    seconds, frequent progress, and a short lease so a dead worker's copy is taken over fast."""
    env = {
        "MODEL_CACHE_PART_SIZE": str(1 * MiB),
        "MODEL_CACHE_PARALLELISM": "4",
        "MODEL_CACHE_MAX_BYTES_PER_SECOND": str(8 * MiB),
        "MODEL_CACHE_PROGRESS_INTERVAL": "0.2",
        "MODEL_CACHE_LEASE_SECONDS": "2",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings.MODEL_CACHE_LEASE_SECONDS = 2


@pytest.mark.slow
def test_a_killed_worker_is_resumed_without_fetching_finished_ranges(
    worker_cache, s3, slow_copy_env, clean_redis, team, release
):
    data = blob(24 * MiB, 7)
    files = {"w.safetensors": data, "config.json": b'{"model_type": "llama"}'}
    worker = start_celery_worker("first")
    try:
        # Registration enqueues the copy; the worker picks it up.
        version = make_version(
            make_model(team), worker_cache, artifact_uri=upload(s3, "k/v1", files)
        )
        record = wait_for(
            lambda: Materialization.objects.filter(
                version=version, bytes_done__gte=len(data) // 2
            ).first(),
            timeout=60,
        )
        os.killpg(worker.pid, signal.SIGKILL)  # kill -9, mid-transfer
        worker.wait()
    finally:
        stop_process_group(worker)

    record.refresh_from_db()
    version.refresh_from_db()
    done_before = record.bytes_done
    assert record.state == CopyState.COPYING and 0 < done_before < len(data)
    assert version.state == VersionState.MATERIALIZING
    assert not weights_dir(version).exists()  # a half copy is never visible

    worker = start_celery_worker("second")
    try:
        # Beat's re-drive notices the copy whose heartbeat stopped, once its lease expired.
        redriven = wait_for(lambda: redrive_materializations.delay().get(timeout=10), timeout=30)
        assert redriven == [version.pk]
        wait_for(
            lambda: version.refresh_from_db() or version.state == VersionState.READY, timeout=60
        )
    finally:
        stop_process_group(worker)

    record.refresh_from_db()
    assert record.state == CopyState.PRESENT and record.attempts == 2
    # The second attempt fetched only what the first had not finished.
    # (Ranges in flight at the kill, up to parallelism x part size, are fetched again.)
    assert record.bytes_fetched <= len(data) + len(files["config.json"]) - done_before + 6 * MiB
    assert record.bytes_fetched < len(data)
    assert tree_files(version) == files


def wait_for(check, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def test_multipart_uploads_are_checked_against_their_composite_etag(
    worker_cache, s3, small_parts, team, release, tmp_path
):
    from boto3.s3.transfer import TransferConfig

    data = blob(13 * MiB + 5, 8)
    (tmp_path / "w").write_bytes(data)
    parts = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_file(str(tmp_path / "w"), BUCKET, "mp/v1/w.safetensors", Config=parts)
    etag = s3.head_object(Bucket=BUCKET, Key="mp/v1/w.safetensors")["ETag"].strip('"')
    assert etag.endswith("-3")
    version = make_version(make_model(team), worker_cache, artifact_uri=f"s3://{BUCKET}/mp/v1")

    source_file = open_source(version.artifact_uri).list_files()[0]
    assert (source_file.md5, source_file.md5_part_size) == (etag, 5 * MiB)
    assert services.materialize(version.pk) == "materialized"
    assert tree_files(version) == {"w.safetensors": data}


def test_an_object_replaced_during_the_copy_fails_instead_of_mixing_bytes(
    worker_cache, s3, small_parts, team, release, settings
):
    settings.MODEL_CACHE_PART_SIZE = 1 * MiB
    settings.MODEL_CACHE_PARALLELISM = 1
    settings.MODEL_CACHE_MAX_BYTES_PER_SECOND = 8 * MiB  # about 2 s for the object
    uri = upload(s3, "chg/v1", {"w.safetensors": blob(16 * MiB, 9)})
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)
    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.append(services.materialize(version.pk))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(
        lambda: Materialization.objects.filter(version=version, bytes_done__gt=2 * MiB).exists(),
        timeout=30,
    )
    upload(s3, "chg/v1", {"w.safetensors": blob(16 * MiB, 10)})
    thread.join()

    assert outcome == ["failed"]
    version.refresh_from_db()
    assert "changed while it was being copied" in version.failure_reason
    assert not weights_dir(version).exists()


@pytest.mark.parametrize(
    ("code", "status", "needle"),
    [
        ("AccessDenied", 403, "Access denied to s3://b/k: give the workers' credentials"),
        ("NoSuchKey", 404, "does not exist (it was deleted or renamed during the copy)"),
        ("NoSuchBucket", 404, "the bucket does not exist"),
        ("PreconditionFailed", 412, "changed while it was being copied"),
        ("SlowDown", 503, "S3 error on s3://b/k: SlowDown"),
    ],
)
def test_s3_errors_become_reasons_a_human_can_act_on(code, status, needle):
    from botocore.exceptions import ClientError

    from portal.cache.sources.s3 import _explain

    error = ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )
    assert needle in str(_explain(error, "s3://b/k"))
