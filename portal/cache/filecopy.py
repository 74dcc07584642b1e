"""Copy a local file into the cache, hashing it (sha256) and fsyncing it before it is published.

A copy into the cache must hash every byte (content addressing, verification) and be durable
before it is published (fsync). Two ways, one chosen per file:

*Kernel copy* (the usual one). One thread hashes the source (``readinto`` + ``sha256``, which
releases the GIL), while this one has the kernel copy it (``os.copy_file_range``, ``sendfile``
where that is refused): the data written never passes through Python's buffers, and whichever
of the two reads the source second finds it in the page cache. Every ``WRITEBACK_EVERY`` bytes
``POSIX_FADV_DONTNEED`` starts write-back of the dirty range without waiting for it (and lets
the pages go once clean), so the final fsync waits only for the tail. On a file system that
supports it (btrfs, XFS with reflink, NFS 4.2, SMB), ``copy_file_range`` may share extents or
copy on the server instead: the destination then holds the same bytes, written without moving
the data, and stays independent of later writes to the source (copy on write).

The hash is of the source and the copy is a second read of it, so a source changed in between
could leave the destination with bytes other than the ones hashed. Guard: the source is
``fstat``-ed on its open descriptor before either read starts and after both have ended; its
size, mtime and ctime must be the same, and as many bytes hashed as copied. Why that is enough:
every system call that changes a file's bytes (``write``, ``truncate``, ``fallocate``,
``copy_file_range`` into it) sets its mtime and ctime to the current time, and renaming another
file over the path does not change the open inode both reads use. The holes, and what covers
them: (1) timestamps' granularity: before Linux 6.13 (fine-grained ctime after a ``stat``),
times come from a clock that ticks every few milliseconds, so a write in the same tick as the
change our first ``fstat`` saw would leave them as they were; a file changed less than
``SETTLED_NS`` before the copy therefore takes the chunked path below, where the question does
not arise. (2) A write through a shared writable mapping stamps the times only when it faults a
clean page, so a process writing continuously into a mapping of the source could go unseen; no
tool that produces model files does that, and such a file is torn for any copier. If the guard
fails, the destination is hashed again from disk: the digest returned is of the bytes written
(a source rewritten during a copy gives a torn copy either way, as with ``cp``, and as with the
chunked path).

*Chunked* (a file changed in the last second, a bandwidth cap, no ``copy_file_range``, or a
destination neither kernel copy writes to, such as a device): this thread reads and hashes
8 MiB chunks while a writer thread writes the previous ones, with the same write-back hints.
One read of the source; the bytes written are the bytes hashed. The throttle can only be
honoured here: the kernel copy's two reads of the source would not both be capped.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from portal.cache.progress import Progress, Throttle

CHUNK = 8 * 1024 * 1024
BUFFERS = 4
WRITEBACK_EVERY = 32 * 1024 * 1024
#: Bytes the kernel copies per call; the progress counter moves this often.
COPY_BLOCK = 32 * 1024 * 1024
#: Read size of the hasher: fits the L2 cache (1 MiB and 32 MiB measured no faster). Hashing
#: from an mmap of the source instead measured ~8% faster, but a source truncated meanwhile
#: would kill the worker with SIGBUS.
HASH_BLOCK = 256 * 1024
#: A source whose ctime is newer than this takes the chunked path (see the module docstring).
SETTLED_NS = 1_000_000_000
#: Refusals that mean "not between these two files": try ``sendfile``, then the chunked path.
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def copy_file(
    src: str | Path, dest: Path, progress: Progress, throttle: Throttle | None = None
) -> str:
    """Copy ``src`` to ``dest`` (fsynced); returns the sha256 of the bytes written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb", buffering=0) as source:
        before = os.fstat(source.fileno())
        if (
            (throttle is not None and throttle.rate > 0)
            or not hasattr(os, "copy_file_range")
            or not stat.S_ISREG(before.st_mode)
            or before.st_ctime_ns > time.time_ns() - SETTLED_NS
        ):
            return _copy_chunked(source, dest, progress, throttle)
        try:
            return _copy_kernel(source, before, dest, progress)
        except _Refused:  # neither kernel copy writes to this destination (e.g. a device)
            source.seek(0)
            return _copy_chunked(source, dest, progress, throttle)


# --- kernel copy -------------------------------------------------------------------------------


class _Refused(Exception):
    """Neither ``copy_file_range`` nor ``sendfile`` copies between these two files."""


class _Hasher(threading.Thread):
    """Hashes a file from its current offset to its end; ``stop`` cuts it short."""

    def __init__(self, source: io.FileIO) -> None:
        super().__init__(daemon=True, name="cache-copy-hasher")
        self.source = source
        self.sha = hashlib.sha256()
        self.size = 0
        self.stop = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            buffer = bytearray(HASH_BLOCK)
            view = memoryview(buffer)
            while not self.stop and (size := self.source.readinto(buffer)):
                self.sha.update(view[:size])
                self.size += size
        except BaseException as exc:  # re-raised by the copying thread
            self.error = exc


def _signature(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _copy_kernel(source: io.FileIO, before: os.stat_result, dest: Path, progress: Progress) -> str:
    hasher = _Hasher(source)  # reads through the descriptor's offset; the copy gives its own
    hasher.start()
    try:
        with open(dest, "wb", buffering=0) as out:
            copied = _kernel_copy(source.fileno(), out.fileno(), progress)
            os.fsync(out.fileno())
    except BaseException:
        hasher.stop = True
        raise
    finally:
        hasher.join()  # before the source is closed under it
    if hasher.error is not None:
        raise hasher.error
    after = os.fstat(source.fileno())
    if hasher.size == copied == after.st_size and _signature(before) == _signature(after):
        return hasher.sha.hexdigest()
    return _hash_file(dest)  # the source changed during the copy: hash what was written


def _sendfile(src_fd: int, out_fd: int, count: int, offset_src: int, offset_dst: int) -> int:
    return os.sendfile(out_fd, src_fd, offset_src, count)  # writes at out_fd's offset


def _kernel_copy(src_fd: int, out_fd: int, progress: Progress) -> int:
    """Copy ``src_fd`` (from offset 0, its own offset untouched) to ``out_fd``; bytes copied."""
    copy: Callable[[int, int, int, int, int], int] = os.copy_file_range
    offset = started = 0
    while True:
        try:
            size = copy(src_fd, out_fd, COPY_BLOCK, offset, offset)
        except OSError as exc:
            if offset or exc.errno not in _NO_COPY_RANGE:
                raise
            if copy is _sendfile:
                raise _Refused from exc
            copy = _sendfile  # e.g. across file systems (Linux 5.19 and later)
            continue
        if not size:
            return offset
        offset += size
        progress.add(size)
        if offset - started >= WRITEBACK_EVERY and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(out_fd, started, offset - started, os.POSIX_FADV_DONTNEED)
            started = offset


def _hash_file(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


# --- chunked copy ------------------------------------------------------------------------------


class _Writer(threading.Thread):
    def __init__(self, dest: Path, free: queue.Queue, full: queue.Queue) -> None:
        super().__init__(daemon=True, name="cache-copy-writer")
        self.dest = dest
        self.free = free
        self.full = full
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with open(self.dest, "wb", buffering=0) as out:
                written = started = 0
                while (item := self.full.get()) is not None:
                    buffer, size = item
                    view = memoryview(buffer)[:size]
                    while view:
                        view = view[out.write(view) :]
                    written += size
                    self.free.put(buffer)
                    if written - started >= WRITEBACK_EVERY and hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(
                            out.fileno(), started, written - started, os.POSIX_FADV_DONTNEED
                        )
                        started = written
                os.fsync(out.fileno())
        except BaseException as exc:  # handed to the reading thread, which re-raises it
            self.error = exc
            self._drain()

    def _drain(self) -> None:
        """Keep handing buffers back so the reader never blocks on a dead writer."""
        while (item := self.full.get()) is not None:
            self.free.put(item[0])


def _copy_chunked(
    source: io.FileIO, dest: Path, progress: Progress, throttle: Throttle | None
) -> str:
    sha = hashlib.sha256()
    free: queue.Queue[bytearray] = queue.Queue()
    full: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
    for _ in range(BUFFERS):
        free.put(bytearray(CHUNK))
    writer = _Writer(dest, free, full)
    writer.start()
    try:
        while writer.error is None:
            buffer = free.get()
            size = source.readinto(buffer)
            if not size:
                break
            if throttle is not None:
                throttle.consume(size)
            sha.update(memoryview(buffer)[:size])
            full.put((buffer, size))
            progress.add(size)
    finally:
        full.put(None)
        writer.join()
    if writer.error is not None:
        raise writer.error
    return sha.hexdigest()
