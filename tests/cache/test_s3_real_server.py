"""Materializing from a real S3-compatible store: SeaweedFS (``weed mini``) on loopback, through
the product's path (``services.materialize``), for what moto is lenient about or only imitates.

Checked first on SeaweedFS 4.48 by hand, then here: a ``Range`` GET is answered ``206`` with only
those bytes; ``If-Match`` on GET is enforced (``412 PreconditionFailed`` on a stale ETag, also
with a ``Range``); a multipart upload's ETag is the composite MD5 (``<md5 of part md5s>-<parts>``)
and ``HEAD ?partNumber=1`` gives the first part's size; user metadata (``x-amz-meta-sha256``) is
kept; requests signed with unknown keys are refused. Nothing here is skipped or imitated: every
behaviour a test relies on, SeaweedFS implements.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from boto3.s3.transfer import TransferConfig

from portal.cache import services
from portal.cache.models import CopyState, Materialization
from portal.cache.sources import open_source
from portal.cache.sources import s3 as s3_source
from portal.cache.store import ContentStore
from portal.registry.models import VersionState
from portal.registry.packaging import weights_dir
from tests.cache.conftest import BUCKET
from tests.cache.helpers import MiB, blob, tree_files, upload
from tests.factories import make_model, make_version

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_parts(settings):
    settings.MODEL_CACHE_PART_SIZE = 1 * MiB
    settings.MODEL_CACHE_PARALLELISM = 4


@pytest.fixture
def get_calls(monkeypatch):
    """Every GetObject the product's S3 source makes, as the server answered it: the request's
    Range and If-Match, the status, Content-Range and Content-Length (botocore's before-call and
    after-call events on the source's own client, paired through the request context)."""
    calls: list[dict] = []
    make_client = s3_source.s3_client

    def keep_request(params, context, **_):
        context["recorded_headers"] = dict(params["headers"])

    def record(http_response, context, **_):
        sent, headers = context.get("recorded_headers", {}), http_response.headers
        calls.append(
            {
                "range": sent.get("Range"),
                "if_match": sent.get("If-Match"),
                "status": http_response.status_code,
                "content_range": headers.get("Content-Range"),
                "length": int(headers.get("Content-Length", -1)),
            }
        )

    def recording_client(*args, **kwargs):
        client = make_client(*args, **kwargs)
        client.meta.events.register("before-call.s3.GetObject", keep_request)
        client.meta.events.register("after-call.s3.GetObject", record)
        return client

    monkeypatch.setattr(s3_source, "s3_client", recording_client)
    return calls


def test_the_server_answers_a_range_with_206_and_only_those_bytes(seaweed):
    data = blob(3 * MiB + 7, 1)
    seaweed.put_object(Bucket=BUCKET, Key="r/o", Body=data)

    got = seaweed.get_object(Bucket=BUCKET, Key="r/o", Range="bytes=1048576-1049599")

    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes 1048576-1049599/{len(data)}"
    assert got["ContentLength"] == 1024
    assert got["Body"].read() == data[MiB : MiB + 1024]
    # The last, short range too.
    tail = seaweed.get_object(Bucket=BUCKET, Key="r/o", Range=f"bytes={3 * MiB}-")
    assert tail["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert tail["Body"].read() == data[3 * MiB :]


def test_a_copy_in_small_parallel_ranges_is_byte_exact(
    worker_cache, seaweed, small_parts, get_calls, team, release
):
    files = {
        "model.safetensors": blob(9 * MiB + 123, 2),
        "config.json": b'{"model_type": "llama"}',
    }
    uri = upload(seaweed, "llama/v1", files)
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "materialized"

    version.refresh_from_db()
    assert version.state == VersionState.MATERIALIZED
    assert tree_files(version) == files
    record = Materialization.objects.get(version=version)
    total = sum(len(d) for d in files.values())
    assert (record.state, record.bytes_done, record.bytes_fetched) == (
        CopyState.PRESENT, total, total,
    )  # fmt: skip
    # Ten 1 MiB ranges of the big file, each answered 206 with only its bytes, each carrying
    # the listing's ETag; the small file in one range.
    etag = seaweed.head_object(Bucket=BUCKET, Key="llama/v1/model.safetensors")["ETag"]
    big = [c for c in get_calls if c["if_match"] == etag]
    size = len(files["model.safetensors"])
    assert sorted(c["range"] for c in big) == sorted(
        f"bytes={i * MiB}-{min(size, (i + 1) * MiB) - 1}" for i in range(10)
    )
    for call in big:
        start, end = (int(x) for x in call["range"].removeprefix("bytes=").split("-"))
        assert call["status"] == 206
        assert call["content_range"] == f"bytes {start}-{end}/{size}"
        assert call["length"] == end - start + 1
    assert len(get_calls) == 11 and all(c["if_match"] for c in get_calls)
    manifest = ContentStore(worker_cache).manifest(record.tree)
    assert manifest is not None
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path["model.safetensors"]["etag"] == etag.strip('"')


def test_a_multipart_upload_is_checked_against_its_composite_etag(
    worker_cache, seaweed, small_parts, team, release, tmp_path
):
    data = blob(13 * MiB + 5, 3)
    (tmp_path / "w").write_bytes(data)
    parts = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    seaweed.upload_file(str(tmp_path / "w"), BUCKET, "mp/v1/w.safetensors", Config=parts)
    etag = seaweed.head_object(Bucket=BUCKET, Key="mp/v1/w.safetensors")["ETag"].strip('"')
    composite = hashlib.md5(
        b"".join(hashlib.md5(data[i : i + 5 * MiB]).digest() for i in range(0, len(data), 5 * MiB))
    ).hexdigest()
    assert etag == f"{composite}-3"  # the server computes it like S3
    version = make_version(make_model(team), worker_cache, artifact_uri=f"s3://{BUCKET}/mp/v1")

    source_file = open_source(version.artifact_uri).list_files()[0]
    assert (source_file.md5, source_file.md5_part_size) == (etag, 5 * MiB)
    assert services.materialize(version.pk) == "materialized"
    assert tree_files(version) == {"w.safetensors": data}


def test_a_multipart_object_whose_parts_do_not_match_its_etag_fails(
    worker_cache, seaweed, small_parts, team, release, monkeypatch
):
    """The composite check really runs: told a wrong first-part size, it cannot match."""
    data = blob(11 * MiB, 4)
    key = "mpbad/v1/w.safetensors"
    upload_id = seaweed.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    done = []
    for number, start in enumerate(range(0, len(data), 5 * MiB), start=1):
        part = seaweed.upload_part(
            Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=number,
            Body=data[start : start + 5 * MiB],
        )  # fmt: skip
        done.append({"PartNumber": number, "ETag": part["ETag"]})
    seaweed.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )
    version = make_version(make_model(team), worker_cache, artifact_uri=f"s3://{BUCKET}/mpbad/v1")
    describe = s3_source.S3Source._describe

    def wrong_part_size(self, key, rel, size):
        return dataclasses.replace(describe(self, key, rel, size), md5_part_size=4 * MiB)

    monkeypatch.setattr(s3_source.S3Source, "_describe", wrong_part_size)

    assert services.materialize(version.pk) == "failed"
    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert "w.safetensors" in version.failure_reason
    assert not weights_dir(version).exists()


def test_an_object_replaced_after_listing_gets_412_and_fails_the_version(
    worker_cache, seaweed, small_parts, get_calls, team, release, settings, monkeypatch
):
    """Deterministic: the object is replaced once the first range is in, so the next ranged
    GET's If-Match names a stale ETag and the server (not the client) refuses it."""
    settings.MODEL_CACHE_PARALLELISM = 1
    key = "chg/v1/w.safetensors"
    old, new = blob(6 * MiB, 5), blob(6 * MiB, 6)
    uri = upload(seaweed, "chg/v1", {"w.safetensors": old})
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)
    fetch_range = s3_source.S3Source._fetch_range

    def replace_after_first(self, file, fd, index, *args, **kwargs):
        fetch_range(self, file, fd, index, *args, **kwargs)
        if index == 0:
            seaweed.put_object(Bucket=BUCKET, Key=key, Body=new)

    monkeypatch.setattr(s3_source.S3Source, "_fetch_range", replace_after_first)

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert f"s3://{BUCKET}/{key} changed while it was being copied" in version.failure_reason
    assert not weights_dir(version).exists()
    assert Materialization.objects.get(version=version).state == CopyState.FAILED
    statuses = [c["status"] for c in get_calls]
    assert statuses[0] == 206 and statuses[-1] == 412
    assert not ContentStore(worker_cache).blob_path(hashlib.sha256(old).hexdigest()).exists()
    assert not ContentStore(worker_cache).blob_path(hashlib.sha256(new).hexdigest()).exists()


def test_a_sha256_metadata_mismatch_fails_and_publishes_nothing(
    worker_cache, seaweed, small_parts, team, release
):
    data = blob(3 * MiB, 7)
    uri = upload(seaweed, "bad/v1", {"w.safetensors": data}, Metadata={"sha256": "ab" * 32})
    head = seaweed.head_object(Bucket=BUCKET, Key="bad/v1/w.safetensors")
    assert head["Metadata"] == {"sha256": "ab" * 32}  # kept by the server
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    assert version.state == VersionState.FAILED
    assert "Checksum mismatch for w.safetensors" in version.failure_reason
    assert "Nothing was published" in version.failure_reason
    assert not weights_dir(version).exists()
    assert not ContentStore(worker_cache).blob_path(hashlib.sha256(data).hexdigest()).exists()


def test_unknown_credentials_are_refused_and_explained(
    worker_cache, seaweed, team, release, monkeypatch
):
    uri = upload(seaweed, "auth/v1", {"config.json": b"{}"})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-a-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    version = make_version(make_model(team), worker_cache, artifact_uri=uri)

    assert services.materialize(version.pk) == "failed"

    version.refresh_from_db()
    assert version.failure_reason.startswith(f"Access denied to s3://{BUCKET}/auth/")
