"""A version's files in each region's own model cache, before it rolls out there.

In production every region has its own model cache (an FSx for Lustre file system), mounted on
its instances at the same path (``MODEL_CACHE_ROOT``), so a package's paths hold in every
region. Materialization fills the platform's cache; a region with a ``model_cache_root`` (where
the platform's workers reach that region's file system) gets the version's package and weights
copied there, verified, before its deployment starts an instance of it (the rollout
controller waits, :func:`waiting_for`). A region with none shares the platform's cache.

The copy is idempotent and safe to kill: files are written under a staging directory and moved
into place whole, each file's bytes hashed as they are written and compared with the source's,
and the record says ``ready`` only once everything is in place. A killed copy leaves a record
``copying`` whose lease has expired: the next request starts it again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from django.conf import settings
from django.db import transaction

from portal.cache.filecopy import copy_file
from portal.cache.progress import Progress
from portal.cache.services import Lease
from portal.core.redis_clients import redis_client
from portal.deployments import kick
from portal.deployments.models import Region, RegionalCopy, RegionalCopyState
from portal.registry.models import ModelVersion
from portal.registry.packaging import packages_dir, weights_dir

S = RegionalCopyState
LEASE_SECONDS = 120


def cache_root(region: Region) -> Path:
    """Where the platform's workers write the region's model cache."""
    return Path(region.model_cache_root) if region.model_cache_root else settings.MODEL_CACHE_ROOT


def package_path(region: Region, version: ModelVersion) -> Path:
    """The version's package in the region's cache."""
    relative = packages_dir().relative_to(settings.MODEL_CACHE_ROOT)
    return cache_root(region) / relative / f"{version.package_digest}.tar"


def waiting_for(region: Region, version: ModelVersion) -> str | None:
    """What a rollout of ``version`` in ``region`` still waits for in the region's cache (and
    the copy is asked for), or None when its files are there. Raises :class:`CopyFailed`."""
    if not region.model_cache_root:
        return None
    record, _ = RegionalCopy.objects.get_or_create(version=version, region=region)
    if record.state == S.READY:
        return None
    if record.state == S.FAILED:
        raise CopyFailed(
            f"copying v{version.number} into {region}'s model cache failed: {record.reason}"
        )
    request(record)
    return (
        f"Copying v{version.number} into {region}'s model cache "
        f"({record.state}, {record.bytes_copied / 1e6:.0f} MB so far)."
    )


class CopyFailed(Exception):
    """A version's files could not be copied into a region's cache."""


def request(record: RegionalCopy) -> None:
    """Have a worker copy it: at most one request queued per lease period (each controller
    step of a waiting rollout asks), none while a worker holds the copy's lease."""
    name = _lease_name(record)
    client = redis_client()
    if Lease(name, LEASE_SECONDS).lock.locked():
        return
    if client.set(f"{name}:requested", 1, nx=True, ex=LEASE_SECONDS):
        transaction.on_commit(lambda: kick.copy_to_region(record.version_id, record.region_id))


def prepare(region: Region, version: ModelVersion) -> None:
    """A rollout of ``version`` in ``region`` was asked for: a copy that failed before is tried
    again (the rollout waits for it)."""
    RegionalCopy.objects.filter(version=version, region=region, state=S.FAILED).update(
        state=S.PENDING, reason=""
    )


def _lease_name(record: RegionalCopy) -> str:
    return f"regional-copy:{record.version_id}:{record.region_id}"


def copy(version_id: int, region_id: int) -> str:
    """Copy the version's package and weights into the region's cache; returns the record's
    state. Another worker holding the copy's lease: nothing done here."""
    record, _ = RegionalCopy.objects.select_related("version__model__team", "region").get_or_create(
        version_id=version_id, region_id=region_id
    )
    if record.state == S.READY:
        return record.state
    lease = Lease(_lease_name(record), LEASE_SECONDS)
    if not lease.acquire():
        return record.state
    redis_client().delete(f"{_lease_name(record)}:requested")
    try:
        RegionalCopy.objects.filter(pk=record.pk).update(
            state=S.COPYING, attempts=record.attempts + 1
        )
        copied = _copy_files(record.version, record.region, lease)
    except (OSError, CopyFailed) as exc:
        RegionalCopy.objects.filter(pk=record.pk).update(state=S.FAILED, reason=str(exc))
        return S.FAILED
    finally:
        lease.release()
    RegionalCopy.objects.filter(pk=record.pk).update(state=S.READY, bytes_copied=copied)
    return S.READY


def _copy_files(version: ModelVersion, region: Region, lease: Lease) -> int:
    root = cache_root(region)
    source_weights = weights_dir(version)
    relative = source_weights.relative_to(settings.MODEL_CACHE_ROOT)
    staging = root / ".staging" / f"v{version.pk}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    progress = Progress()
    try:
        files = sorted(p for p in source_weights.rglob("*") if p.is_file())
        for source in files:
            _copy_verified(
                source, staging / "weights" / source.relative_to(source_weights), progress
            )
            if not lease.renew():
                raise CopyFailed("lost the copy's lease (another worker took it over)")
        package = packages_dir() / f"{version.package_digest}.tar"
        digest = _copy_verified(package, staging / "package.tar", progress)
        if digest != version.package_digest:
            raise CopyFailed(f"the package's sha256 is {digest}, not {version.package_digest}")
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)  # a partial tree from an older layout: replaced whole
        os.replace(staging / "weights", target)
        package_target = package_path(region, version)
        package_target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / "package.tar", package_target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return progress.bytes_done


def _copy_verified(source: Path, dest: Path, progress: Progress) -> str:
    """Copy one file; its written bytes must hash as the source's do."""
    written = copy_file(source, dest, progress)
    expected = hashlib.sha256()
    with open(source, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            expected.update(block)
    if written != expected.hexdigest():
        raise CopyFailed(f"{source.name} changed while it was copied")
    return written
