"""A team's caller keys, the keys programs present to the gateway to call its models: create
(the plaintext is shown once), list with their last use, revoke. Thin over
:mod:`portal.deployments.traffic.caller_keys`."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from portal.accounts.models import CallerKey
from portal.deployments.traffic.caller_keys import (
    CallerKeyError,
    issue_caller_key,
    last_used,
    revoke_caller_keys,
)
from portal.web.forms import CallerKeyForm
from portal.web.teams import team_context
from portal.web.views.registry import require_write


@login_required
@require_http_methods(["GET", "POST"])
def caller_keys(request: HttpRequest, team: str) -> HttpResponse:
    ctx = team_context(request, team)
    form = CallerKeyForm(request.POST or None, team=ctx.team)
    issued = None
    if request.method == "POST":
        require_write(ctx)
        if form.is_valid():
            days = form.cleaned_data["expires_in_days"]
            try:
                issued = issue_caller_key(
                    team=ctx.team,
                    name=form.cleaned_data["name"],
                    models=form.cleaned_data["models"],
                    expires_at=timezone.now() + timedelta(days=days) if days else None,
                    requests_per_second=form.cleaned_data["requests_per_second"],
                    tokens_per_minute=form.cleaned_data["tokens_per_minute"],
                    created_by=request.user,
                )
            except CallerKeyError as exc:
                field = "expires_in_days" if exc.field == "expires_at" else exc.field
                form.add_error(field if field in form.fields else None, exc.message)
            else:
                # The page shows the new key once; a reload does not issue another.
                form = CallerKeyForm(team=ctx.team)
    keys = list(
        CallerKey.objects.filter(team=ctx.team)
        .select_related("created_by")
        .prefetch_related("models")
    )
    used = last_used(keys)
    for key in keys:
        key.last_used_at = used.get(key.prefix)  # type: ignore[attr-defined]
    return render(
        request,
        "web/caller_keys.html",
        {"ctx": ctx, "form": form, "issued": issued, "keys": keys},
        status=201 if issued else 200,
    )


@login_required
@require_http_methods(["POST"])
def caller_key_revoke(request: HttpRequest, team: str, pk: int) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    if revoke_caller_keys(CallerKey.objects.filter(team=ctx.team, pk=pk)):
        messages.success(request, "Caller key revoked: the gateways refuse it within seconds.")
    return redirect("web:caller_keys", team=team)
