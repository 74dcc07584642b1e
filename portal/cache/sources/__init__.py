"""Where weights come from: ``s3://bucket/prefix``, ``hf://org/name@revision`` and
``file:///path`` under the configured roots, behind one small interface.

A source lists its files with whatever checksums it knows, and copies one file into a staging
tree, resuming what an earlier attempt left there when it can. Verification, deduplication and
publishing are the materializer's job, the same for every source.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from portal.cache import filecopy
from portal.cache.progress import Progress, Throttle
from portal.cache.store import Staging

CHUNK = 8 * 1024 * 1024


class SourceError(Exception):
    """The copy cannot go on; the message is the version's failure reason, so it says what to
    fix (a missing object, denied access, a changed file, a full disk)."""


@dataclass(frozen=True)
class SourceFile:
    #: Path inside the version's tree, already checked by ``safe_relpath``.
    path: str
    size: int
    #: Where the source finds it: an S3 key, an absolute local path.
    locator: str = ""
    sha256: str | None = None
    #: An S3 ETag that is an MD5: of the whole object, or (``<hex>-<parts>``) of the MD5s of
    #: its upload parts of ``md5_part_size`` bytes.
    md5: str | None = None
    md5_part_size: int = 0
    #: Git's blob id (``sha1("blob <size>\0" + content)``), what the Hub names small files by.
    git_sha1: str | None = None
    #: Source metadata worth recording in the manifest (an S3 ETag, for one).
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CopyOptions:
    parallelism: int = 8
    part_size: int = 8 * 1024 * 1024
    throttle: Throttle = field(default_factory=lambda: Throttle(0))


class Source(ABC):
    uri: str
    #: The exact revision copied (a Hub commit); blank where the source has none.
    revision: str = ""

    @abstractmethod
    def list_files(self) -> list[SourceFile]:
        """Every file to copy, with sizes and any checksums the source states."""

    def prefetch(self, files: list[SourceFile], staging: Staging) -> None:  # noqa: B027
        """Called once with the files about to be fetched, before the first ``fetch``: a
        source that can start them all at once (FSx restores) does so here."""

    @property
    def manifest_extra(self) -> dict[str, Any]:
        """What the manifest should record about how the version was copied."""
        return {}

    @abstractmethod
    def fetch(
        self, file: SourceFile, staging: Staging, progress: Progress, options: CopyOptions
    ) -> str | None:
        """Copy ``file`` to ``staging.file(file.path)``, resuming a partial copy where possible.

        Returns the file's sha256 when it was computed while streaming, else None (the caller
        hashes the finished file).
        """


def copy_file(src: str, dest: Path, progress: Progress, options: CopyOptions) -> str:
    """Copy a local file into a staging tree in one pass; returns its sha256."""
    return filecopy.copy_file(src, dest, progress, options.throttle)


@dataclass(frozen=True)
class FileDigests:
    sha256: str
    md5: str | None
    git_sha1: str | None


class ETagHasher:
    """The ETag S3 gives an object: the MD5 of its bytes, or for an object uploaded in parts of
    ``part_size`` bytes, the MD5 of the parts' MD5s followed by ``-<number of parts>``."""

    def __init__(self, part_size: int = 0) -> None:
        self.part_size = part_size
        self.whole = hashlib.md5(usedforsecurity=False)
        self.parts: list[bytes] = []
        self.part = hashlib.md5(usedforsecurity=False)
        self.in_part = 0

    def update(self, data: memoryview) -> None:
        if not self.part_size:
            self.whole.update(data)
            return
        while data:
            take = min(len(data), self.part_size - self.in_part)
            self.part.update(data[:take])
            self.in_part += take
            data = data[take:]
            if self.in_part == self.part_size:
                self.parts.append(self.part.digest())
                self.part = hashlib.md5(usedforsecurity=False)
                self.in_part = 0

    def hexdigest(self) -> str:
        if not self.part_size:
            return self.whole.hexdigest()
        parts = self.parts + ([self.part.digest()] if self.in_part else [])
        combined = hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest()
        return f"{combined}-{len(parts)}"


def digest_file(
    path: Path, *, md5: bool = False, md5_part_size: int = 0, git_sha1: bool = False
) -> FileDigests:
    """sha256 of a file, plus the other digests a source may have stated, in one read."""
    sha = hashlib.sha256()
    md = ETagHasher(md5_part_size) if md5 else None
    git = None
    if git_sha1:
        git = hashlib.sha1(usedforsecurity=False)
        git.update(b"blob %d\0" % path.stat().st_size)
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            chunk = view[:n]
            sha.update(chunk)
            if md is not None:
                md.update(chunk)
            if git is not None:
                git.update(chunk)
    return FileDigests(
        sha.hexdigest(), md.hexdigest() if md else None, git.hexdigest() if git else None
    )


def open_source(uri: str) -> Source:
    """The source for an artifact URI; the URI was validated when the version was registered,
    and local paths are checked against the allowed roots again here."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        from portal.cache.sources.s3 import S3Source

        return S3Source(uri, bucket=parts.netloc, prefix=unquote(parts.path.lstrip("/")))
    if scheme == "hf":
        from portal.cache.sources.hf import HubSource

        repo, _, revision = (parts.netloc + parts.path).partition("@")
        return HubSource(uri, repo_id=repo.strip("/"), revision=revision or "main")
    if scheme == "file":
        from portal.cache.sources.local import LocalSource

        return LocalSource(uri, Path(unquote(parts.path)))
    raise SourceError(f"Scheme {scheme or '(none)'!r} is not a supported artifact source.")
