"""Copy one version from its source into a staging tree, verify every file, and return the
manifest to publish. The same steps for every source; no database, no locks (the service around
it holds those).

Per file: already verified by an earlier attempt → skip; the source states a sha256 the cache
already holds → link it, nothing fetched; otherwise fetch (resuming), check size and every
checksum the source stated, fsync, and hand it to the blob store. A mismatch removes the bad copy
and stops the whole version: nothing is published.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

from portal.cache.progress import Progress
from portal.cache.sources import CopyOptions, Source, SourceError, SourceFile, digest_file
from portal.cache.store import ContentStore, LedgerEntry, Staging, fsync_file


class ChecksumMismatch(SourceError):
    pass


def check_space(root: Path, needed: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if needed > free:
        raise SourceError(
            f"Disk full: the model cache at {root} has {free / 2**30:.1f} GiB free and this "
            f"version needs {needed / 2**30:.1f} GiB more; evict or unpin versions, or grow it."
        )


def copy_version(
    source: Source,
    store: ContentStore,
    staging: Staging,
    progress: Progress,
    options: CopyOptions,
) -> dict[str, Any]:
    files = source.list_files()
    progress.bytes_total = sum(f.size for f in files)
    progress.files_total = len(files)
    done = staging.ledger()
    resumed = {f.path for f in files if _already_done(f, done.get(f.path))}
    to_fetch = [f for f in files if f.path not in resumed and not _in_store(store, f)]
    check_space(store.root, sum(f.size for f in to_fetch))
    source.prefetch(to_fetch, staging)

    entries: dict[str, LedgerEntry] = {}
    for file in files:
        if file.path in resumed:
            entries[file.path] = done[file.path]
            progress.add(file.size, fetched=False)
        elif (linked := _link_known(store, staging, file)) is not None:
            entries[file.path] = linked
            progress.add(file.size, fetched=False)
        else:
            entries[file.path] = _fetch_verified(source, file, store, staging, progress, options)
        progress.file_done()

    return {
        "source": source.uri,
        "revision": source.revision,
        "total_bytes": progress.bytes_total,
        "files": [
            {"path": f.path, "size": f.size, "sha256": entries[f.path].sha256, **f.extra}
            for f in files
        ],
        **source.manifest_extra,
    }


def _already_done(file: SourceFile, entry: LedgerEntry | None) -> bool:
    if entry is None or entry.size != file.size:
        return False
    return file.sha256 is None or file.sha256 == entry.sha256


def _in_store(store: ContentStore, file: SourceFile) -> bool:
    return bool(file.sha256) and store.has_blob(file.sha256 or "", file.size)


def _link_known(store: ContentStore, staging: Staging, file: SourceFile) -> LedgerEntry | None:
    """The source states a sha256 the cache already holds: link it, fetch nothing."""
    if not (file.sha256 and _in_store(store, file)):
        return None
    if not store.link_existing(file.sha256, staging.file(file.path)):
        return None  # collected since we looked
    entry = LedgerEntry(file.path, file.sha256, file.size)
    staging.record(entry)
    return entry


def _fetch_verified(
    source: Source,
    file: SourceFile,
    store: ContentStore,
    staging: Staging,
    progress: Progress,
    options: CopyOptions,
) -> LedgerEntry:
    try:
        streamed = source.fetch(file, staging, progress, options)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise SourceError(
                f"Disk full while copying {file.path} into the model cache at {store.root}; "
                "evict or unpin versions, or grow it."
            ) from exc
        raise
    path = staging.file(file.path)
    size = path.stat().st_size
    if streamed is None or file.md5 or file.git_sha1:
        digests = digest_file(
            path,
            md5=bool(file.md5),
            md5_part_size=file.md5_part_size,
            git_sha1=bool(file.git_sha1),
        )
        sha256, md5, git = digests.sha256, digests.md5, digests.git_sha1
    else:
        sha256, md5, git = streamed, None, None
    problems = []
    if size != file.size:
        problems.append(f"size {size} bytes, the source says {file.size}")
    for name, stated, actual in (
        ("sha256", file.sha256, sha256),
        ("MD5 (ETag)", file.md5, md5),
        ("git blob id", file.git_sha1, git),
    ):
        if stated and actual != stated:
            problems.append(f"{name} {actual}, the source says {stated}")
    if problems:
        staging.forget(file.path)
        progress.undo(file.size)
        raise ChecksumMismatch(
            f"Checksum mismatch for {file.path} from {source.uri}: {'; '.join(problems)}. "
            "Nothing was published; check the source object and retry."
        )
    fsync_file(path)
    store.adopt(path, sha256)
    entry = LedgerEntry(file.path, sha256, file.size)
    staging.record(entry)
    return entry
