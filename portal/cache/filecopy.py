"""Copy a local file into the cache in one read pass, hashing and writing on two threads.

A copy into the cache must hash every byte (content addressing, verification) and be durable
before it is published (fsync). Done one after another, sha256, the write and the final fsync
add up; here they overlap: this thread reads and hashes each chunk while a writer thread
writes the previous ones, and every ``WRITEBACK_EVERY`` bytes asks the kernel to start writing
them to disk (``POSIX_FADV_DONTNEED`` starts write-back of a dirty range without waiting for
it, and lets the pages go once clean: the worker will not read them again). The final fsync
then waits only for the tail. A periodic ``fdatasync`` instead measured slower: it stalls the
writer and leaves the disk idle between bursts. The bytes written are the bytes hashed.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path

from portal.cache.progress import Progress, Throttle

CHUNK = 8 * 1024 * 1024
BUFFERS = 4
WRITEBACK_EVERY = 32 * 1024 * 1024


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


def copy_file(
    src: str | Path, dest: Path, progress: Progress, throttle: Throttle | None = None
) -> str:
    """Copy ``src`` to ``dest`` (fsynced); returns the sha256 of the bytes written."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256()
    free: queue.Queue[bytearray] = queue.Queue()
    full: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
    for _ in range(BUFFERS):
        free.put(bytearray(CHUNK))
    writer = _Writer(dest, free, full)
    writer.start()
    try:
        with open(src, "rb", buffering=0) as source:
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
