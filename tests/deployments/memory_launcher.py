"""A launcher whose instances are entries in a table the test moves along by hand.

It is for the controller's decision tests only: each step of a rollout can be looked at in
between (what was started, what takes traffic, what is stopped) without waiting for real
processes. ``test_rollouts.py`` runs the same controller on real processes.
"""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings

from portal.deployments.runtime.launchers.base import (
    LOG_CHUNK_LINES,
    LOG_DEFAULT_TAIL,
    Health,
    Launcher,
    LogChunk,
    LogCursorError,
    ObservedInstance,
    RegionConfig,
    Route,
    VersionSet,
)
from portal.deployments.state.autoscaling import InstanceLoad


class MemoryLauncher(Launcher):
    """One table of instances for every region (names never clash: they hold the deployment's
    id); the routes and last requests of each region (by its gateway prefix) kept apart, those
    of the platform's own prefix (the default region) in ``routes`` and ``requests``."""

    kind = "memory"
    #: name → [set key, version number, health, message, region name]
    table: ClassVar[dict[str, list]] = {}
    routes: ClassVar[list[Route]] = []
    #: Every region's last table, by region name ("" for a launcher made without a region).
    routes_in: ClassVar[dict[str, list[Route]]] = {}
    requests_in: ClassVar[dict[str, dict[str, float]]] = {}
    generation: ClassVar[int] = 0
    applied: ClassVar[int] = 0
    auto_apply: ClassVar[bool] = True
    started: ClassVar[int] = 0
    stop_calls: ClassVar[list[str]] = []
    #: set key → names in ``table``, so observing one set does not scan every instance.
    by_set: ClassVar[dict[str, list[str]]] = {}
    #: route path → Unix time of its last request, as gateways would report it.
    requests: ClassVar[dict[str, float]] = {}
    #: instance name → its log lines; the cursor is the number of lines read.
    logs: ClassVar[dict[str, list[str]]] = {}
    #: Whether instances list a ``metrics`` endpoint (``memory://<name>``), whose load
    #: :meth:`load_of` answers from ``loads`` (version number → each instance's load).
    with_metrics: ClassVar[bool] = False
    loads: ClassVar[dict[int, InstanceLoad]] = {}
    #: Version number → the URL its instances list as their ``openai`` endpoint: where the
    #: canary analysis reads their observations (see ``tests/deployments/observations_server``).
    openai_urls: ClassVar[dict[int, str]] = {}

    @classmethod
    def reset(cls) -> None:
        cls.table, cls.routes, cls.stop_calls, cls.by_set, cls.requests = {}, [], [], {}, {}
        cls.routes_in, cls.requests_in = {}, {}
        cls.logs, cls.loads, cls.with_metrics = {}, {}, False
        cls.openai_urls = {}
        cls.generation = cls.applied = cls.started = 0
        cls.auto_apply = True

    def __init__(self, region: RegionConfig | None = None) -> None:
        self.region = region.name if region is not None else ""
        prefix = region.gateway_prefix if region is not None else settings.GATEWAY_REDIS_PREFIX
        self.default_prefix = prefix == settings.GATEWAY_REDIS_PREFIX

    def start(self, version_set: VersionSet, count: int) -> list[str]:
        names = []
        for _ in range(count):
            MemoryLauncher.started += 1
            name = f"{version_set.key}-{MemoryLauncher.started}"
            self.table[name] = [
                version_set.key,
                version_set.version,
                Health.STARTING,
                "",
                self.region,
            ]
            self.by_set.setdefault(version_set.key, []).append(name)
            names.append(name)
        return names

    def stop(self, version_set: VersionSet, names: list[str], drain_seconds: float) -> None:
        for name in names:
            MemoryLauncher.stop_calls.append(name)
            if name in self.table and self.table[name][2] not in (Health.EXITED, Health.CRASHED):
                self.table[name][2] = Health.DRAINING

    def observe(self, version_set: VersionSet) -> list[ObservedInstance]:
        return [
            ObservedInstance(
                name,
                self.table[name][2],
                self._endpoints(name),
                self.table[name][3],
            )
            for name in self.by_set.get(version_set.key, [])
            if name in self.table
        ]

    def _endpoints(self, name: str) -> dict[str, str]:
        endpoints = {"metrics": f"memory://{name}"} if self.with_metrics else {}
        url = self.openai_urls.get(self.table[name][1])
        if url is not None:
            endpoints["openai"] = url
        return endpoints

    def forget(self, version_set: VersionSet, names: list[str]) -> None:
        for name in names:
            self.table.pop(name, None)
            if name in self.by_set.get(version_set.key, []):
                self.by_set[version_set.key].remove(name)

    def set_traffic(self, routes: list[Route]) -> int:
        MemoryLauncher.routes_in[self.region] = routes
        if self.default_prefix:
            MemoryLauncher.routes = routes
        MemoryLauncher.generation += 1
        if MemoryLauncher.auto_apply:
            MemoryLauncher.applied = MemoryLauncher.generation
        return MemoryLauncher.generation

    def traffic_applied(self, generation: int) -> bool:
        return MemoryLauncher.applied >= generation

    def last_requests(self) -> dict[str, float]:
        if self.default_prefix:
            return dict(MemoryLauncher.requests)
        return dict(MemoryLauncher.requests_in.get(self.region, {}))

    def read_log(
        self,
        version_set: VersionSet,
        name: str,
        *,
        since: str | None = None,
        tail: int = LOG_DEFAULT_TAIL,
    ) -> LogChunk:
        lines = self.logs.get(name, [])
        if since is not None and not since.isdigit():
            raise LogCursorError(f"since={since!r} is not a line count.")
        start = max(0, len(lines) - tail) if since is None else min(int(since), len(lines))
        chunk = lines[start : start + LOG_CHUNK_LINES]
        entry = self.table.get(name)
        gone = entry is None or entry[2] in (Health.EXITED, Health.CRASHED)
        end = start + len(chunk)
        return LogChunk(chunk, str(end), ended=gone and end == len(lines))

    # --- what the test does to the world ------------------------------------------------------

    @classmethod
    def set_health(
        cls, version: int, health: Health, message: str = "", region: str | None = None
    ) -> None:
        """Every starting or ready instance of ``version`` (in ``region`` only, if named)."""
        for entry in cls.table.values():
            if region is not None and entry[4] != region:
                continue
            if entry[1] == version and entry[2] in (Health.STARTING, Health.READY):
                entry[2], entry[3] = health, message

    @classmethod
    def finish_draining(cls) -> None:
        for entry in cls.table.values():
            if entry[2] == Health.DRAINING:
                entry[2] = Health.EXITED

    @classmethod
    def count(cls, version: int, *healths: Health, region: str | None = None) -> int:
        return sum(
            1
            for e in cls.table.values()
            if e[1] == version and e[2] in healths and region in (None, e[4])
        )

    @classmethod
    def split(cls, region: str | None = None) -> dict[str, tuple[int, int]]:
        """The only route's shares (of ``region``'s table, if named): ``{"v1": (weight,
        ready instances)}``."""
        [route] = cls.routes if region is None else cls.routes_in.get(region, [])
        return {f"v{s.version_set.version}": (s.weight, len(s.instances)) for s in route.shares}

    @classmethod
    def load_of(cls, metrics_url: str) -> InstanceLoad | None:
        """What an instance's ``/metrics`` would say now (None: it does not answer)."""
        entry = cls.table.get(metrics_url.removeprefix("memory://"))
        return None if entry is None else cls.loads.get(entry[1])
