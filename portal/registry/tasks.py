"""Celery tasks of the registry. Thin: they import the service inside their body, load the
version and call it. What follows a packaged version (deployments waiting for it) is a hook of
its new state (:mod:`portal.registry.lifecycle`), not a call from here."""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def package_version_task(version_id: int) -> str:
    """Package a materialized version; safe to run twice or after a worker died midway."""
    from portal.registry.models import ModelVersion
    from portal.registry.packaging import PackagingError, package_version

    version = ModelVersion.objects.filter(pk=version_id).first()
    if version is None:
        return "missing"
    try:
        version = package_version(version)
    except PackagingError as exc:  # not materialized (yet, or any more): nothing to do
        log.info("skipping packaging of version %s: %s", version_id, exc)
        return "skipped"
    return version.state
