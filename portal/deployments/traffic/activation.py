"""The portal's side of scale to zero: waking a sleeping deployment when a request waits for it.

A deployment the controller scaled to zero keeps its route; a gateway that gets a request for
it holds the request and asks for a wake (:mod:`serving.gateway.activator`) twice over: it
sends the ``wake_deployment`` task, the fast path, and writes the deployment's id into the
``{prefix}:wake`` hash in Redis, which beat's ``redrive_deployments`` reads as the backstop (a
task lost with a broker restart still wakes the deployment within seconds). :func:`wake` is
idempotent: a deployment already awake, or no longer serving, is left as it is.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction

from portal.core.actors import CONTROLLER
from portal.core.redis_clients import redis_client
from portal.deployments.kick import schedule
from portal.deployments.lifecycle import record_event
from portal.deployments.models import Deployment, EventKind, ObservedState, gateway_prefixes


def wake(deployment_id: int, why: str = "a request is held at the gateway") -> bool:
    """Wake a sleeping deployment: it runs ``min_replicas`` again and the controller is kicked.
    Returns whether it was asleep."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().filter(pk=deployment_id).first()
        if (
            deployment is None
            or deployment.observed_state != ObservedState.SERVING
            or not deployment.scaling.asleep
        ):
            return False
        replicas = deployment.min_replicas
        asleep_for = time.time() - (deployment.scaling.asleep_since or time.time())
        deployment.scaling = deployment.scaling.but(asleep_since=None, woken_at=time.time())
        deployment.replicas = replicas
        deployment.status_message = (
            f"Waking: {why}; starting {replicas} instance(s) of "
            f"v{deployment.target_version.number}."
        )
        deployment.save(update_fields=["scaling", "replicas", "status_message", "updated_at"])
        record_event(
            deployment,
            actor=CONTROLLER,
            kind=EventKind.SCALING,
            message=f"Waking after {asleep_for / 60:.0f} min asleep: {why}; "
            f"starting {replicas} instance(s).",
            data={"woken": True, "replicas": replicas},
        )
        transaction.on_commit(lambda: schedule(deployment_id))
    return True


def wake_key(prefix: str | None = None) -> str:
    """The Redis hash of wakes a region's gateways asked for: deployment id → Unix time."""
    return f"{prefix or settings.GATEWAY_REDIS_PREFIX}:wake"


def wake_requested() -> list[int]:
    """Beat's backstop: wake every deployment a gateway (of any region) asked for, and clear
    the requests. Returns the ids woken."""
    client = redis_client(decode_responses=True)
    woken = []
    for prefix in gateway_prefixes():
        asked = client.hgetall(wake_key(prefix))
        for raw_id in asked:
            if raw_id.isdigit() and wake(int(raw_id)):
                woken.append(int(raw_id))
            client.hdel(wake_key(prefix), raw_id)
    return woken
