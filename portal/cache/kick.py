"""Asking for a copy into the model cache: the cache's Celery task, enqueued by name.

:mod:`.services` asks; :mod:`.tasks` runs. Sending by name (the task's dotted path, which
messages already queued use) keeps this module at the bottom of the app, so the tasks may
import the services at the top of their module without an import circle.
"""

from __future__ import annotations

from celery import current_app

MATERIALIZE_VERSION = "portal.cache.tasks.materialize_version_task"


def materialize(version_id: int) -> None:
    """Have a worker copy the version's weights into the cache (then package it)."""
    current_app.send_task(MATERIALIZE_VERSION, (version_id,))
