"""Materializing versions into the model cache, and keeping the cache within its size.

``materialize`` is what the Celery task runs. It is safe to run twice, concurrently, or after a
worker was killed midway: a Redis lease (with expiry, renewed by a heartbeat) lets one worker
copy a version at a time; the staging area keeps what a dead worker finished; publishing is one
rename; and a version already in the cache is only marked so.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from portal.cache import kick
from portal.cache.fsx_copy import copied_through, open_version_source
from portal.cache.materializer import copy_version
from portal.cache.models import CopyState, Materialization
from portal.cache.progress import Progress, Throttle
from portal.cache.sources import CopyOptions, SourceError
from portal.cache.store import ContentStore
from portal.core.redis_clients import redis_client
from portal.registry.lifecycle import transition_version
from portal.registry.models import ModelVersion, VersionState

log = logging.getLogger(__name__)


def content_store() -> ContentStore:
    return ContentStore(settings.MODEL_CACHE_ROOT)


def record_for(version: ModelVersion) -> Materialization:
    record, _ = Materialization.objects.get_or_create(
        version=version, defaults={"tree": version.cache_tree}
    )
    return record


def copy_options() -> CopyOptions:
    return CopyOptions(
        parallelism=settings.MODEL_CACHE_PARALLELISM,
        part_size=settings.MODEL_CACHE_PART_SIZE,
        throttle=Throttle(settings.MODEL_CACHE_MAX_BYTES_PER_SECOND),
    )


# --- asking for a copy -----------------------------------------------------------------------


def request_materialization(version: ModelVersion) -> None:
    """Enqueue the copy once the caller's transaction commits. If the broker is down the
    version still waits in ``registered``, and beat's re-drive picks it up later."""

    def enqueue() -> None:
        try:
            kick.materialize(version.pk)
        except Exception:  # the broker being down must not fail a registration
            log.warning(
                "could not enqueue materialization of version %s", version.pk, exc_info=True
            )

    transaction.on_commit(enqueue)


def weights_present(version: ModelVersion) -> bool:
    return content_store().manifest(version.cache_tree) is not None


def prepare_for_deploy(version: ModelVersion) -> None:
    """A deploy counts as a use (eviction goes by last use), and a version whose weights were
    evicted is copied back; the rollout waits for it instead of downloading at instance start."""
    record = record_for(version)
    Materialization.objects.filter(pk=record.pk).update(last_used_at=timezone.now())
    copy_back(version)


def copy_back(version: ModelVersion) -> bool:
    """Copy a ready version's evicted (or failed re-copied) weights back into the cache."""
    with transaction.atomic():
        record = Materialization.objects.select_for_update().get(pk=record_for(version).pk)
        if record.state not in (CopyState.EVICTED, CopyState.FAILED):
            return False
        state = ModelVersion.objects.values_list("state", flat=True).get(pk=version.pk)
        if state in (VersionState.REGISTERED, VersionState.FAILED):
            return False  # the version's own lifecycle copies it (or waits for a retry)
        record.state = CopyState.PENDING
        record.save(update_fields=["state"])
    request_materialization(version)
    return True


# --- the copy ----------------------------------------------------------------------------------


class Lease:
    """A Redis lock with expiry: a worker that dies stops renewing it, and another can take over
    after ``ttl`` seconds."""

    def __init__(self, name: str, ttl: int) -> None:
        client = redis_client()
        self.ttl = ttl
        self.lock = client.lock(name, timeout=ttl, thread_local=False)

    def acquire(self) -> bool:
        return bool(self.lock.acquire(blocking=False))

    def renew(self) -> bool:
        try:
            return bool(self.lock.reacquire())
        except redis.exceptions.LockError:
            return False

    def release(self) -> None:
        with contextlib.suppress(redis.exceptions.LockError):  # expired: nothing to release
            self.lock.release()


class Heartbeat(threading.Thread):
    """Renews the lease and writes progress for the API, once a second, while a copy runs."""

    def __init__(self, record_id: int, progress: Progress, lease: Lease) -> None:
        super().__init__(daemon=True, name=f"materialize-heartbeat-{record_id}")
        self.record_id = record_id
        self.progress = progress
        self.lease = lease
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.wait(settings.MODEL_CACHE_PROGRESS_INTERVAL):
                if not self.lease.renew():
                    log.error("lost the lease on materialization %s", self.record_id)
                self.flush()
        finally:
            connection.close()

    def flush(self) -> None:
        Materialization.objects.filter(pk=self.record_id).update(
            **self.progress.snapshot(), heartbeat_at=timezone.now()
        )

    def __enter__(self) -> Heartbeat:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.join()


def copy_lease(version_id: int) -> Lease:
    """The lease one copy of a version holds; the staging clean-up takes it too."""
    return Lease(f"model-cache:materialize:{version_id}", settings.MODEL_CACHE_LEASE_SECONDS)


def staging_key(version_id: int) -> str:
    """The staging area a version is copied in (``staging/<key>/``)."""
    return f"version-{version_id}"


def _worker_label() -> str:
    return f"{socket.gethostname()}:{threading.get_native_id()}"


def materialize(version_id: int) -> str:
    """Copy a version into the cache (or finish a copy a dead worker started). Returns what
    happened: ``materialized``, ``present``, ``busy`` (another worker holds it), ``failed``,
    ``skipped`` or ``missing``."""
    lease = copy_lease(version_id)
    if not lease.acquire():
        return "busy"
    try:
        return _materialize_held(version_id, lease)
    finally:
        lease.release()
        close_old_connections()


def _materialize_held(version_id: int, lease: Lease) -> str:
    version = ModelVersion.objects.select_related("model__team").filter(pk=version_id).first()
    if version is None:
        return "missing"
    record = record_for(version)
    cache = content_store()
    manifest = cache.manifest(record.tree)
    # A failed version retried with a corrected source: what the old source gave is not it.
    stale = manifest is not None and manifest.get("source", version.artifact_uri) != (
        version.artifact_uri
    )
    if stale and version.state == VersionState.REGISTERED:
        cache.remove_tree(record.tree)
        manifest = None
    if manifest is not None:
        _mark_present(version, record, manifest, note="already in the cache")
        return "present"
    if version.state == VersionState.FAILED:
        return "skipped"  # waits for an explicit retry
    if version.state == VersionState.REGISTERED:
        version = transition_version(
            version,
            VersionState.MATERIALIZING,
            reason=f"Copying weights from {version.artifact_uri}.",
        )

    progress = Progress()
    Materialization.objects.filter(pk=record.pk).update(
        state=CopyState.COPYING,
        attempts=F("attempts") + 1,
        worker=_worker_label(),
        through=copied_through(version.artifact_uri),
        error="",
        started_at=timezone.now(),
        finished_at=None,
        **progress.snapshot(),
    )
    staging = cache.staging(staging_key(version.pk))
    try:
        staging.keep_only_for(version.artifact_uri)
        with Heartbeat(record.pk, progress, lease) as heartbeat:
            attempt = Materialization.objects.values_list("attempts", flat=True).get(pk=record.pk)
            source = open_version_source(version.artifact_uri, f"v{version.pk}-{attempt}")
            manifest = copy_version(source, cache, staging, progress, copy_options())
            heartbeat.flush()
    except SourceError as exc:
        _fail(version, record, str(exc), progress)
        return "failed"
    except OSError as exc:  # the cache volume itself: permissions, a lost mount, ...
        where = exc.filename or cache.root
        _fail(version, record, f"Cannot write the model cache ({where}): {exc.strerror}.", progress)
        return "failed"
    cache.publish(staging, record.tree, manifest)
    _mark_present(version, record, manifest, note=_summary(progress))
    return "materialized"


def _summary(progress: Progress) -> str:
    snap = progress.snapshot()
    reused = snap["bytes_total"] - snap["bytes_fetched"]
    return (
        f"{snap['files_total']} files, {snap['bytes_total']} bytes "
        f"({snap['bytes_fetched']} fetched, {reused} resumed or already in the cache)."
    )


def _mark_present(
    version: ModelVersion, record: Materialization, manifest: dict[str, Any], note: str
) -> None:
    Materialization.objects.filter(pk=record.pk).update(
        state=CopyState.PRESENT,
        error="",
        source_revision=manifest.get("revision", ""),
        bytes_total=manifest.get("total_bytes", 0),
        bytes_done=manifest.get("total_bytes", 0),
        files_total=len(manifest.get("files", [])),
        files_done=len(manifest.get("files", [])),
        finished_at=timezone.now(),
    )
    version.refresh_from_db()
    if version.state == VersionState.MATERIALIZING:
        transition_version(
            version, VersionState.MATERIALIZED, reason=f"Weights in the cache: {note}"
        )


def _fail(version: ModelVersion, record: Materialization, reason: str, progress: Progress) -> None:
    log.warning("materialization of %s failed: %s", version, reason)
    Materialization.objects.filter(pk=record.pk).update(
        state=CopyState.FAILED, error=reason, finished_at=timezone.now(), **progress.snapshot()
    )
    version.refresh_from_db()
    if version.state in (VersionState.REGISTERED, VersionState.MATERIALIZING):
        transition_version(version, VersionState.FAILED, reason=reason)


# --- keeping the cache within its size -----------------------------------------------------


InUseSource = Callable[[], set[int]]
_IN_USE_SOURCES: list[InUseSource] = []


def count_as_in_use(source: InUseSource) -> None:
    """Have eviction ask ``source()`` for version ids whose files must stay. The deployments
    app registers what its deployments and instances use (``DeploymentsConfig.ready``), so the
    cache, below deployments, does not import them."""
    if source not in _IN_USE_SOURCES:
        _IN_USE_SOURCES.append(source)


def versions_in_use() -> set[int]:
    """Versions whose files are never evicted: what every registered source says is in use."""
    used: set[int] = set()
    for source in _IN_USE_SOURCES:
        used |= source()
    return used


@dataclass(frozen=True)
class EvictionReport:
    evicted: list[int]
    freed_bytes: int
    used_bytes: int
    capacity_bytes: int


def evict(capacity: int | None = None) -> EvictionReport:
    """Bring the cache under ``capacity`` bytes: drop unreferenced blobs, then the trees of the
    least recently deployed versions that nothing uses and no operator pinned."""
    capacity = settings.MODEL_CACHE_MAX_BYTES if capacity is None else capacity
    cache = content_store()
    freed = cache.collect_garbage()
    used = cache.usage().blob_bytes
    evicted: list[int] = []
    if capacity <= 0 or used <= capacity:
        return EvictionReport(evicted, freed, used, capacity)
    recent = timezone.now() - timedelta(seconds=settings.MODEL_CACHE_RECENT_USE_SECONDS)
    candidates = (
        Materialization.objects.filter(state=CopyState.PRESENT, pinned=False)
        .exclude(last_used_at__gte=recent)  # a deploy being created right now touched it
        .exclude(version_id__in=versions_in_use())
        .order_by(F("last_used_at").asc(nulls_first=True), "finished_at")
    )
    for candidate in candidates:
        if used <= capacity:
            break
        with transaction.atomic():
            record = Materialization.objects.select_for_update().get(pk=candidate.pk)
            # Checked again under the row lock a deploy takes too (prepare_for_deploy).
            if record.pinned or record.state != CopyState.PRESENT:
                continue
            if record.version_id in versions_in_use():
                continue
            record.state = CopyState.EVICTED
            record.save(update_fields=["state"])
            cache.remove_tree(record.tree)
        evicted.append(record.version_id)
        released = cache.collect_garbage()
        freed += released
        used -= released
    return EvictionReport(evicted, freed, used, capacity)


def stalled_versions() -> list[int]:
    """Versions whose copy should be running but is not: never picked up, or whose worker
    stopped renewing its heartbeat. Beat enqueues them again; the lease keeps it to one copy."""
    now = timezone.now()
    stale = now - timedelta(seconds=2 * settings.MODEL_CACHE_LEASE_SECONDS)
    waiting = ModelVersion.objects.filter(
        state=VersionState.REGISTERED, created_at__lt=now - timedelta(seconds=30)
    ).values_list("pk", flat=True)
    copying = Materialization.objects.filter(
        Q(state=CopyState.COPYING) & (Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True))
        | Q(state=CopyState.PENDING, created_at__lt=now - timedelta(seconds=30))
    ).values_list("version_id", flat=True)
    return sorted(set(waiting) | set(copying))
