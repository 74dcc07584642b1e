"""Who may read or change which team's objects.

Every API view asks one question through :func:`access_for`: which teams can this caller read,
and in which can it write. A token acts for its own team with its own role; a signed-in person
acts for each team they belong to with their membership's role; superusers (operators) act as
members of every team.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from portal.accounts.models import ApiToken, Membership, Role, Team


@dataclass(frozen=True)
class Access:
    roles: dict[int, str] = field(default_factory=dict)
    all_teams: bool = False

    def readable_team_ids(self) -> list[int] | None:
        """Team ids this caller may read, or ``None`` meaning every team."""
        return None if self.all_teams else list(self.roles)

    def can_read(self, team_id: int) -> bool:
        return self.all_teams or team_id in self.roles

    def can_write(self, team_id: int) -> bool:
        return self.all_teams or self.roles.get(team_id) == Role.MEMBER

    def filter_teams(self, queryset, field_name: str = "team"):
        """Restrict ``queryset`` to objects whose ``field_name`` team this caller can read."""
        ids = self.readable_team_ids()
        if ids is None:
            return queryset
        return queryset.filter(**{f"{field_name}__in": ids})


def access_for(user, auth=None) -> Access:
    if isinstance(auth, ApiToken):
        return Access(roles={auth.team_id: auth.role})
    if user is None or not user.is_authenticated:
        return Access()
    if user.is_superuser:
        return Access(all_teams=True)
    roles = dict(Membership.objects.filter(user=user).values_list("team_id", "role"))
    return Access(roles=roles)


def default_team(access: Access) -> Team | None:
    """The team a create call means when it names none: the caller's only writable team."""
    writable = [team_id for team_id, role in access.roles.items() if role == Role.MEMBER]
    if access.all_teams or len(writable) != 1:
        return None
    return Team.objects.get(pk=writable[0])
