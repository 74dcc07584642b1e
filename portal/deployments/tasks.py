"""Celery tasks of the rollout controller. Thin: the logic is in :mod:`~portal.deployments.rollout.controller` and
:mod:`.services`. Nothing in the app imports this module to enqueue work: :mod:`.kick` sends
these tasks by name.

A deployment is looked at by a chain of ``reconcile_deployment`` tasks, each scheduling the
next. A Redis marker keeps at most one pending task per deployment however often it is kicked,
and beat's ``redrive_deployments`` restarts the chain of any deployment whose worker died, or
whose chain Redis lost (a restart without persistence drops the queued tasks and the markers:
a watched deployment with neither a marker nor a reconcile in progress has nobody coming).
Beat's ``publish_routes`` rebuilds the routing table from the database now and then, and
``publish_caller_keys`` the gateways' caller keys (:mod:`~portal.deployments.traffic.caller_keys`). ``wake_deployment``
is sent by a gateway holding a request for a deployment scaled to zero (:mod:`~portal.deployments.traffic.activation`).
"""

from __future__ import annotations

from celery import shared_task

from portal.core.redis_clients import redis_client
from portal.deployments import kick
from portal.deployments.kick import schedule, schedule_waves
from portal.registry.models import ModelVersion


@shared_task(acks_late=True)
def reconcile_deployment(deployment_id: int) -> float | None:
    from portal.deployments.rollout import controller

    redis_client().delete(kick.deployment_marker(deployment_id))
    delay = controller.reconcile(deployment_id)
    if delay is not None:
        schedule(deployment_id, delay)
    return delay


@shared_task(acks_late=True)
def reconcile_multi_region(group_id: int) -> float | None:
    from portal.deployments.regions import waves

    redis_client().delete(kick.waves_marker(group_id))
    delay = waves.reconcile(group_id)
    if delay is not None:
        schedule_waves(group_id, delay)
    return delay


def wake_deployments_of(version: ModelVersion) -> None:
    """A version became ready or failed: deployments waiting for it need not wait for their
    next look (a hook of those states, registered in ``DeploymentsConfig.ready``)."""
    from portal.deployments import services

    for deployment_id in services.waiting_for(version):
        schedule(deployment_id)


@shared_task
def wake_deployment(deployment_id: int) -> bool:
    """A gateway holds a request for a deployment scaled to zero: wake it (sent by the gateway,
    :mod:`serving.gateway.activator`, by this name)."""
    from portal.deployments.traffic import activation

    return activation.wake(deployment_id)


@shared_task(acks_late=True)
def copy_to_region(version_id: int, region_id: int) -> str:
    """Copy a version's files into a region's own model cache (:mod:`~portal.deployments.runtime.regional_cache`), then
    have that region's deployments waiting for them look again."""
    from portal.deployments import services
    from portal.deployments.runtime import regional_cache

    state = regional_cache.copy(version_id, region_id)
    for deployment_id in services.waiting_in_region(version_id, region_id):
        schedule(deployment_id)
    return state


@shared_task
def redrive_deployments() -> list[int]:
    """Beat: restart the controller for every deployment not looked at recently, or that no
    pending task or running reconcile will look at (its chain was lost with Redis's data).
    Redis losing its data loses the caller keys too, and every gateway then refuses every
    caller: they are published again here, within seconds rather than at the next minute."""
    from portal.deployments import services
    from portal.deployments.regions.waves import lock_key as waves_lock_key
    from portal.deployments.rollout.controller import lock_key
    from portal.deployments.traffic import activation, caller_keys

    caller_keys.republish_if_lost()
    activation.wake_requested()  # the backstop behind the gateways' wake_deployment tasks
    client = redis_client()
    stalled = services.stalled_deployments()
    for deployment_id in stalled:
        client.delete(kick.deployment_marker(deployment_id))
        schedule(deployment_id)
    watched = list(services.watched_deployments().values_list("pk", flat=True))
    with client.pipeline(transaction=False) as pipe:
        for deployment_id in watched:
            pipe.exists(kick.deployment_marker(deployment_id), lock_key(deployment_id))
        looks = pipe.execute()
    orphaned = [pk for pk, found in zip(watched, looks, strict=True) if not found]
    for deployment_id in orphaned:
        schedule(deployment_id)  # a marker that appeared meanwhile makes this a no-op
    for group_id in services.rolling_multi_region():
        if not client.exists(kick.waves_marker(group_id), waves_lock_key(group_id)):
            schedule_waves(group_id)
    return sorted({*stalled, *orphaned})


@shared_task
def publish_routes() -> int:
    """Beat: publish the routing table built from the database, the backstop behind the steps
    that publish from the recorded routes (see :mod:`~portal.deployments.traffic.routing`). Publishes nothing when the
    table is what was last published."""
    from portal.deployments.traffic import routing

    return routing.publish()


@shared_task
def publish_caller_keys() -> int:
    """Beat: publish the caller keys built from the database, the backstop behind the
    publications after each change (one that failed, or a team's key set lost with Redis)."""
    from portal.deployments.traffic import caller_keys

    return caller_keys.publish_caller_keys()


@shared_task
def clean_up_versioned() -> list[int]:
    """Beat: retire Versioned deployments nobody called for ``VERSIONED_IDLE_SECONDS``."""
    from portal.deployments import services

    retired = services.retire_idle_versioned()
    for deployment_id in retired:
        schedule(deployment_id)
    return retired
