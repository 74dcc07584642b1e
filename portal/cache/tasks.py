"""Celery tasks of the model cache. Thin, and safe to repeat. Nothing in the app imports this
module to enqueue work: :mod:`.kick` sends the copy by name.

The cache owns the first half of a version's pipeline, and hands a copied version on to the
registry's packaging (registry <- cache: the cache sits above the registry).
"""

from __future__ import annotations

from celery import shared_task

from portal.cache import cleanup, services


@shared_task(acks_late=True)
def materialize_version_task(version_id: int) -> str:
    """Copy a version's weights into the cache, then hand it to packaging."""
    from portal.registry.tasks import package_version_task

    outcome = services.materialize(version_id)
    if outcome in ("materialized", "present"):
        package_version_task.delay(version_id)
    return outcome


@shared_task
def redrive_materializations() -> list[int]:
    """Beat: enqueue again every copy that should be running and is not (a killed worker)."""
    version_ids = services.stalled_versions()
    for version_id in version_ids:
        materialize_version_task.delay(version_id)
    return version_ids


@shared_task
def evict_model_cache() -> dict[str, object]:
    """Beat: keep the cache within ``MODEL_CACHE_MAX_BYTES``."""
    report = services.evict()
    return {"evicted": report.evicted, "freed_bytes": report.freed_bytes}


@shared_task
def clean_up_staging() -> dict[str, object]:
    """Beat: remove staging areas of deleted versions and of failed copies nobody retried."""
    return cleanup.clean_up_staging().as_dict()
