"""The instance's structured log: one JSON object per line on stderr.

JSON lines because a launcher (and the tests) read them back: every start-up step is one line
with ``step``, ``status`` and ``duration_s``, so a slow or failed start says where it stopped.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def event(name: str, **fields: Any) -> None:
    record = {"ts": round(time.time(), 3), "component": "instance", "event": name, **fields}
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


class StepFailed(Exception):
    """A start-up step failed; already logged. ``exit_code`` is what the process returns."""

    def __init__(self, step: str, exit_code: int) -> None:
        super().__init__(step)
        self.step = step
        self.exit_code = exit_code


@contextmanager
def step(name: str, *, exit_code: int = 1) -> Iterator[dict[str, Any]]:
    """Time one step and log it as one line; the body may add fields to the yielded dict.

    Any exception ends the step as ``failed`` with the error's type and message, and is
    re-raised as :class:`StepFailed` so the sequence stops right there."""
    fields: dict[str, Any] = {}
    started = time.monotonic()
    try:
        yield fields
    except StepFailed:
        raise
    except Exception as exc:
        event(
            "step",
            step=name,
            status="failed",
            duration_s=round(time.monotonic() - started, 3),
            error=f"{type(exc).__name__}: {exc}",
            **fields,
        )
        raise StepFailed(name, exit_code) from exc
    event("step", step=name, status="ok", duration_s=round(time.monotonic() - started, 3), **fields)
