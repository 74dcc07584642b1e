"""Removing staging areas nobody will resume.

A failed copy keeps ``staging/version-<id>/`` so that a retry resumes it; a version that is never
retried, or is deleted, would keep it forever. Beat runs :func:`clean_up_staging` hourly. It
removes the area of a version that no longer exists, and of one whose copy failed more than
``MODEL_CACHE_STAGING_GRACE_SECONDS`` ago and was not retried since; and any other directory in
``staging/`` untouched for that long. Until then, the admin shows those partial downloads.

Never an area a copy is using: each removal holds the copy's own Redis lease (skipped when a
worker has it) and looks at the version again under it. Removal is one rename into the store's
trash, then the delete, so a run killed midway leaves nothing a copy would resume from, and the
next run finishes the delete. Blobs only a removed area linked are then unreferenced, and this
run's garbage collection frees them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from portal.cache.models import CopyState, Materialization
from portal.cache.services import content_store, copy_lease, staging_key
from portal.cache.store import ContentStore
from portal.registry.models import ModelVersion, VersionState

log = logging.getLogger(__name__)

_VERSION_AREA = re.compile(r"^version-(\d+)$")
#: A retry sends the version back to ``registered``: its copy is about to resume the area.
_RETRYING = (VersionState.REGISTERED, VersionState.MATERIALIZING)


@dataclass(frozen=True)
class TreeSize:
    total_bytes: int  # every file in it
    own_bytes: int  # files linked nowhere else: freed by deleting the tree itself


@dataclass(frozen=True)
class RemovedArea:
    key: str  # the directory's name under staging/
    reason: str
    total_bytes: int


@dataclass
class CleanupReport:
    removed: list[RemovedArea] = field(default_factory=list)
    #: Areas that qualified but whose copy lease a worker held.
    busy: list[str] = field(default_factory=list)
    #: Trash entries a killed earlier removal left, deleted now.
    leftovers: int = 0
    #: Bytes deleted with the areas themselves (partial files linked nowhere else).
    staging_bytes_freed: int = 0
    #: Bytes of blobs garbage collection freed afterwards (files the areas had verified).
    blob_bytes_freed: int = 0

    @property
    def freed_bytes(self) -> int:
        return self.staging_bytes_freed + self.blob_bytes_freed

    def as_dict(self) -> dict[str, object]:
        return {
            "removed": [area.key for area in self.removed],
            "busy": self.busy,
            "leftovers": self.leftovers,
            "freed_bytes": self.freed_bytes,
        }


def grace() -> timedelta:
    return timedelta(seconds=settings.MODEL_CACHE_STAGING_GRACE_SECONDS)


def tree_size(path: Path) -> TreeSize:
    total = own = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            total += st.st_size
            if st.st_nlink <= 1:
                own += st.st_size
    return TreeSize(total, own)


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    for dirpath, dirs, names in os.walk(path):
        for name in (*dirs, *names):
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except FileNotFoundError:
                continue
    return newest


def _why_remove_version_area(version_id: int, cutoff: datetime) -> str | None:
    """Why the area of ``version_id`` may go, or None while a copy may still resume it."""
    state = ModelVersion.objects.filter(pk=version_id).values_list("state", flat=True).first()
    if state is None:
        return "the version was deleted"
    if state in _RETRYING:
        return None
    record = (
        Materialization.objects.filter(version_id=version_id).values("state", "finished_at").first()
    )
    if record is None or record["state"] != CopyState.FAILED:
        return None  # pending, copying, present or evicted: not an abandoned copy
    finished_at = record["finished_at"]
    if finished_at is None or finished_at >= cutoff:
        return None
    return f"the copy failed at {finished_at:%Y-%m-%d %H:%M} UTC and was not retried"


def _delete(doomed: Path) -> int:
    """Delete a tree already in trash; returns the bytes that went with it."""
    freed = tree_size(doomed).own_bytes
    shutil.rmtree(doomed, ignore_errors=True)
    return freed


def _remove(cache: ContentStore, key: str, reason: str, report: CleanupReport) -> None:
    staging = cache.staging(key)
    size = tree_size(staging.path)
    doomed = staging.retire()
    if doomed is None:
        return  # gone meanwhile
    report.staging_bytes_freed += _delete(doomed)
    report.removed.append(RemovedArea(key, reason, size.total_bytes))
    log.info("removed model cache staging area %s (%s bytes): %s", key, size.total_bytes, reason)


def clean_up_staging(now: datetime | None = None) -> CleanupReport:
    """Remove the staging areas no copy will resume (see the module's docstring)."""
    now = timezone.now() if now is None else now
    cutoff = now - grace()
    cache = content_store()
    report = CleanupReport()

    # A removal killed after its rename: the tree is out of service, only the delete is left.
    for leftover in cache.trash_leftovers():
        report.staging_bytes_freed += _delete(leftover)
        report.leftovers += 1

    try:
        entries = sorted(os.scandir(cache.staging_root), key=lambda entry: entry.name)
    except FileNotFoundError:
        entries = []
    for entry in entries:
        match = _VERSION_AREA.match(entry.name)
        if match is None:
            # Not a name any copy uses: it goes once nothing has touched it for the grace period.
            path = Path(entry.path)
            try:
                idle = now.timestamp() - _newest_mtime(path)
            except FileNotFoundError:
                continue
            if idle > grace().total_seconds():
                _remove(cache, entry.name, "an unknown staging area, untouched since", report)
            continue
        version_id = int(match.group(1))
        if _why_remove_version_area(version_id, cutoff) is None:
            continue
        lease = copy_lease(version_id)
        if not lease.acquire():
            report.busy.append(entry.name)  # a retry is copying it right now
            continue
        try:
            reason = _why_remove_version_area(version_id, cutoff)  # again, now nobody copies
            if reason is not None:
                _remove(cache, entry.name, reason, report)
        finally:
            lease.release()

    if report.removed or report.leftovers:
        report.blob_bytes_freed = cache.collect_garbage()
    if report.removed or report.leftovers or report.busy:
        log.info(
            "model cache staging clean-up: removed %s, busy %s, %s leftovers; freed %s bytes "
            "(%s partial, %s in blobs)",
            [area.key for area in report.removed],
            report.busy,
            report.leftovers,
            report.freed_bytes,
            report.staging_bytes_freed,
            report.blob_bytes_freed,
        )
    return report


# --- for the admin ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PartialDownload:
    record: Materialization
    total_bytes: int
    #: When the clean-up may remove it (the next hourly run after this); None while retrying.
    remove_after: datetime | None


def partial_downloads(limit: int = 50) -> list[PartialDownload]:
    """Failed copies whose staging area still holds files, most recent failure first."""
    cache = content_store()
    records = (
        Materialization.objects.filter(state=CopyState.FAILED)
        .select_related("version__model__team")
        .order_by("-finished_at")[:limit]
    )
    found = []
    for record in records:
        path = cache.staging(staging_key(record.version_id)).path
        if not path.is_dir():
            continue
        size = tree_size(path)
        retrying = record.version.state in _RETRYING
        remove_after = None if retrying or record.finished_at is None else record.finished_at
        if remove_after is not None:
            remove_after += grace()
        found.append(PartialDownload(record, size.total_bytes, remove_after))
    return found
