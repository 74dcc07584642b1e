"""Which team a page is about, and what the signed-in person may do there.

Every page lives under ``/t/<team>/``, so a link always means the same thing whoever opens it.
A team the person cannot read is a 404, never a 403: the page does not admit that it exists.
The last team visited is remembered in the session for ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import Http404, HttpRequest

from portal.accounts.access import Access, access_for
from portal.accounts.models import Team

SESSION_KEY = "web:team"


@dataclass(frozen=True)
class TeamContext:
    team: Team
    access: Access

    @property
    def can_write(self) -> bool:
        return self.access.can_write(self.team.pk)


def readable_teams(request: HttpRequest) -> list[Team]:
    access = access_for(request.user)
    return list(access.filter_teams(Team.objects.all(), field_name="pk"))


def team_context(request: HttpRequest, slug: str) -> TeamContext:
    access = access_for(request.user)
    team = Team.objects.filter(slug=slug).first()
    if team is None or not access.can_read(team.pk):
        raise Http404("No such team.")
    request.session[SESSION_KEY] = team.slug
    return TeamContext(team=team, access=access)


def remembered_team(request: HttpRequest) -> Team | None:
    """The team ``/`` opens: the last one visited if still readable, else the first."""
    teams = readable_teams(request)
    wanted = request.session.get(SESSION_KEY)
    for team in teams:
        if team.slug == wanted:
            return team
    return teams[0] if teams else None
