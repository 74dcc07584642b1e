"""A deployment's and its instances' lifecycles, and what a person can ask of a deployment.

Deployments and instances change state only through the functions here. Each locks the row,
checks the move against its table and writes it with the event that explains it, in one
transaction. Moving to the state an object is already in is a no-op, so a retried task is
harmless. Actions (:class:`Action`) only record what was asked; the controller carries it out.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.db import transaction

from portal.core.actors import CONTROLLER, Actor
from portal.core.errors import InvalidTransition
from portal.core.transitions import check_transition
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    DesiredState,
    EventKind,
    Instance,
    InstanceState,
    ObservedState,
    Strategy,
)

DEPLOYMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    ObservedState.PENDING: frozenset(
        {
            ObservedState.PROGRESSING,
            ObservedState.ROLLING_BACK,
            ObservedState.ABORTED,
            ObservedState.FAILED,
            ObservedState.RETIRED,
        }
    ),
    ObservedState.PROGRESSING: frozenset(
        {
            ObservedState.PAUSED,
            ObservedState.SERVING,
            ObservedState.ROLLING_BACK,
            ObservedState.FAILED,
        }
    ),
    ObservedState.PAUSED: frozenset(
        {ObservedState.PROGRESSING, ObservedState.ROLLING_BACK, ObservedState.FAILED}
    ),
    ObservedState.SERVING: frozenset(
        {
            ObservedState.PENDING,
            ObservedState.ROLLING_BACK,
            ObservedState.FAILED,
            ObservedState.RETIRED,
        }
    ),
    ObservedState.ROLLING_BACK: frozenset(
        {ObservedState.SERVING, ObservedState.ABORTED, ObservedState.FAILED}
    ),
    ObservedState.ABORTED: frozenset({ObservedState.RETIRED}),
    ObservedState.FAILED: frozenset({ObservedState.RETIRED}),
    ObservedState.RETIRED: frozenset(),
}

INSTANCE_TRANSITIONS: dict[str, frozenset[str]] = {
    InstanceState.PENDING: frozenset(
        {InstanceState.STARTING, InstanceState.FAILED, InstanceState.STOPPED}
    ),
    InstanceState.STARTING: frozenset(
        {InstanceState.READY, InstanceState.FAILED, InstanceState.DRAINING, InstanceState.STOPPED}
    ),
    InstanceState.READY: frozenset(
        {InstanceState.UNHEALTHY, InstanceState.DRAINING, InstanceState.FAILED}
    ),
    InstanceState.UNHEALTHY: frozenset(
        {InstanceState.READY, InstanceState.DRAINING, InstanceState.FAILED}
    ),
    InstanceState.DRAINING: frozenset({InstanceState.STOPPED, InstanceState.FAILED}),
    InstanceState.STOPPED: frozenset(),
    InstanceState.FAILED: frozenset(),
}


def record_event(
    deployment: Deployment,
    *,
    actor: Actor,
    kind: str,
    message: str,
    from_state: str = "",
    to_state: str = "",
    data: dict | None = None,
) -> DeploymentEvent:
    return DeploymentEvent.objects.create(
        deployment=deployment,
        actor=actor.user,
        actor_label=actor.label,
        kind=kind,
        message=message,
        from_state=from_state,
        to_state=to_state,
        data=data or {},
    )


def transition_deployment(
    deployment: Deployment,
    target: str,
    *,
    reason: str,
    actor: Actor = CONTROLLER,
    data: dict | None = None,
    **changes,
) -> Deployment:
    """Move a deployment's observed state, applying ``changes`` to other fields in the same write,
    and append the event that explains it (with ``data`` for what reads it back, e.g. the
    status naming the version a rollback came from)."""
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        current = locked.observed_state
        if current == target and not changes:
            return deployment
        if current != target:
            check_transition(DEPLOYMENT_TRANSITIONS, "deployment", current, target)
        locked.observed_state = target
        locked.status_message = reason
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.save()
        record_event(
            locked,
            actor=actor,
            kind=EventKind.STATE,
            message=reason,
            from_state=current,
            to_state=target,
            data=data,
        )
    deployment.refresh_from_db()
    return deployment


def transition_instance(instance: Instance, target: str, *, message: str = "") -> Instance:
    with transaction.atomic():
        locked = Instance.objects.select_for_update().get(pk=instance.pk)
        if locked.state != target:
            check_transition(INSTANCE_TRANSITIONS, "instance", locked.state, target)
            previous = locked.state
            locked.state = target
            locked.health_message = message
            locked.save(update_fields=["state", "health_message", "updated_at"])
            record_event(
                locked.deployment,
                actor=CONTROLLER,
                kind=EventKind.INSTANCE,
                message=f"Instance {locked.name}: {previous} → {target}. {message}".strip(),
                from_state=previous,
                to_state=target,
                data={"instance": locked.pk},
            )
    instance.refresh_from_db()
    return instance


class Action(StrEnum):
    """What a person can ask of a deployment. The controller carries it out."""

    PAUSE = "pause"
    RESUME = "resume"
    ABORT = "abort"
    PROMOTE = "promote"
    ROLLBACK = "rollback"


_ROLLOUT_IN_FLIGHT = (ObservedState.PENDING, ObservedState.PROGRESSING, ObservedState.PAUSED)


def action_changes(deployment: Deployment, action: Action) -> dict[str, Any]:
    """The desired-state fields ``action`` sets on ``deployment``, or why it is not allowed now."""
    observed, desired = deployment.observed_state, deployment.desired_state
    red_black = deployment.strategy == Strategy.RED_BLACK

    def refuse(why: str) -> InvalidTransition:
        return InvalidTransition(f"Cannot {action} this deployment: {why}")

    if action == Action.PAUSE:
        if observed not in (ObservedState.PENDING, ObservedState.PROGRESSING):
            raise refuse(f"it is {observed}, and only a rollout in progress can be paused.")
        if desired != DesiredState.ACTIVE:
            raise refuse(f"it is already asked to {desired}.")
        return {"desired_state": DesiredState.PAUSED}
    if action == Action.RESUME:
        if desired != DesiredState.PAUSED:
            raise refuse("it is not paused.")
        return {"desired_state": DesiredState.ACTIVE}
    if action == Action.ABORT:
        if observed not in _ROLLOUT_IN_FLIGHT:
            raise refuse(f"it is {observed}; only a rollout in progress can be aborted.")
        if desired not in (DesiredState.ACTIVE, DesiredState.PAUSED):
            raise refuse(f"it is already asked to {desired}.")
        return {"desired_state": DesiredState.ABORTED}
    if action == Action.PROMOTE:
        if not red_black:
            raise refuse("only Red-Black rollouts have stages to skip.")
        if observed not in (ObservedState.PROGRESSING, ObservedState.PAUSED):
            raise refuse(f"it is {observed}; promote skips the remaining stages of a rollout.")
        if desired not in (DesiredState.ACTIVE, DesiredState.PAUSED):
            raise refuse(f"it is already asked to {desired}.")
        return {"desired_state": DesiredState.ACTIVE, "promote_requested": True}
    if action == Action.ROLLBACK:
        if not red_black:
            raise refuse(
                "a Versioned deployment serves one version on its own endpoint; point callers "
                "at the older version's deployment instead."
            )
        if deployment.previous_version_id is None:
            raise refuse("there is no previous version to go back to.")
        if observed not in (ObservedState.SERVING, *_ROLLOUT_IN_FLIGHT):
            raise refuse(f"it is {observed}.")
        if desired not in (DesiredState.ACTIVE, DesiredState.PAUSED):
            raise refuse(f"it is already asked to {desired}.")
        return {"desired_state": DesiredState.ROLLBACK}
    raise refuse("unknown action.")


def request_action(
    deployment: Deployment, action: Action, *, actor: Actor, reason: str = ""
) -> Deployment:
    """Record what a person asked for; the rollout controller acts on it at its next step."""
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        changes = action_changes(locked, action)
        previous_desired = locked.desired_state
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.save(update_fields=[*changes, "updated_at"])
        message = f"{action.capitalize()} requested." + (f" Reason: {reason}" if reason else "")
        record_event(
            locked,
            actor=actor,
            kind=EventKind.ACTION,
            message=message,
            from_state=previous_desired,
            to_state=locked.desired_state,
            data={"action": str(action), "reason": reason},
        )
    deployment.refresh_from_db()
    return deployment
