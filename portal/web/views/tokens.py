"""A team's API tokens: create (the plaintext is shown once), list, revoke."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token, revoke_tokens
from portal.web.forms import TokenForm
from portal.web.teams import team_context
from portal.web.views.registry import require_write


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest, team: str) -> HttpResponse:
    ctx = team_context(request, team)
    form = TokenForm(request.POST or None)
    issued = None
    if request.method == "POST":
        require_write(ctx)
        if form.is_valid():
            days = form.cleaned_data["expires_in_days"]
            issued = issue_token(
                team=ctx.team,
                name=form.cleaned_data["name"],
                role=form.cleaned_data["role"],
                created_by=request.user,
                expires_at=timezone.now() + timedelta(days=days) if days else None,
            )
            form = TokenForm()  # the page shows the new token once; a reload does not re-issue
    return render(
        request,
        "web/tokens.html",
        {
            "ctx": ctx,
            "form": form,
            "issued": issued,
            "tokens": ApiToken.objects.filter(team=ctx.team).select_related("created_by"),
        },
        status=201 if issued else 200,
    )


@login_required
@require_http_methods(["POST"])
def token_revoke(request: HttpRequest, team: str, pk: int) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    if revoke_tokens(ApiToken.objects.filter(team=ctx.team, pk=pk)):
        messages.success(request, "Token revoked: it no longer authenticates.")
    return redirect("web:tokens", team=team)
