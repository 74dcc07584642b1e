"""One deadline for an instance's whole stop, kept by a thread that ends the process at it.

SIGTERM gives the front end ``--drain-timeout`` to finish its requests and the engine the rest
of the budget to stop; both are bounded on the event loop. What the event loop cannot bound is
itself: a shutdown hook that never returns, or, at the very end, ``asyncio.run`` waiting for a
worker thread of its executor (a chat template that renders for hours holds one, and a thread
cannot be cancelled). So from the first stop signal on, a plain thread waits for the budget
plus :data:`STOP_MARGIN_SECONDS`; if the process is still there then, it logs
``stop_deadline_passed``, kills the engine child and exits :data:`EXIT_STOP_OVERRAN`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from serving.instance.log import event

#: Seconds past ``--drain-timeout`` that a stop may take in all: the engine's stop after the
#: front end drained, and the process's own exit.
STOP_MARGIN_SECONDS = 10.0
#: The exit status of a stop that overran its deadline (what was left was killed).
EXIT_STOP_OVERRAN = 5


class StopDeadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        #: The engine child's pid, once there is one: killed at the deadline.
        self.engine_pid: int | None = None
        self._ends_at: float | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the clock (again: no-op). Called from the stop signal's handler."""
        with self._lock:
            if self._ends_at is not None:
                return
            self._ends_at = time.monotonic() + self.seconds
        threading.Thread(target=self._keep, name="stop-deadline", daemon=True).start()

    def remaining(self, *, minus: float = 0.0) -> float:
        """Seconds left before the deadline, less ``minus`` (never below 0.1); the whole
        budget when the clock has not started."""
        if self._ends_at is None:
            return max(0.1, self.seconds - minus)
        return max(0.1, self._ends_at - time.monotonic() - minus)

    def _keep(self) -> None:
        assert self._ends_at is not None
        while (left := self._ends_at - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
        event("stop_deadline_passed", budget_s=self.seconds, level="error")
        if self.engine_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.engine_pid, signal.SIGKILL)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(EXIT_STOP_OVERRAN)
