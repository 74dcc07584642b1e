"""Template context every portal page needs: the teams for the switcher."""

from __future__ import annotations

from django.http import HttpRequest

from portal.web.teams import readable_teams


def teams(request: HttpRequest) -> dict:
    if not request.user.is_authenticated:
        return {}
    return {"all_teams": readable_teams(request)}
