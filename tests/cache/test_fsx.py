"""FSx for Lustre linking and preloading, at the API boundary.

moto does not implement data repository associations or tasks, so the FSx calls go to a real
boto3 client under botocore's ``Stubber``, which checks every request against the FSx service
model. ``lfs`` is a stand-in script that records its arguments and remembers which files it was
asked to restore.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from portal.cache import fsx

FS = "fs-0123456789abcdef0"
FS_PATH = "/models/llama"
S3_URI = "s3://weights/llama/"
NOW = datetime(2024, 1, 1, tzinfo=UTC)
DRA = "dra-0123456789abcdef0"
TASK = "task-0123456789abcdef0"
FILTER = {"Filters": [{"Name": "file-system-id", "Values": [FS]}]}

FAKE_LFS = """\
#!{python}
import json, pathlib, sys
state = pathlib.Path({state!r})
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
command, paths = sys.argv[1], sys.argv[2:]
marker = lambda p: state / ("restored-" + p.replace("/", "_"))
if any(p.endswith("broken") for p in paths):
    sys.exit("cannot stat " + paths[0])
for p in paths:
    if command == "hsm_restore":
        marker(p).touch()
    else:
        print(p + ": " + ("NOOP" if marker(p).exists() else "RESTORE running (0 bytes moved)"))
"""


class Clock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def polling(self, timeout: float = 3600, interval: float = 15) -> fsx.Polling:
        return fsx.Polling(timeout=timeout, interval=interval, sleep=self.sleep, clock=self)


@pytest.fixture
def client():
    c = boto3.client(
        "fsx", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(c) as stubber:
        yield c, stubber
        stubber.assert_no_pending_responses()


@pytest.fixture
def lfs(tmp_path):
    state = tmp_path / "lfs-state"
    state.mkdir()
    script = tmp_path / "lfs"
    script.write_text(FAKE_LFS.format(python=sys.executable, state=str(state)))
    script.chmod(0o755)
    return script


def calls(lfs: Path) -> list[list[str]]:
    log = lfs.parent / "lfs-state" / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def association(lifecycle: str, **extra):
    return {"AssociationId": DRA, "Lifecycle": lifecycle, **extra}


def task(lifecycle: str, **extra):
    return {
        "TaskId": TASK,
        "Lifecycle": lifecycle,
        "Type": "IMPORT_METADATA_FROM_REPOSITORY",
        "CreationTime": NOW,
        **extra,
    }


def stub_association_created(stubber: Stubber) -> None:
    stubber.add_response("describe_data_repository_associations", {"Associations": []}, FILTER)
    stubber.add_response(
        "create_data_repository_association",
        {"Association": association("CREATING")},
        {
            "FileSystemId": FS,
            "FileSystemPath": FS_PATH,
            "DataRepositoryPath": S3_URI,
            "BatchImportMetaDataOnCreate": True,
            "ImportedFileChunkSize": 1024,
            "S3": {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
            "ClientRequestToken": fsx.request_token("dra", FS, FS_PATH, S3_URI),
        },
    )
    for lifecycle in ("CREATING", "AVAILABLE"):
        stubber.add_response(
            "describe_data_repository_associations",
            {"Associations": [association(lifecycle)]},
            {"AssociationIds": [DRA]},
        )


def stub_import(stubber: Stubber, *lifecycles: str, salt: str = "", **extra) -> None:
    stubber.add_response(
        "create_data_repository_task",
        {"DataRepositoryTask": task("PENDING")},
        {
            "Type": "IMPORT_METADATA_FROM_REPOSITORY",
            "FileSystemId": FS,
            "Paths": [S3_URI],
            "Report": {"Enabled": False},
            "ClientRequestToken": fsx.request_token("import", FS, S3_URI, salt),
        },
    )
    for lifecycle in lifecycles:
        stubber.add_response(
            "describe_data_repository_tasks",
            {"DataRepositoryTasks": [task(lifecycle, **extra)]},
            {"TaskIds": [TASK]},
        )


def test_request_token_is_deterministic_and_fits_fsx():
    token = fsx.request_token("import", FS, S3_URI, "")
    assert token == fsx.request_token("import", FS, S3_URI, "")
    assert token != fsx.request_token("import", FS, S3_URI, "v2")
    assert len(token) <= 63


def test_creates_association_and_waits_until_available(client):
    c, stubber = client
    clock = Clock()
    stub_association_created(stubber)
    got = fsx.ensure_association(
        c,
        file_system_id=FS,
        file_system_path=FS_PATH + "/",  # normalised to the form sent above
        s3_uri=S3_URI.rstrip("/"),
        poll=clock.polling(interval=5),
    )
    assert got == DRA
    assert clock.sleeps == [5]


def test_reuses_existing_association_without_creating(client):
    c, stubber = client
    existing = association("AVAILABLE", FileSystemPath=FS_PATH, DataRepositoryPath=S3_URI)
    other = {
        "AssociationId": "dra-0000000000000000a",
        "Lifecycle": "AVAILABLE",
        "FileSystemPath": "/models/other",
        "DataRepositoryPath": "s3://weights/other/",
    }
    stubber.add_response(
        "describe_data_repository_associations",
        {"Associations": [other], "NextToken": "cGFnZTI="},
        FILTER,
    )
    stubber.add_response(
        "describe_data_repository_associations",
        {"Associations": [existing]},
        {**FILTER, "NextToken": "cGFnZTI="},
    )
    stubber.add_response(
        "describe_data_repository_associations",
        {"Associations": [existing]},
        {"AssociationIds": [DRA]},
    )
    # No create response is queued: a create call would fail the test.
    got = fsx.ensure_association(c, file_system_id=FS, file_system_path=FS_PATH, s3_uri=S3_URI)
    assert got == DRA


def test_overlapping_path_is_refused_before_creating(client):
    c, stubber = client
    taken = association("AVAILABLE", FileSystemPath="/models", DataRepositoryPath="s3://x/")
    stubber.add_response("describe_data_repository_associations", {"Associations": [taken]}, FILTER)
    with pytest.raises(fsx.FsxError, match="overlaps /models"):
        fsx.ensure_association(c, file_system_id=FS, file_system_path=FS_PATH, s3_uri=S3_URI)


def test_failed_association_raises_with_fsx_message(client):
    c, stubber = client
    broken = association(
        "MISCONFIGURED",
        FileSystemPath=FS_PATH,
        DataRepositoryPath=S3_URI,
        FailureDetails={"Message": "Access denied to bucket weights"},
    )
    stubber.add_response(
        "describe_data_repository_associations", {"Associations": [broken]}, FILTER
    )
    stubber.add_response(
        "describe_data_repository_associations",
        {"Associations": [broken]},
        {"AssociationIds": [DRA]},
    )
    with pytest.raises(fsx.FsxError, match="MISCONFIGURED: Access denied to bucket weights"):
        fsx.ensure_association(c, file_system_id=FS, file_system_path=FS_PATH, s3_uri=S3_URI)


def test_import_waits_through_executing_until_succeeded(client):
    c, stubber = client
    clock = Clock()
    stub_import(stubber, "PENDING", "EXECUTING", "SUCCEEDED", salt="v7")
    got = fsx.import_metadata(
        c, file_system_id=FS, s3_uri=S3_URI, token_salt="v7", poll=clock.polling()
    )
    assert got == TASK
    assert len(clock.sleeps) == 2


def test_failed_import_raises_with_fsx_message(client):
    c, stubber = client
    stub_import(stubber, "FAILED", FailureDetails={"Message": "Path s3://weights/llama/ not found"})
    with pytest.raises(fsx.FsxError, match="FAILED: Path s3://weights/llama/ not found"):
        fsx.import_metadata(c, file_system_id=FS, s3_uri=S3_URI, poll=Clock().polling())


def test_import_times_out(client):
    c, stubber = client
    clock = Clock()
    stub_import(stubber, "EXECUTING", "EXECUTING", "EXECUTING")
    with pytest.raises(fsx.FsxError, match="still EXECUTING after 30s"):
        fsx.import_metadata(
            c,
            file_system_id=FS,
            s3_uri=S3_URI,
            poll=clock.polling(timeout=30, interval=15),
        )


def test_restore_is_batched(lfs, tmp_path):
    paths = [tmp_path / f"shard-{i:04d}" for i in range(2500)]
    fsx.restore_files(paths, lfs=str(lfs), batch=1000)
    invocations = calls(lfs)
    assert [len(args) - 1 for args in invocations] == [1000, 1000, 500]
    assert all(args[0] == "hsm_restore" for args in invocations)
    assert [p for args in invocations for p in args[1:]] == [str(p) for p in paths]


def test_pending_lists_files_not_yet_noop(lfs, tmp_path):
    done, waiting = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    fsx.restore_files([done], lfs=str(lfs))
    assert fsx.pending_restores([done, waiting], lfs=str(lfs)) == [waiting]
    assert calls(lfs)[-2:] == [["hsm_action", str(done)], ["hsm_action", str(waiting)]]


def test_wait_restored_returns_once_all_are_noop(lfs, tmp_path):
    paths = [tmp_path / "a", tmp_path / "b"]
    clock = Clock()

    def sleep(seconds: float) -> None:  # the restore lands while the caller waits
        clock.sleep(seconds)
        fsx.restore_files(paths[len(clock.sleeps) - 1 :][:1], lfs=str(lfs))

    fsx.wait_restored(paths, timeout=60, interval=2, lfs=str(lfs), sleep=sleep, clock=clock)
    assert clock.sleeps == [2, 2]
    # Files already loaded are not asked about again.
    actions = [args[1] for args in calls(lfs) if args[0] == "hsm_action"]
    assert actions == [str(paths[0]), str(paths[1]), str(paths[0]), str(paths[1]), str(paths[1])]


def test_wait_restored_times_out(lfs, tmp_path):
    clock = Clock()
    with pytest.raises(fsx.FsxError, match="1 files not restored after 10s"):
        fsx.wait_restored(
            [tmp_path / "never"],
            timeout=10,
            interval=4,
            lfs=str(lfs),
            sleep=clock.sleep,
            clock=clock,
        )


def test_lfs_failure_and_missing_client_raise(lfs, tmp_path):
    with pytest.raises(fsx.FsxError, match=r"hsm_restore failed.*cannot stat"):
        fsx.restore_files([tmp_path / "broken"], lfs=str(lfs))
    with pytest.raises(fsx.FsxError, match="Cannot run"):
        fsx.pending_restores([tmp_path / "x"], lfs=str(tmp_path / "no-such-lfs"))


def test_link_and_preload_end_to_end(client, lfs, tmp_path):
    c, stubber = client
    mount = tmp_path / "fsx"
    weights = mount / "models" / "llama"
    (weights / "sub").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "sub/tokenizer.json"):
        (weights / name).write_text("{}")
    stub_association_created(stubber)
    stub_import(stubber, "EXECUTING", "SUCCEEDED")

    got = fsx.link_and_preload(
        c,
        file_system_id=FS,
        file_system_path=FS_PATH,
        s3_uri=S3_URI,
        mount_point=mount,
        lfs=str(lfs),
        poll=Clock().polling(),
    )
    assert got == weights
    restored = [args for args in calls(lfs) if args[0] == "hsm_restore"]
    assert restored == [
        [
            "hsm_restore",
            str(weights / "config.json"),
            str(weights / "model.safetensors"),
            str(weights / "sub/tokenizer.json"),
        ]
    ]


def test_link_and_preload_requires_the_mount(client, tmp_path):
    c, stubber = client
    stub_association_created(stubber)
    stub_import(stubber, "SUCCEEDED")
    with pytest.raises(fsx.FsxError, match="is the file system mounted"):
        fsx.link_and_preload(
            c,
            file_system_id=FS,
            file_system_path=FS_PATH,
            s3_uri=S3_URI,
            mount_point=tmp_path / "not-mounted",
            poll=Clock().polling(),
        )
