"""Byte and file counters shared by a copy's threads, and the bandwidth cap they obey."""

from __future__ import annotations

import threading
import time


class Progress:
    """What a materialization has done so far. Copy threads add to it; a heartbeat thread
    reads a snapshot and writes it where the API can see it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_total = 0
        self.files_total = 0
        self.bytes_done = 0
        self.files_done = 0
        #: Bytes this attempt read from the source (resumed and deduplicated bytes are not).
        self.bytes_fetched = 0

    def add(self, nbytes: int, *, fetched: bool = True) -> None:
        with self._lock:
            self.bytes_done += nbytes
            if fetched:
                self.bytes_fetched += nbytes

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1

    def undo(self, nbytes: int) -> None:
        """Take back bytes of a file that failed verification and will be fetched again."""
        with self._lock:
            self.bytes_done -= nbytes

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "bytes_total": self.bytes_total,
                "bytes_done": self.bytes_done,
                "files_total": self.files_total,
                "files_done": self.files_done,
                "bytes_fetched": self.bytes_fetched,
            }


class Throttle:
    """A token bucket shared by every thread of one copy (``MODEL_CACHE_MAX_BYTES_PER_SECOND``),
    so a materialization cannot saturate the link other instances read through. 0 = no cap."""

    def __init__(self, bytes_per_second: int) -> None:
        self.rate = bytes_per_second
        self._lock = threading.Lock()
        self._next_free = time.monotonic()

    def consume(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + nbytes / self.rate
            wait = start - now
        if wait > 0:
            time.sleep(wait)
