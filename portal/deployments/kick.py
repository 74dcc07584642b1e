"""Asking for work to be done soon: the deployments app's Celery tasks, enqueued by name.

Services, waves, activation and the regional cache ask for a look at a deployment or a copy
into a region; :mod:`.tasks` runs them. Sending by name (a task's name is its dotted path in
``tasks.py``, the name beat, the gateway's wake and messages already queued use) keeps this
module at the bottom of the app: it imports none of it, so ``tasks.py`` may import anything
without an import circle. A Redis marker keeps at most one pending look per deployment (and
per multi-region deployment) however often it is kicked.
"""

from __future__ import annotations

from celery import current_app

from portal.core.redis_clients import redis_client

RECONCILE_DEPLOYMENT = "portal.deployments.tasks.reconcile_deployment"
RECONCILE_MULTI_REGION = "portal.deployments.tasks.reconcile_multi_region"
COPY_TO_REGION = "portal.deployments.tasks.copy_to_region"


def deployment_marker(deployment_id: int) -> str:
    return f"reconcile:scheduled:{deployment_id}"


def waves_marker(group_id: int) -> str:
    return f"reconcile:scheduled:waves:{group_id}"


def schedule(deployment_id: int, delay: float = 0.0) -> None:
    """Have the deployment reconciled in ``delay`` seconds, unless a look is already due."""
    if redis_client().set(deployment_marker(deployment_id), 1, nx=True, ex=int(delay) + 60):
        current_app.send_task(RECONCILE_DEPLOYMENT, (deployment_id,), countdown=delay)


def schedule_waves(group_id: int, delay: float = 0.0) -> None:
    """Have the wave controller look at a multi-region deployment in ``delay`` seconds, unless
    a look is already due."""
    if redis_client().set(waves_marker(group_id), 1, nx=True, ex=int(delay) + 60):
        current_app.send_task(RECONCILE_MULTI_REGION, (group_id,), countdown=delay)


def copy_to_region(version_id: int, region_id: int) -> None:
    """Have a worker copy a version's files into a region's model cache."""
    current_app.send_task(COPY_TO_REGION, (version_id, region_id))
