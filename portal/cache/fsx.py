"""Serve weights from Amazon FSx for Lustre linked to S3, instead of copying them through a worker.

A data repository association (DRA) maps an S3 prefix onto a directory of the file system; an
``IMPORT_METADATA_FROM_REPOSITORY`` task makes the objects present there appear as files. That
imports names and sizes only: each file's bytes are fetched from S3 on its first read, which would
make a model's first load as slow as the S3 copy this path is meant to avoid. FSx has no "preload"
task, so contents are pulled in from a host that mounts the file system with ``lfs hsm_restore``
(asynchronous) and checked with ``lfs hsm_action`` until every file reports ``NOOP``.

Every step is idempotent, so a retried job finishes what an earlier attempt started: an existing
association for the same directory and prefix is reused, and request tokens are derived from the
inputs, so FSx answers a repeated create with the resource it already made.

Tested only at the API boundary: the FSx calls against botocore's ``Stubber`` (which checks
request shapes against the real service model) and the ``lfs`` calls against a stand-in script.
No FSx and no Lustre client exist on the dev machines. To run it for real, on an EC2 host with the
Lustre client, the file system mounted (``mount -t lustre <dns>@tcp:/<mountname> /fsx``) and
credentials allowing ``fsx:CreateDataRepositoryAssociation``, ``fsx:CreateDataRepositoryTask``,
``fsx:Describe*`` (plus the S3 and IAM permissions FSx needs to link the bucket)::

    link_and_preload(boto3.client("fsx"), file_system_id="fs-0123...",
                     file_system_path="/models/llama", s3_uri="s3://weights/llama/",
                     mount_point="/fsx")
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from portal.cache.sources import SourceError

#: A ``boto3.client("fsx")``; boto3 ships no static types for it.
FsxClient = Any
Runner = Callable[..., "subprocess.CompletedProcess[str]"]

#: FSx refuses a ninth association on a file system; saying so up front beats its generic error.
MAX_ASSOCIATIONS = 8
_BROKEN_ASSOCIATION = ("FAILED", "MISCONFIGURED")
_BROKEN_TASK = ("FAILED", "CANCELED")


class FsxError(SourceError):
    """Linking or preloading cannot go on; the message says what FSx or ``lfs`` reported. A
    source error: a version whose copy raises it fails with this message as the reason."""


@dataclass(frozen=True)
class Polling:
    """How long to wait for an FSx resource and how often to look: they settle in minutes.
    ``sleep`` and ``clock`` are parameters so tests need not wait."""

    timeout: float = 3600.0
    interval: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


def request_token(kind: str, *parts: str) -> str:
    """A ``ClientRequestToken`` that is the same for the same inputs, so a retried job gets the
    resource its earlier attempt created instead of a duplicate (FSx allows 63 characters)."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return f"{kind}-{digest[:40]}"


def _fs_path(path: str) -> str:
    if not path.startswith("/"):
        raise FsxError(f"File system path {path!r} must start with '/'.")
    return "/" + path.strip("/")


def _s3_path(uri: str) -> str:
    if not uri.startswith("s3://") or len(uri.rstrip("/")) <= len("s3://"):
        raise FsxError(f"{uri!r} is not an s3://bucket/prefix URI.")
    # The trailing slash keeps prefix "llama" from also matching "llama-2".
    return uri.rstrip("/") + "/"


def _overlaps(a: str, b: str) -> bool:
    return a == b or "/" in (a, b) or a.startswith(b + "/") or b.startswith(a + "/")


def _wait(
    describe: Callable[[], dict[str, Any]],
    what: str,
    done: str,
    broken: Sequence[str],
    poll: Polling,
) -> None:
    """Describe the resource until its ``Lifecycle`` is ``done``, failing fast when it broke."""
    deadline = poll.clock() + poll.timeout
    while True:
        resource = describe()
        lifecycle = resource["Lifecycle"]
        if lifecycle == done:
            return
        if lifecycle in broken:
            message = resource.get("FailureDetails", {}).get("Message", "no details given")
            raise FsxError(f"{what} is {lifecycle}: {message}")
        if poll.clock() >= deadline:
            raise FsxError(f"{what} still {lifecycle} after {poll.timeout:.0f}s.")
        poll.sleep(poll.interval)


def list_associations(client: FsxClient, file_system_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"Filters": [{"Name": "file-system-id", "Values": [file_system_id]}]}
    while True:
        page = client.describe_data_repository_associations(**kwargs)
        found.extend(page.get("Associations", []))
        if not page.get("NextToken"):
            return found
        kwargs["NextToken"] = page["NextToken"]


def ensure_association(
    client: FsxClient,
    *,
    file_system_id: str,
    file_system_path: str,
    s3_uri: str,
    chunk_size_mib: int = 1024,
    poll: Polling = Polling(),
) -> str:
    """Link ``s3_uri`` to ``file_system_path`` (reusing a link that already exists) and wait
    until it is AVAILABLE; returns the association id. Auto-import keeps the directory in step
    with later uploads and deletions under the prefix."""
    fs_path, s3_path = _fs_path(file_system_path), _s3_path(s3_uri)
    existing = list_associations(client, file_system_id)
    for assoc in existing:
        theirs = _fs_path(assoc.get("FileSystemPath", "/"))
        same_target = _s3_path(assoc.get("DataRepositoryPath", "s3://?")) == s3_path
        if theirs == fs_path and same_target:
            association_id: str = assoc["AssociationId"]
            break
        if _overlaps(theirs, fs_path):
            raise FsxError(
                f"{fs_path} overlaps {theirs}, already linked to "
                f"{assoc.get('DataRepositoryPath')} ({assoc.get('AssociationId')})."
            )
    else:
        if len(existing) >= MAX_ASSOCIATIONS:
            raise FsxError(
                f"{file_system_id} already has {len(existing)} data repository "
                f"associations, the most FSx allows; remove one or use another file system."
            )
        created = client.create_data_repository_association(
            FileSystemId=file_system_id,
            FileSystemPath=fs_path,
            DataRepositoryPath=s3_path,
            BatchImportMetaDataOnCreate=True,
            ImportedFileChunkSize=chunk_size_mib,
            S3={"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}},
            ClientRequestToken=request_token("dra", file_system_id, fs_path, s3_path),
        )
        association_id = created["Association"]["AssociationId"]

    def describe() -> dict[str, Any]:
        reply = client.describe_data_repository_associations(AssociationIds=[association_id])
        return dict(reply["Associations"][0])

    _wait(describe, f"Association {association_id}", "AVAILABLE", _BROKEN_ASSOCIATION, poll)
    return association_id


def import_metadata(
    client: FsxClient,
    *,
    file_system_id: str,
    s3_uri: str,
    token_salt: str = "",
    poll: Polling = Polling(),
) -> str:
    """Import the objects under ``s3_uri`` as files and wait for the task; returns its id.
    Auto-import is event driven and lags; this makes sure the listing is complete before the
    files are restored. ``token_salt`` (a version id, say) lets a later import run afresh."""
    s3_path = _s3_path(s3_uri)
    created = client.create_data_repository_task(
        Type="IMPORT_METADATA_FROM_REPOSITORY",
        FileSystemId=file_system_id,
        Paths=[s3_path],
        Report={"Enabled": False},
        ClientRequestToken=request_token("import", file_system_id, s3_path, token_salt),
    )
    task_id: str = created["DataRepositoryTask"]["TaskId"]

    def describe() -> dict[str, Any]:
        return dict(
            client.describe_data_repository_tasks(TaskIds=[task_id])["DataRepositoryTasks"][0]
        )

    _wait(describe, f"Import task {task_id}", "SUCCEEDED", _BROKEN_TASK, poll)
    return task_id


def run_lfs(argv: list[str], run: Runner = subprocess.run) -> str:
    """Run one ``lfs`` command; its stdout, or :class:`FsxError` with what it printed."""
    try:
        done = run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:  # no Lustre client on this host
        raise FsxError(f"Cannot run {argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise FsxError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()}")
    return str(done.stdout)


def restore_files(
    paths: Iterable[Path | str], lfs: str = "lfs", batch: int = 1000, run: Runner = subprocess.run
) -> None:
    """Ask Lustre to fetch the files' contents from S3 now; returns before they arrive. Batched
    so thousands of files cost a handful of processes without exceeding the argument limit."""
    todo = [str(p) for p in paths]
    for start in range(0, len(todo), batch):
        run_lfs([lfs, "hsm_restore", *todo[start : start + batch]], run)


def pending_restores(
    paths: Iterable[Path | str], lfs: str = "lfs", run: Runner = subprocess.run
) -> list[Path]:
    """The files whose contents are not on the file system yet (``hsm_action`` is not NOOP).
    One call per file: the output is then unambiguous whatever the file names contain."""
    return [Path(p) for p in paths if "NOOP" not in run_lfs([lfs, "hsm_action", str(p)], run)]


def wait_restored(
    paths: Iterable[Path | str],
    timeout: float,
    interval: float = 10.0,
    lfs: str = "lfs",
    run: Runner = subprocess.run,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait until every file is loaded, re-checking only those still pending."""
    deadline = clock() + timeout
    pending = pending_restores(paths, lfs, run)
    while pending:
        if clock() >= deadline:
            sample = ", ".join(str(p) for p in pending[:3])
            raise FsxError(f"{len(pending)} files not restored after {timeout:.0f}s ({sample}…).")
        sleep(interval)
        pending = pending_restores(pending, lfs, run)


def link_and_preload(
    fsx_client: FsxClient,
    *,
    file_system_id: str,
    file_system_path: str,
    s3_uri: str,
    mount_point: Path | str,
    chunk_size_mib: int = 1024,
    token_salt: str = "",
    poll: Polling = Polling(),
    lfs: str = "lfs",
    batch: int = 1000,
    run: Runner = subprocess.run,
) -> Path:
    """Link, import, restore and wait; returns the directory under ``mount_point`` where the
    weights are, fully loaded. Must run on a host that mounts the file system there. Each of
    the three waits (link, import, restore) gets ``poll.timeout``."""
    ids = {"file_system_id": file_system_id, "s3_uri": s3_uri}
    ensure_association(
        fsx_client,
        **ids,
        file_system_path=file_system_path,
        chunk_size_mib=chunk_size_mib,
        poll=poll,
    )
    import_metadata(fsx_client, **ids, token_salt=token_salt, poll=poll)
    local = Path(mount_point) / _fs_path(file_system_path).lstrip("/")
    if not local.is_dir():
        raise FsxError(f"{local} does not exist: is the file system mounted at {mount_point}?")
    files = sorted(Path(root) / name for root, _, names in os.walk(local) for name in names)
    restore_files(files, lfs, batch, run)
    wait_restored(files, poll.timeout, poll.interval, lfs, run, poll.sleep, poll.clock)
    return local
