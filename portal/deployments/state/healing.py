"""When a lost instance may be started again: back-off, and a crash loop that stops restarts.

A serving set is kept at its replica count, and during a rollout the previous version keeps the
instances its share needs; an instance that crashes is replaced. Restarting at once would turn a
version that cannot start (a bad weight file, an out-of-memory at load) into a tight loop of
starts that each hold a GPU for minutes, so restarts back off as failures accumulate, and a
version that failed ``CRASH_LOOP_FAILURES`` times within ``CRASH_LOOP_WINDOW_SECONDS`` is left
down until the oldest of those failures leaves the window, as Kubernetes' CrashLoopBackOff does
per container. The decision reads only the failure times the instance rows hold, so it survives
worker restarts and needs no state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class RestartDecision:
    #: Unix time from which a start is allowed (0 when it is allowed now).
    not_before: float
    #: Failures of the version within the window.
    recent_failures: int
    crash_loop: bool


@dataclass(frozen=True)
class RestartPolicy:
    backoff_seconds: float
    backoff_max_seconds: float
    loop_failures: int
    window_seconds: float

    @classmethod
    def from_settings(cls) -> RestartPolicy:
        return cls(
            backoff_seconds=settings.INSTANCE_RESTART_BACKOFF_SECONDS,
            backoff_max_seconds=settings.INSTANCE_RESTART_BACKOFF_MAX_SECONDS,
            loop_failures=settings.CRASH_LOOP_FAILURES,
            window_seconds=settings.CRASH_LOOP_WINDOW_SECONDS,
        )

    def decide(self, failure_times: list[float], now: float) -> RestartDecision:
        """When the next instance of a version may start, given when its instances failed."""
        recent = sorted(t for t in failure_times if t > now - self.window_seconds)
        if not recent:
            return RestartDecision(0.0, 0, crash_loop=False)
        if len(recent) >= self.loop_failures:
            # Allowed again once fewer than loop_failures failures remain in the window.
            oldest_counted = recent[-self.loop_failures]
            return RestartDecision(
                oldest_counted + self.window_seconds, len(recent), crash_loop=True
            )
        backoff = min(self.backoff_max_seconds, self.backoff_seconds * 2 ** (len(recent) - 1))
        return RestartDecision(recent[-1] + backoff, len(recent), crash_loop=False)
