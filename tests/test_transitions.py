"""Every legal and illegal move of every lifecycle state machine, and of every deployment action."""

from __future__ import annotations

import itertools

import pytest

from portal.core.actors import Actor
from portal.core.errors import InvalidTransition
from portal.deployments.lifecycle import (
    DEPLOYMENT_TRANSITIONS,
    INSTANCE_TRANSITIONS,
    Action,
    request_action,
    transition_deployment,
    transition_instance,
)
from portal.deployments.models import (
    DeploymentEvent,
    DesiredState,
    EventKind,
    Instance,
    InstanceState,
    ObservedState,
    Strategy,
)
from portal.registry.lifecycle import VERSION_TRANSITIONS, transition_version
from portal.registry.models import VersionState
from tests.factories import make_deployment, make_model, make_version

pytestmark = pytest.mark.django_db

V, D, I = VersionState, ObservedState, InstanceState  # noqa: E741

# The lifecycles as the product defines them, written out independently of the code's tables.
LEGAL_VERSION_MOVES = {
    (V.REGISTERED, V.MATERIALIZING), (V.REGISTERED, V.FAILED),
    (V.MATERIALIZING, V.MATERIALIZED), (V.MATERIALIZING, V.FAILED),
    (V.MATERIALIZED, V.PACKAGING), (V.MATERIALIZED, V.FAILED),
    (V.PACKAGING, V.READY), (V.PACKAGING, V.FAILED),
    (V.FAILED, V.REGISTERED),
}  # fmt: skip
LEGAL_DEPLOYMENT_MOVES = {
    (D.PENDING, D.PROGRESSING), (D.PENDING, D.ROLLING_BACK), (D.PENDING, D.ABORTED),
    (D.PENDING, D.FAILED), (D.PENDING, D.RETIRED),
    (D.PROGRESSING, D.PAUSED), (D.PROGRESSING, D.SERVING), (D.PROGRESSING, D.ROLLING_BACK),
    (D.PROGRESSING, D.FAILED),
    (D.PAUSED, D.PROGRESSING), (D.PAUSED, D.ROLLING_BACK), (D.PAUSED, D.FAILED),
    (D.SERVING, D.PENDING), (D.SERVING, D.ROLLING_BACK), (D.SERVING, D.FAILED),
    (D.SERVING, D.RETIRED),
    (D.ROLLING_BACK, D.SERVING), (D.ROLLING_BACK, D.ABORTED), (D.ROLLING_BACK, D.FAILED),
    (D.ABORTED, D.RETIRED), (D.FAILED, D.RETIRED),
}  # fmt: skip
LEGAL_INSTANCE_MOVES = {
    (I.PENDING, I.STARTING), (I.PENDING, I.FAILED), (I.PENDING, I.STOPPED),
    (I.STARTING, I.READY), (I.STARTING, I.FAILED), (I.STARTING, I.DRAINING),
    (I.STARTING, I.STOPPED),
    (I.READY, I.UNHEALTHY), (I.READY, I.DRAINING), (I.READY, I.FAILED),
    (I.UNHEALTHY, I.READY), (I.UNHEALTHY, I.DRAINING), (I.UNHEALTHY, I.FAILED),
    (I.DRAINING, I.STOPPED), (I.DRAINING, I.FAILED),
}  # fmt: skip


def test_tables_match_the_product_lifecycles():
    def moves(table):
        return {(a, b) for a, targets in table.items() for b in targets}

    assert moves(VERSION_TRANSITIONS) == LEGAL_VERSION_MOVES
    assert moves(DEPLOYMENT_TRANSITIONS) == LEGAL_DEPLOYMENT_MOVES
    assert moves(INSTANCE_TRANSITIONS) == LEGAL_INSTANCE_MOVES
    assert set(VERSION_TRANSITIONS) == set(V.values)
    assert set(DEPLOYMENT_TRANSITIONS) == set(D.values)
    assert set(INSTANCE_TRANSITIONS) == set(I.values)


@pytest.fixture
def version(team, release, artifact_root):
    return make_version(make_model(team), artifact_root)


@pytest.fixture
def deployment(version, cpu_instance_type):
    return make_deployment(version.model, version, cpu_instance_type)


@pytest.mark.parametrize(("start", "target"), list(itertools.product(V.values, V.values)))
def test_version_move(version, start, target):
    before = "out of disk" if start == V.FAILED else ""
    type(version).objects.filter(pk=version.pk).update(state=start, failure_reason=before)
    version.refresh_from_db()
    if start == target or (start, target) in LEGAL_VERSION_MOVES:
        transition_version(version, target, reason="disk full on /fsx")
        assert version.state == target
        events = list(version.events.values_list("actor_label", "from_state", "to_state"))
        if start == target:
            assert version.failure_reason == before  # a repeated move is a no-op
            assert events == []
        else:
            assert version.failure_reason == ("disk full on /fsx" if target == V.FAILED else "")
            assert events == [("controller", start, target)]
    else:
        with pytest.raises(InvalidTransition, match=f"from {start} to {target}"):
            transition_version(version, target, reason="disk full on /fsx")
        version.refresh_from_db()
        assert version.state == start
        assert not version.events.exists()


def test_failed_version_needs_a_reason_and_retry_clears_it(version):
    with pytest.raises(ValueError, match="failure reason"):
        transition_version(version, V.FAILED)
    transition_version(version, V.FAILED, reason="s3://models/x: access denied")
    assert version.failure_reason == "s3://models/x: access denied"
    transition_version(version, V.REGISTERED)
    assert version.failure_reason == ""


def test_unknown_target_state_is_refused(version, deployment):
    with pytest.raises(InvalidTransition, match="not a version state"):
        transition_version(version, "exploded")
    with pytest.raises(InvalidTransition, match="not a deployment state"):
        transition_deployment(deployment, "exploded", reason="?")


@pytest.mark.parametrize(("start", "target"), list(itertools.product(D.values, D.values)))
def test_deployment_move(deployment, start, target):
    type(deployment).objects.filter(pk=deployment.pk).update(observed_state=start)
    events_before = DeploymentEvent.objects.filter(deployment=deployment).count()
    if start == target:
        transition_deployment(deployment, target, reason="again")
        assert DeploymentEvent.objects.filter(deployment=deployment).count() == events_before
    elif (start, target) in LEGAL_DEPLOYMENT_MOVES:
        transition_deployment(deployment, target, reason="health checks passed")
        assert deployment.observed_state == target
        event = DeploymentEvent.objects.filter(deployment=deployment).last()
        assert (event.kind, event.from_state, event.to_state) == (EventKind.STATE, start, target)
        assert event.actor_label == "controller"
        assert event.message == "health checks passed"
    else:
        with pytest.raises(InvalidTransition):
            transition_deployment(deployment, target, reason="nope")
        deployment.refresh_from_db()
        assert deployment.observed_state == start
        assert DeploymentEvent.objects.filter(deployment=deployment).count() == events_before


@pytest.mark.parametrize(("start", "target"), list(itertools.product(I.values, I.values)))
def test_instance_move(deployment, start, target):
    instance = Instance.objects.create(
        deployment=deployment, version=deployment.target_version, name="proc-1", state=start
    )
    if start == target or (start, target) in LEGAL_INSTANCE_MOVES:
        transition_instance(instance, target, message="probe answered")
        assert instance.state == target
        if start != target:
            event = DeploymentEvent.objects.filter(deployment=deployment).last()
            assert event.kind == EventKind.INSTANCE
            assert event.data == {"instance": instance.pk}
    else:
        with pytest.raises(InvalidTransition):
            transition_instance(instance, target)
        instance.refresh_from_db()
        assert instance.state == start


# --- Actions --------------------------------------------------------------------------------

IN_FLIGHT = {D.PENDING, D.PROGRESSING, D.PAUSED}
STILL_WANTED = {DesiredState.ACTIVE, DesiredState.PAUSED}


def action_is_legal(action, strategy, observed, desired, has_previous) -> bool:
    """The product's rules for what people may ask of a deployment."""
    red_black = strategy == Strategy.RED_BLACK
    return {
        Action.PAUSE: observed in {D.PENDING, D.PROGRESSING} and desired == DesiredState.ACTIVE,
        Action.RESUME: desired == DesiredState.PAUSED,
        Action.ABORT: observed in IN_FLIGHT and desired in STILL_WANTED,
        Action.PROMOTE: red_black
        and observed in {D.PROGRESSING, D.PAUSED}
        and desired in STILL_WANTED,
        Action.ROLLBACK: red_black
        and has_previous
        and observed in {D.SERVING, D.PENDING, D.PROGRESSING, D.PAUSED}
        and desired in STILL_WANTED,
    }[action]


EXPECTED_DESIRED = {
    Action.PAUSE: DesiredState.PAUSED,
    Action.RESUME: DesiredState.ACTIVE,
    Action.ABORT: DesiredState.ABORTED,
    Action.PROMOTE: DesiredState.ACTIVE,
    Action.ROLLBACK: DesiredState.ROLLBACK,
}


@pytest.mark.parametrize("strategy", Strategy.values)
@pytest.mark.parametrize("has_previous", [True, False])
def test_every_action_in_every_state(
    team, release, artifact_root, cpu_instance_type, strategy, has_previous
):
    model = make_model(team)
    old, new = make_version(model, artifact_root), make_version(model, artifact_root)
    deployment = make_deployment(model, new, cpu_instance_type, strategy=strategy)
    actor = Actor(label="user:mia")
    for action, observed, desired in itertools.product(Action, D.values, DesiredState.values):
        type(deployment).objects.filter(pk=deployment.pk).update(
            observed_state=observed,
            desired_state=desired,
            promote_requested=False,
            previous_version=old if has_previous else None,
        )
        deployment.refresh_from_db()
        events_before = deployment.events.count()
        case = f"{action} {strategy} observed={observed} desired={desired} previous={has_previous}"
        if action_is_legal(action, strategy, observed, desired, has_previous):
            request_action(deployment, action, actor=actor, reason="ticket-42")
            assert deployment.desired_state == EXPECTED_DESIRED[action], case
            assert deployment.promote_requested == (action == Action.PROMOTE), case
            event = deployment.events.last()
            assert (event.kind, event.actor_label, event.data) == (
                EventKind.ACTION,
                "user:mia",
                {"action": str(action), "reason": "ticket-42"},
            ), case
        else:
            with pytest.raises(InvalidTransition, match=f"Cannot {action}"):
                request_action(deployment, action, actor=actor)
            deployment.refresh_from_db()
            assert deployment.desired_state == desired, case
            assert deployment.events.count() == events_before, case


def test_version_events_are_append_only(version):
    from django.core.exceptions import ValidationError

    transition_version(version, V.MATERIALIZING)
    event = version.events.get()
    event.message = "rewritten history"
    with pytest.raises(ValidationError, match="append-only"):
        event.save()
    with pytest.raises(ValidationError, match="append-only"):
        event.delete()
    assert version.events.get().message == ""


# -- what follows a version state ----------------------------------------------------------------


@pytest.fixture
def hooked(monkeypatch):
    """A hook on ``ready`` that records the versions it saw, on a clean hook table."""
    from portal.registry import lifecycle

    monkeypatch.setattr(lifecycle, "_HOOKS", {})
    seen: list[int] = []
    lifecycle.when_version_enters(V.READY, lambda version: seen.append(version.pk))
    return seen


def _to_packaging(version):
    for state in (V.MATERIALIZING, V.MATERIALIZED, V.PACKAGING):
        version = transition_version(version, state)
    return version


@pytest.mark.django_db(transaction=True)
def test_a_state_hook_runs_once_the_move_commits_and_not_on_a_repeat(hooked, version):
    version = _to_packaging(version)
    assert hooked == []
    transition_version(version, V.READY)
    assert hooked == [version.pk]
    transition_version(version, V.READY)  # already ready: no move, no second call
    assert hooked == [version.pk]


@pytest.mark.django_db(transaction=True)
def test_a_state_hook_does_not_run_when_the_move_is_rolled_back(hooked, version):
    from django.db import transaction

    version = _to_packaging(version)
    with pytest.raises(RuntimeError), transaction.atomic():
        transition_version(version, V.READY)
        raise RuntimeError("the caller's transaction fails after the move")
    assert hooked == []
    version.refresh_from_db()
    assert version.state == V.PACKAGING


@pytest.mark.django_db(transaction=True)
def test_a_failing_hook_does_not_fail_the_move(hooked, version, caplog):
    from portal.registry import lifecycle

    def broker_down(version):
        raise ConnectionError("broker down")

    lifecycle._HOOKS[V.READY].insert(0, broker_down)
    version = transition_version(_to_packaging(version), V.READY)
    assert version.state == V.READY
    assert "broker down" in caplog.text
    assert hooked == [version.pk]  # the hook after the failing one still ran


def test_the_apps_register_what_follows_registered_ready_and_failed():
    """The pipeline's hand-offs are registered by the apps above the registry."""
    from portal.cache.services import request_materialization
    from portal.deployments.tasks import wake_deployments_of
    from portal.registry.lifecycle import _HOOKS

    assert request_materialization in _HOOKS[V.REGISTERED]
    assert wake_deployments_of in _HOOKS[V.READY]
    assert wake_deployments_of in _HOOKS[V.FAILED]
