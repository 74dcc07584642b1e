"""A model version's lifecycle: its state machine and the one way to move along it.

``transition_version`` locks the row, checks the move against :data:`VERSION_TRANSITIONS`,
writes it and its event in one transaction, and schedules what follows the new state once that
transaction commits. Moving to the state a version is already in is a no-op, so a retried task is
harmless.

What follows a state belongs to the apps above the registry, which register it when Django
starts (:func:`when_version_enters`, called from their ``AppConfig.ready``): the model cache
copies a registered version's weights, and deployments waiting for a version look again once it
is ready. So the pipeline runs one way (registry <- cache <- deployments) and the registry
imports neither.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from portal.core.actors import CONTROLLER, Actor
from portal.core.transitions import check_transition
from portal.registry.models import ModelVersion, VersionEvent, VersionState

log = logging.getLogger(__name__)

VersionHook = Callable[[ModelVersion], None]
_HOOKS: dict[str, list[VersionHook]] = {}


def when_version_enters(state: str, hook: VersionHook) -> None:
    """Have ``hook(version)`` called after the transaction that moved a version into ``state``
    (or created it in ``registered``) commits. Registering the same hook twice is a no-op."""
    hooks = _HOOKS.setdefault(state, [])
    if hook not in hooks:
        hooks.append(hook)


def _entered(version: ModelVersion, state: str) -> None:
    for hook in _HOOKS.get(state, ()):
        transaction.on_commit(functools.partial(_run, hook, version, state))


def _run(hook: VersionHook, version: ModelVersion, state: str) -> None:
    """A hook only schedules work; its failure (a broker down) must not fail the move that
    committed. Beat's re-drives pick up what was not scheduled."""
    try:
        hook(version)
    except Exception:
        log.warning("%s after version %s became %s failed", hook, version.pk, state, exc_info=True)


def version_created(version: ModelVersion) -> None:
    """A new version starts ``registered``: what follows that state is scheduled as for a move."""
    _entered(version, VersionState.REGISTERED)


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
            _entered(locked, target)
    version.refresh_from_db()
    return version
