"""Materializing an ``s3://`` version through FSx for Lustre instead of through a worker.

When ``MODEL_CACHE_FSX_FILE_SYSTEM_ID`` is set, the cache root lives on that file system and an
operator has linked the artifact's bucket to it with a data repository association (DRA). Then
the bytes never pass through a Celery worker: an ``IMPORT_METADATA_FROM_REPOSITORY`` task makes
the version's objects appear as (released) files under the association's directory, ``lfs
hsm_restore`` has the file system fetch their contents from S3, and each restored file is moved
(one ``rename`` on the same file system) into the version's staging tree. From there the
materializer does what it does for every source: verify sha256 and the ETag, link into the blob
store, publish with one rename. Progress, the lease, resume after a killed worker and eviction are
therefore the same as in copy mode.

Why move and not hard-link the restored file: a link left in the association's directory would
keep every blob's link count above one, so garbage collection (which counts links) could never
free a version's bytes. Moving is safe only while FSx never writes back to the bucket, so an
association with auto-export is refused: the cache moving files out would delete the objects.

Asked for FSx, a version is never silently copied through the worker instead: a bucket without an
association, an association on another prefix, a file system that is not AVAILABLE, a missing or
failing ``lfs`` each fail the version with the reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from portal.cache import fsx
from portal.cache.progress import Progress
from portal.cache.sources import CopyOptions, Source, SourceFile, open_source
from portal.cache.sources.s3 import S3Source
from portal.cache.store import Staging


@dataclass(frozen=True)
class FsxConfig:
    file_system_id: str
    mount: Path
    cache_root: Path
    #: Buckets served through FSx; empty: all of them.
    buckets: tuple[str, ...] = ()
    lfs: str = "lfs"
    timeout: float = 7200.0
    interval: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def from_settings(cls) -> FsxConfig | None:
        if not settings.MODEL_CACHE_FSX_FILE_SYSTEM_ID:
            return None
        return cls(
            file_system_id=settings.MODEL_CACHE_FSX_FILE_SYSTEM_ID,
            mount=Path(settings.MODEL_CACHE_FSX_MOUNT),
            cache_root=Path(settings.MODEL_CACHE_ROOT),
            buckets=tuple(settings.MODEL_CACHE_FSX_BUCKETS),
            lfs=settings.MODEL_CACHE_FSX_LFS,
            timeout=settings.MODEL_CACHE_FSX_TIMEOUT_SECONDS,
            interval=settings.MODEL_CACHE_FSX_POLL_SECONDS,
        )

    def serves(self, uri: str) -> bool:
        parts = urlsplit(uri)
        if parts.scheme.lower() != "s3":
            return False
        return not self.buckets or parts.netloc in self.buckets

    @property
    def polling(self) -> fsx.Polling:
        return fsx.Polling(self.timeout, self.interval, self.sleep, self.clock)


def fsx_client() -> Any:
    """The FSx API client; region and credentials come from the environment as for S3."""
    return boto3.client("fsx")


def copied_through(uri: str) -> str:
    """What the version page and API say carries the bytes: an FSx file system or a worker."""
    config = FsxConfig.from_settings()
    if config is not None and config.serves(uri):
        return f"FSx file system {config.file_system_id}"
    return "a worker's copy"


def open_version_source(uri: str, attempt_key: str) -> Source:
    """The source a version's copy reads: FSx for an ``s3://`` URI in a bucket FSx serves,
    otherwise the URI's own source. ``attempt_key`` makes each attempt's import task new."""
    config = FsxConfig.from_settings()
    if config is not None and config.serves(uri):
        s3 = open_source(uri)
        assert isinstance(s3, S3Source)
        return FsxSource(s3, fsx_client(), config, attempt_key)
    return open_source(uri)


@dataclass(frozen=True)
class LinkedPrefix:
    association_id: str
    #: Where the version's prefix appears on this host: mount + association path + rest.
    directory: Path


def locate(client: Any, config: FsxConfig, s3_uri: str) -> LinkedPrefix:
    """Check the file system and find the association that links ``s3_uri``'s prefix."""
    fs_id = config.file_system_id
    try:
        systems = client.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"]
    except ClientError as exc:
        raise fsx.FsxError(f"FSx file system {fs_id}: {_aws_message(exc)}") from exc
    lifecycle = systems[0].get("Lifecycle") if systems else "missing"
    if lifecycle != "AVAILABLE":
        raise fsx.FsxError(
            f"FSx file system {fs_id} is {lifecycle}, not AVAILABLE; the copy waits for it: "
            "retry the version once the file system is available."
        )
    parts = urlsplit(s3_uri)
    bucket, key_prefix = parts.netloc, unquote(parts.path).strip("/")
    wanted = f"s3://{bucket}/{key_prefix}/" if key_prefix else f"s3://{bucket}/"
    on_bucket = [
        a
        for a in _associations(client, fs_id)
        if urlsplit(a.get("DataRepositoryPath", "")).netloc == bucket
    ]
    if not on_bucket:
        raise fsx.FsxError(
            f"No data repository association on FSx file system {fs_id} links bucket "
            f"{bucket!r}; an operator must link s3://{bucket}/ (or a prefix holding "
            f"{s3_uri}) to the file system first."
        )
    covering = [a for a in on_bucket if wanted.startswith(_prefix(a["DataRepositoryPath"]))]
    if not covering:
        linked = ", ".join(sorted(_prefix(a["DataRepositoryPath"]) for a in on_bucket))
        raise fsx.FsxError(
            f"{s3_uri} is outside every association of bucket {bucket!r} on {fs_id} "
            f"(linked: {linked}); link its prefix too."
        )
    association = max(covering, key=lambda a: len(_prefix(a["DataRepositoryPath"])))
    association_id = association.get("AssociationId", "?")
    if association.get("Lifecycle") != "AVAILABLE":
        reason = association.get("FailureDetails", {}).get("Message", "")
        raise fsx.FsxError(
            f"Association {association_id} ({association['DataRepositoryPath']}) is "
            f"{association.get('Lifecycle')}, not AVAILABLE{': ' + reason if reason else ''}."
        )
    export = association.get("S3", {}).get("AutoExportPolicy", {}).get("Events", [])
    if export:
        raise fsx.FsxError(
            f"Association {association_id} exports changes back to S3 ({', '.join(export)}); "
            "the cache moves restored files out of the linked directory, which would delete "
            "the artifact's objects. Use an association without auto-export for model weights."
        )
    rest = wanted[len(_prefix(association["DataRepositoryPath"])) :]
    fs_path = association.get("FileSystemPath", "/").strip("/")
    directory = config.mount / fs_path / rest
    _check_same_file_system(config, directory)
    return LinkedPrefix(association_id, directory)


def _associations(client: Any, fs_id: str) -> list[dict[str, Any]]:
    try:
        return fsx.list_associations(client, fs_id)
    except ClientError as exc:
        raise fsx.FsxError(f"Cannot list the associations of {fs_id}: {_aws_message(exc)}") from exc


def _prefix(data_repository_path: str) -> str:
    return data_repository_path.rstrip("/") + "/"


def _aws_message(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    return f"{error.get('Code', 'error')}: {error.get('Message', str(exc))}"


def _check_same_file_system(config: FsxConfig, directory: Path) -> None:
    """Restored files reach the cache by ``rename``: the cache root must be on the mount."""
    try:
        mount_dev = os.stat(config.mount).st_dev
    except FileNotFoundError as exc:
        raise fsx.FsxError(
            f"{config.mount} does not exist: is the FSx file system mounted on this worker?"
        ) from exc
    config.cache_root.mkdir(parents=True, exist_ok=True)
    if os.stat(config.cache_root).st_dev != mount_dev:
        raise fsx.FsxError(
            f"The model cache root {config.cache_root} is not on the FSx file system mounted "
            f"at {config.mount}; set MODEL_CACHE_ROOT to a directory on it."
        )


class FsxSource(Source):
    """An S3 version whose bytes the file system restores itself. Listing and checksums come
    from S3 (the same as in copy mode); the bytes from the association's directory."""

    def __init__(self, s3: S3Source, client: Any, config: FsxConfig, attempt_key: str) -> None:
        self.uri = s3.uri
        self.s3 = s3
        self.client = client
        self.config = config
        self.attempt_key = attempt_key
        self.linked: LinkedPrefix | None = None

    @property
    def manifest_extra(self) -> dict[str, Any]:
        if self.linked is None:
            return {}
        return {
            "fsx": {
                "file_system_id": self.config.file_system_id,
                "association_id": self.linked.association_id,
            }
        }

    def list_files(self) -> list[SourceFile]:
        self.linked = locate(self.client, self.config, self.uri)
        try:
            fsx.import_metadata(
                self.client,
                file_system_id=self.config.file_system_id,
                s3_uri=self.uri,
                token_salt=self.attempt_key,
                poll=self.config.polling,
            )
        except (ClientError, BotoCoreError) as exc:
            raise fsx.FsxError(f"Cannot import {self.uri} into FSx: {exc}") from exc
        return self.s3.list_files()

    def local(self, file: SourceFile) -> Path:
        assert self.linked is not None, "list_files first"
        return self.linked.directory / file.path

    def prefetch(self, files: list[SourceFile], staging: Staging) -> None:
        """Ask for every file still to restore at once: the file system restores them in
        parallel while the materializer verifies them one by one."""
        todo = []
        for file in files:
            if _moved_already(file, staging):
                continue
            local = self.local(file)
            try:
                size = local.stat().st_size
            except FileNotFoundError:
                raise fsx.FsxError(
                    f"{file.path} of {self.uri} is not on the file system at {local} after the "
                    "import; check the association's directory and the import task."
                ) from None
            if size != file.size:
                raise fsx.FsxError(
                    f"{local} has {size} bytes on the file system and {file.size} in S3: the "
                    "imported file is stale; retry once the association has imported it."
                )
            todo.append(local)
        fsx.restore_files(todo, self.config.lfs)

    def fetch(
        self, file: SourceFile, staging: Staging, progress: Progress, options: CopyOptions
    ) -> str | None:
        dest = staging.file(file.path)
        if _moved_already(file, staging):
            progress.add(file.size, fetched=False)
            return None
        local = self.local(file)
        self._wait_restored(file, local, progress)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(local, dest)
        return None  # the materializer hashes the moved file

    def _wait_restored(self, file: SourceFile, local: Path, progress: Progress) -> None:
        """Wait for ``lfs hsm_action`` to go idle, counting the bytes the file system has
        written so far (allocated blocks) as progress."""
        config = self.config
        deadline = config.clock() + config.timeout
        counted = 0
        while True:
            idle = "NOOP" in fsx.run_lfs([config.lfs, "hsm_action", str(local)])
            restored = min(file.size, local.stat().st_blocks * 512)
            if restored > counted:
                progress.add(restored - counted)
                counted = restored
            if idle:
                break
            if config.clock() >= deadline:
                raise fsx.FsxError(
                    f"Restoring {file.path} from {self.uri} took longer than "
                    f"{config.timeout:.0f}s ({counted} of {file.size} bytes)."
                )
            config.sleep(config.interval)
        state = fsx.run_lfs([config.lfs, "hsm_state", str(local)])
        if "released" in state.split(":", 1)[-1]:
            progress.undo(counted)
            raise fsx.FsxError(
                f"Restoring {file.path} from {self.uri} failed part-way ({counted} of "
                f"{file.size} bytes): lfs hsm_state says {state.strip()!r}. Nothing was "
                "published; retry the version."
            )
        progress.add(file.size - counted)


def _moved_already(file: SourceFile, staging: Staging) -> bool:
    """An earlier attempt moved this file into staging and was killed before verifying it."""
    if staging.part_journal(file.path).exists():
        return False  # a ranged copy's partial file, not a moved one
    try:
        return staging.file(file.path).stat().st_size == file.size
    except FileNotFoundError:
        return False
