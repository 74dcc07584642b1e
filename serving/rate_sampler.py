"""Keep at most about N events a second, a uniform random share above that.

What the front end's per-request observations (:mod:`serving.frontend.observations`) and the
gateway's (:mod:`serving.gateway.observations`) both sample with, so that the work and memory
of observing stay bounded under any load while the sample stays uniform over time.
"""

from __future__ import annotations

import random
import time


class RateSampler:
    """Decides, per event, whether to keep it: all of them up to ``per_second``; above it, the
    share that the last whole second's count allows, at random. ``per_second`` 0: none."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self.skipped = 0  # sampled out above the rate
        self._window = 0
        self._seen_in_window = 0
        self._keep_share = 1.0

    def wanted(self) -> bool:
        if self.per_second <= 0:
            return False
        now = int(time.monotonic())
        if now != self._window:
            last = self._seen_in_window if now == self._window + 1 else 0
            self._keep_share = 1.0 if last <= self.per_second else self.per_second / last
            self._window, self._seen_in_window = now, 0
        self._seen_in_window += 1
        if self._keep_share >= 1.0 or random.random() < self._keep_share:
            return True
        self.skipped += 1
        return False
