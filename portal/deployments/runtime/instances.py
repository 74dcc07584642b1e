"""The deployment's ``Instance`` rows as a mirror of what its launcher sees.

The launcher is the truth about what runs; the rows are what the API, the pages and the
routing table read. :func:`sync` brings the rows up to date at the start of every controller
step. Taking an instance out of service is two-phase and crash-safe: :func:`retire_extra` marks
rows ``draining`` (which takes them out of the next routing table), and :func:`stop_drained`
tells the launcher to stop them only once every gateway has a table without them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from portal.deployments.lifecycle import transition_instance
from portal.deployments.models import Deployment, Instance, InstanceState
from portal.deployments.runtime.launchers import get_launcher, version_set
from portal.deployments.runtime.launchers.base import Health, ObservedInstance
from portal.registry.models import ModelVersion

S = InstanceState
LIVE = (S.PENDING, S.STARTING, S.READY, S.UNHEALTHY)
FINAL = (S.STOPPED, S.FAILED)
#: A row the launcher no longer reports is declared lost after this long (a launcher may take
#: a moment to show what it just started, e.g. a pod).
LOST_AFTER_SECONDS = 60


@dataclass
class View:
    """One step's picture of a deployment's instances."""

    rows: list[Instance]
    observed: dict[str, ObservedInstance] = field(default_factory=dict)
    #: When the launcher was asked (see :func:`record_seen`).
    seen_at: datetime | None = None

    def _of(self, version: ModelVersion, states: tuple[str, ...]) -> list[Instance]:
        return [r for r in self.rows if r.version_id == version.pk and r.state in states]

    def live(self, version: ModelVersion) -> list[Instance]:
        return self._of(version, LIVE)

    def ready(self, version: ModelVersion) -> list[Instance]:
        return self._of(version, (S.READY,))

    def not_ready(self, version: ModelVersion) -> list[Instance]:
        return self._of(version, (S.PENDING, S.STARTING, S.UNHEALTHY))

    def unhealthy(self, version: ModelVersion) -> list[Instance]:
        return self._of(version, (S.UNHEALTHY,))

    def unhealthy_for(self, version: ModelVersion, seconds: float) -> list[Instance]:
        """Instances of ``version`` failing their health check for over ``seconds`` (since
        their last transition): one slow check is not a reason to act, one that keeps failing
        is."""
        now = time.time()
        return [r for r in self.unhealthy(version) if now - r.updated_at.timestamp() > seconds]

    def draining(self, version: ModelVersion) -> list[Instance]:
        return self._of(version, (S.DRAINING,))

    def failed(self, version: ModelVersion, since: float) -> list[Instance]:
        """Failed instances of ``version`` started at or after ``since``."""
        return [r for r in self._of(version, (S.FAILED,)) if r.created_at.timestamp() >= since]

    def failure_times(self, version: ModelVersion) -> list[float]:
        """When each instance of ``version`` failed (its last transition), for the restart
        policy (:mod:`~portal.deployments.state.healing`)."""
        return [r.updated_at.timestamp() for r in self._of(version, (S.FAILED,))]

    def versions(self) -> list[ModelVersion]:
        seen: dict[int, ModelVersion] = {}
        for row in self.rows:
            if row.state in LIVE:
                seen.setdefault(row.version_id, row.version)
        return list(seen.values())


def sync(deployment: Deployment) -> View:
    launcher = get_launcher(deployment.region)
    rows = {r.name: r for r in _rows(deployment)}
    versions = {deployment.target_version.pk: deployment.target_version}
    if deployment.previous_version is not None:
        versions[deployment.previous_version.pk] = deployment.previous_version
    for row in rows.values():
        if row.state not in FINAL:
            versions.setdefault(row.version_id, row.version)
    observed: dict[str, ObservedInstance] = {}
    for version in versions.values():
        the_set = version_set(deployment, version)
        seen = launcher.observe(the_set)
        for found in seen:
            observed[found.name] = found
            row = rows.get(found.name) or _create(deployment, version, found.name)
            rows[found.name] = _apply(row, found)
        ended = [f.name for f in seen if f.health in (Health.EXITED, Health.CRASHED)]
        if ended:
            launcher.forget(the_set, ended)
    for row in rows.values():
        age = time.time() - row.created_at.timestamp()
        if row.state not in FINAL and row.name not in observed and age > LOST_AFTER_SECONDS:
            transition_instance(row, S.FAILED, message="its launcher no longer sees it")
    # The rows are current: each transition and write above updated its row in place.
    return View(rows=list(rows.values()), observed=observed, seen_at=timezone.now())


def record_seen(view: View) -> None:
    """Stamp ``last_health_at`` on every row the launcher showed in ``view``: one write for all
    of them, which the controller makes in the same commit as its own bookkeeping."""
    seen = [r for r in view.rows if r.name in view.observed and r.state not in FINAL]
    if seen:
        Instance.objects.filter(pk__in=[r.pk for r in seen]).update(last_health_at=view.seen_at)
        for row in seen:
            row.last_health_at = view.seen_at


def adopt(deployment: Deployment, version: ModelVersion, names: list[str]) -> None:
    """Record instances the launcher just started, so the next step counts them."""
    for name in names:
        _create(deployment, version, name)


def retire_extra(view: View, version: ModelVersion, keep: int, why: str) -> list[str]:
    """Mark all but ``keep`` live instances of ``version`` draining, least useful first (not yet
    ready before ready, then the newest); returns their names."""
    live = sorted(view.live(version), key=lambda r: (r.state == S.READY, -r.created_at.timestamp()))
    return retire(live[: max(0, len(live) - keep)], why)


def retire(rows: list[Instance], why: str) -> list[str]:
    """Mark ``rows`` draining (stopped once a table without them is applied); their names."""
    for row in rows:
        if row.state == S.PENDING:
            transition_instance(row, S.STARTING)
        transition_instance(row, S.DRAINING, message=why)
        row.state = S.DRAINING
    return [r.name for r in rows]


def retire_all(view: View, why: str) -> bool:
    """Drain everything; True while anything is still running."""
    for version in view.versions():
        retire_extra(view, version, 0, why)
    return any(r.state not in FINAL for r in view.rows)


def stop_drained(deployment: Deployment, view: View, generation: int) -> None:
    """Stop the draining instances the launcher still runs as if serving, once the routing
    table that no longer lists them (``generation``) is applied everywhere."""
    launcher = get_launcher(deployment.region)
    pending: dict[int, list[Instance]] = {}
    # The view's rows are current: the step's own retirements marked them draining in place.
    for row in (r for r in view.rows if r.state == S.DRAINING):
        seen = view.observed.get(row.name)
        if seen is None or seen.health in (Health.READY, Health.STARTING, Health.UNHEALTHY):
            pending.setdefault(row.version_id, []).append(row)
    if not pending or not launcher.traffic_applied(generation):
        return
    for rows in pending.values():
        the_set = version_set(deployment, rows[0].version)
        launcher.stop(the_set, [r.name for r in rows], float(settings.INSTANCE_DRAIN_SECONDS))


def _rows(deployment: Deployment) -> list[Instance]:
    return list(
        Instance.objects.filter(deployment=deployment).select_related(
            "version__release", "version__model__team"
        )
    )


def _create(deployment: Deployment, version: ModelVersion, name: str) -> Instance:
    row, _ = Instance.objects.get_or_create(
        launcher=get_launcher(deployment.region).kind,
        name=name,
        defaults={"deployment": deployment, "version": version, "state": S.PENDING},
    )
    if row.state == S.PENDING:
        transition_instance(row, S.STARTING, message="launched")
    return row


def _apply(row: Instance, seen: ObservedInstance) -> Instance:
    """Move the row to what the launcher sees; final rows never move again. A row already in
    the state the launcher shows is not written (its ``last_health_at`` is, by
    :func:`record_seen`, for every row at once), so a steady instance costs no query of its own."""
    if row.state in FINAL:
        return row
    health = seen.health
    if row.state == S.PENDING:
        transition_instance(row, S.STARTING, message="launched")
    if health == Health.CRASHED:
        transition_instance(row, S.FAILED, message=seen.message)
    elif health == Health.EXITED:
        if row.state in (S.READY, S.UNHEALTHY):
            transition_instance(row, S.DRAINING, message="stopping")
        transition_instance(row, S.STOPPED, message=seen.message)
    elif health == Health.DRAINING:
        if row.state != S.DRAINING:
            transition_instance(row, S.DRAINING, message=seen.message)
    elif row.state == S.DRAINING:
        pass  # retired by the controller; stop_drained() tells the launcher when it is safe
    elif health == Health.READY:
        if row.state != S.READY:
            transition_instance(row, S.READY, message="passed its health check")
    elif health == Health.UNHEALTHY and row.state == S.READY:
        transition_instance(row, S.UNHEALTHY, message=seen.message)
    changes: dict[str, Any] = {}
    if seen.endpoints and seen.endpoints != row.endpoints:
        changes["endpoints"] = seen.endpoints
    if health == Health.READY and row.ready_at is None and row.state == S.READY:
        changes["ready_at"] = timezone.now()
    if changes:
        Instance.objects.filter(pk=row.pk).update(**changes)
        for name, value in changes.items():
            setattr(row, name, value)
    return row
