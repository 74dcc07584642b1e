"""The model cache on disk: content-addressed blobs, per-version trees of hard links to them, and
staging areas that make publishing atomic and copying resumable.

Layout under the cache root (an FSx for Lustre mount in production)::

    blobs/sha256/ab/abcdef…        every distinct file once, read-only
    models/<team>/<model>/<n>/…    a version's tree: hard links into blobs/, plus .materialized.json
    staging/<key>/files/…          a version being copied: partial files, then links into blobs/
    staging/<key>/ledger.jsonl     files already verified and linked, for resuming
    staging/<key>/parts/…          byte ranges already written, per partial file

Hard links make a blob's link count its reference count: a blob with one link belongs to no tree
(live or staging), so garbage collection deletes exactly those and never a file a version uses.
A version's tree appears by one ``rename`` of its finished staging tree, so a half-copied version
is never visible where instances look. Nothing here imports Django.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_NAME = ".materialized.json"


class UnsafePath(ValueError):
    """A source named a file outside the tree it is copied into."""


def safe_relpath(name: str) -> str:
    """``name`` as a relative POSIX path that stays inside its tree, or :class:`UnsafePath`.

    Sources are remote and untrusted: an S3 key or a listing can say ``../../etc/x`` or
    ``/abs``; neither may ever become a path on the cache volume.
    """
    if not name or "\x00" in name or "\\" in name:
        raise UnsafePath(f"{name!r} is not a usable file name.")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafePath(f"{name!r} is an absolute path.")
    parts = path.parts
    if any(part in ("..", ".") for part in name.split("/")) or not parts:
        raise UnsafePath(f"{name!r} leaves its directory ('..' or '.').")
    if any(part == "" for part in name.split("/")):
        raise UnsafePath(f"{name!r} has an empty path segment.")
    if parts[-1] == MANIFEST_NAME:
        raise UnsafePath(f"{name!r} is reserved for the cache's own manifest.")
    return str(path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LedgerEntry:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Usage:
    blob_count: int
    blob_bytes: int
    unreferenced_bytes: int
    staging_bytes: int


class ContentStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.staging_root = self.root / "staging"
        self.trash = self.root / "trash"

    # --- blobs ----------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256[:2] / sha256

    def has_blob(self, sha256: str, size: int) -> bool:
        try:
            return self.blob_path(sha256).stat().st_size == size
        except FileNotFoundError:
            return False

    def adopt(self, staged: Path, sha256: str) -> None:
        """Make ``staged`` (a verified file in a staging tree) share storage with blob ``sha256``.

        If the blob is new, the staged file becomes it; if it exists, the staged copy is
        replaced by a link to it, so identical files across versions are stored once.
        """
        blob = self.blob_path(sha256)
        blob.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(staged, 0o444)  # shared through hard links: nobody may write through one
        for _ in range(3):
            try:
                os.link(staged, blob)
                return
            except FileExistsError:
                pass
            if os.path.samefile(staged, blob):
                return
            tmp = staged.with_name(f".{staged.name}.{uuid.uuid4().hex}.link")
            try:
                os.link(blob, tmp)
            except FileNotFoundError:  # collected between our two calls: offer ours again
                continue
            os.replace(tmp, staged)
            return
        raise RuntimeError(f"could not link {staged} into the blob store")

    def link_existing(self, sha256: str, dest: Path) -> bool:
        """Put a link to an existing blob at ``dest``; False if the blob is gone."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.link")
        try:
            os.link(self.blob_path(sha256), tmp)
        except FileNotFoundError:
            return False
        os.replace(tmp, dest)
        return True

    # --- staging --------------------------------------------------------------------------

    def staging(self, key: str) -> Staging:
        return Staging(self, self.staging_root / key)

    # --- published trees ------------------------------------------------------------------

    def tree(self, relpath: str) -> Path:
        return self.root / relpath

    def manifest(self, relpath: str) -> dict[str, Any] | None:
        """The manifest of a published tree, or None when the tree is not (or not fully) there."""
        try:
            return json.loads((self.tree(relpath) / MANIFEST_NAME).read_text())
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
            return None

    def publish(self, staging: Staging, relpath: str, manifest: dict[str, Any]) -> bool:
        """Move a finished staging tree to ``relpath`` in one rename. False when another worker
        published it first (the staging copy is then discarded)."""
        files = staging.files
        files.mkdir(parents=True, exist_ok=True)
        (files / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        fsync_file(files / MANIFEST_NAME)
        fsync_dir(files)
        target = self.tree(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(files, target)
        except OSError:  # ENOTEMPTY / EEXIST: a tree is already there
            if self.manifest(relpath) is None:
                raise
            staging.discard()
            return False
        fsync_dir(target.parent)
        staging.discard()
        return True

    def remove_tree(self, relpath: str) -> bool:
        """Take a tree out of service at once (rename into trash), then delete it."""
        target = self.tree(relpath)
        if not target.exists():
            return False
        self.trash.mkdir(parents=True, exist_ok=True)
        doomed = self.trash / uuid.uuid4().hex
        os.rename(target, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def move_to_trash(self, path: Path) -> Path | None:
        """Take ``path`` out of service in one rename into trash; None when it is not there.
        The caller deletes what this returns; :meth:`trash_leftovers` lists what a killed
        caller did not get to."""
        self.trash.mkdir(parents=True, exist_ok=True)
        doomed = self.trash / uuid.uuid4().hex
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return None
        return doomed

    def trash_leftovers(self) -> list[Path]:
        """What is still in trash: only ever things already out of service, safe to delete."""
        try:
            return sorted(Path(entry.path) for entry in os.scandir(self.trash))
        except FileNotFoundError:
            return []

    # --- capacity -------------------------------------------------------------------------

    def iter_blobs(self) -> Iterator[os.stat_result]:
        if not self.blobs.exists():
            return
        for shard in os.scandir(self.blobs):
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard.path):
                yield entry.stat(follow_symlinks=False)

    def usage(self) -> Usage:
        count = total = unreferenced = 0
        for st in self.iter_blobs():
            count += 1
            total += st.st_size
            if st.st_nlink <= 1:
                unreferenced += st.st_size
        staging = 0
        if self.staging_root.exists():
            for dirpath, _dirs, names in os.walk(self.staging_root):
                for name in names:
                    st = os.lstat(os.path.join(dirpath, name))
                    if st.st_nlink <= 1:  # linked files are counted with the blobs
                        staging += st.st_size
        return Usage(count, total, unreferenced, staging)

    def collect_garbage(self) -> int:
        """Delete blobs no tree links to any more; returns the bytes freed."""
        freed = 0
        if not self.blobs.exists():
            return 0
        for shard in os.scandir(self.blobs):
            for entry in os.scandir(shard.path):
                st = entry.stat(follow_symlinks=False)
                if st.st_nlink <= 1:
                    os.unlink(entry.path)
                    freed += st.st_size
        return freed


class Staging:
    """One version's work area: partial files, the part journal and the ledger of verified files.

    Everything in it survives a killed worker, which is what makes the next attempt resume.
    """

    def __init__(self, store: ContentStore, path: Path) -> None:
        self.store = store
        self.path = path
        self.files = path / "files"
        self.parts = path / "parts"
        self.ledger_path = path / "ledger.jsonl"

    def file(self, relpath: str) -> Path:
        return self.files / relpath

    def part_journal(self, relpath: str) -> Path:
        return self.parts / (relpath + ".parts")

    def ledger(self) -> dict[str, LedgerEntry]:
        """Files verified and linked by earlier attempts whose links are still in place."""
        done: dict[str, LedgerEntry] = {}
        try:
            lines = self.ledger_path.read_text().splitlines()
        except FileNotFoundError:
            return done
        for line in lines:
            try:
                raw = json.loads(line)
                entry = LedgerEntry(raw["path"], raw["sha256"], int(raw["size"]))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line from a killed worker
            done[entry.path] = entry
        return {
            path: entry
            for path, entry in done.items()
            if self._linked(self.file(path), self.store.blob_path(entry.sha256))
        }

    @staticmethod
    def _linked(staged: Path, blob: Path) -> bool:
        try:
            return os.path.samefile(staged, blob)
        except FileNotFoundError:
            return False

    def record(self, entry: LedgerEntry) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        with self.ledger_path.open("a") as ledger:
            ledger.write(json.dumps(entry.__dict__) + "\n")

    def forget(self, relpath: str) -> None:
        """Drop a partial file and its journal (after a checksum mismatch, for instance)."""
        for path in (self.file(relpath), self.part_journal(relpath)):
            path.unlink(missing_ok=True)

    def discard(self) -> None:
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)

    def retire(self) -> Path | None:
        """Take the whole area out of service at once (a rename into the store's trash), so a
        removal killed midway leaves no half area a retry would resume from. Returns where it
        went, for the caller to delete; None when there was no area."""
        return self.store.move_to_trash(self.path)

    def keep_only_for(self, source: str) -> None:
        """Resume only copies of ``source``: a local source states no checksums, so a file an
        earlier attempt verified from another source (a retry with a corrected URI) would be
        taken as done by its path and size alone. Discards what another source left."""
        marker = self.path / "source"
        try:
            previous = marker.read_text()
        except FileNotFoundError:
            previous = None
        if previous is not None and previous != source:
            self.discard()
        if previous != source:
            self.path.mkdir(parents=True, exist_ok=True)
            marker.write_text(source)
