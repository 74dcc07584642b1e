"""A model version's lifecycle: its state machine and the one way to move along it.

``transition_version`` locks the row, checks the move against :data:`VERSION_TRANSITIONS`,
writes it and its event in one transaction. Moving to the state a version is already in is a
no-op, so a retried task is harmless.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from portal.core.actors import CONTROLLER, Actor
from portal.core.transitions import check_transition
from portal.registry.models import ModelVersion, VersionEvent, VersionState

VERSION_TRANSITIONS: dict[str, frozenset[str]] = {
    VersionState.REGISTERED: frozenset({VersionState.MATERIALIZING, VersionState.FAILED}),
    VersionState.MATERIALIZING: frozenset({VersionState.MATERIALIZED, VersionState.FAILED}),
    VersionState.MATERIALIZED: frozenset({VersionState.PACKAGING, VersionState.FAILED}),
    VersionState.PACKAGING: frozenset({VersionState.READY, VersionState.FAILED}),
    VersionState.READY: frozenset(),  # immutable once ready
    VersionState.FAILED: frozenset({VersionState.REGISTERED}),  # retry from the start
}


def transition_version(
    version: ModelVersion, target: str, *, reason: str = "", actor: Actor = CONTROLLER
) -> ModelVersion:
    """Move a version along its lifecycle and record the move. ``failed`` needs a reason a
    human can act on."""
    if target == VersionState.FAILED and not reason:
        raise ValueError("A failed version needs a failure reason.")
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.state != target:
            check_transition(VERSION_TRANSITIONS, "version", locked.state, target)
            previous = locked.state
            locked.state = target
            locked.failure_reason = reason if target == VersionState.FAILED else ""
            locked.state_changed_at = timezone.now()
            locked.save(update_fields=["state", "failure_reason", "state_changed_at"])
            VersionEvent.objects.create(
                version=locked,
                actor_label=actor.label,
                from_state=previous,
                to_state=target,
                message=reason,
            )
    version.refresh_from_db()
    return version
