"""A deployment's timeline grouped by rollout, newest first: a page shows the rollout under way
(or the last one) open and the earlier ones folded, instead of one list that grows for ever.

A rollout begins with the event that sets the deployment pending: its creation ("Deploy v1")
or a new version's rollout ("Rollout v1 → v2"); every later event belongs to it until the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from portal.deployments.models import DeploymentEvent, EventKind, ObservedState


@dataclass
class RolloutGroup:
    title: str
    #: Newest first, as the page lists them.
    events: list[DeploymentEvent] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """The state the rollout reached last (its newest state change), e.g. ``serving``."""
        return next((e.to_state for e in self.events if e.to_state), "")

    @property
    def started_at(self):
        return self.events[-1].created_at


def _starts_rollout(event: DeploymentEvent) -> bool:
    return event.to_state == ObservedState.PENDING and event.kind in (
        EventKind.CREATED,
        EventKind.STATE,
    )


def _title(event: DeploymentEvent) -> str:
    data = event.data or {}
    if event.kind == EventKind.CREATED and "version" in data:
        return f"Deploy v{data['version']}"
    if "from_version" in data and "version" in data:
        return f"Rollout v{data['from_version']} → v{data['version']}"
    return event.message.split(".")[0]  # events written before titles had data


def group_by_rollout(events: Sequence[DeploymentEvent]) -> list[RolloutGroup]:
    """``events`` newest first (the newest page of them: the oldest group may be cut short,
    and events older than every start shown form "Earlier events")."""
    groups: list[RolloutGroup] = []
    current: RolloutGroup | None = None
    for event in reversed(events):
        if _starts_rollout(event):
            current = RolloutGroup(_title(event))
            groups.append(current)
        elif current is None:
            current = RolloutGroup("Earlier events")
            groups.append(current)
        current.events.insert(0, event)
    groups.reverse()
    return groups
