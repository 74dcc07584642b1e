"""The multi-region deployment page: its waves, each region's part, its actions, and the
regions' timelines merged."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from portal.core.errors import InvalidTransition
from portal.deployments.lifecycle import Action
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    InstanceState,
    MultiRegionDeployment,
)
from portal.deployments.regions import multi_region
from portal.deployments.rollout.status import DeploymentStatus, describe
from portal.web import summaries
from portal.web.teams import TeamContext, team_context
from portal.web.views.deployments import ask_for
from portal.web.views.registry import require_write

#: The newest events of the regions shown in the merged timeline.
TIMELINE_LENGTH = 100

#: What each action does to the whole rollout, for its confirmation question.
ACTION_QUESTIONS = {
    Action.PAUSE: "Pause the rollout in the region rolling out now (the next waves wait)?",
    Action.RESUME: "Resume the multi-region rollout?",
    Action.PROMOTE: "Finish the rollout now: every remaining region rolls out without stages' "
    "bakes or bakes between waves?",
    Action.ABORT: "Abort the rollout? Every region moved goes back to the serving version.",
    Action.ROLLBACK: "Roll every region back to the previous version?",
}


@dataclass(frozen=True)
class RegionRow:
    """One region's part as the page shows it."""

    deployment: Deployment
    status: DeploymentStatus
    ready: int


def get_group(ctx: TeamContext, pk: int) -> MultiRegionDeployment:
    return get_object_or_404(multi_region.with_regions(), model__team=ctx.team, pk=pk)


def region_rows(group: MultiRegionDeployment) -> list[RegionRow]:
    rows = []
    for deployment in sorted(group.regional.all(), key=lambda d: d.wave):
        shown = [
            i for i in deployment.instances.all() if i.state in summaries.SHOWN_INSTANCE_STATES
        ]
        rows.append(
            RegionRow(
                deployment=deployment,
                status=describe(deployment, shown),
                ready=sum(1 for i in shown if i.state == InstanceState.READY),
            )
        )
    return rows


def available_actions(group: MultiRegionDeployment) -> list[tuple[str, str]]:
    """The actions the service would take now, with the question that confirms each."""
    actions = []
    for action in Action:
        try:
            multi_region.action_changes(group, action)
        except InvalidTransition:
            continue
        actions.append((action.value, ACTION_QUESTIONS[action]))
    return actions


def timeline(group: MultiRegionDeployment) -> list[DeploymentEvent]:
    """The regions' events merged, newest first (each event names its deployment's region)."""
    return list(
        DeploymentEvent.objects.filter(deployment__multi_region=group)
        .select_related("deployment__region")
        .order_by("-created_at", "-id")[:TIMELINE_LENGTH]
    )


@login_required
def multi_region_detail(request: HttpRequest, team: str, pk: int) -> HttpResponse:
    ctx = team_context(request, team)
    group = get_group(ctx, pk)
    rows = region_rows(group)
    actions = available_actions(group)
    next_region = (
        rows[group.current_wave].deployment.region if 0 < group.current_wave < len(rows) else None
    )
    return render(
        request,
        "web/multi_region_detail.html",
        {
            "ctx": ctx,
            "group": group,
            "model": group.model,
            "rows": rows,
            "wave_count": len(rows),
            "bake_ends_at": group.wave_bake_ends_at,
            "next_region": next_region,
            "actions": actions,
            "action_names": [name for name, _ in actions],
            "events": timeline(group),
        },
    )


@login_required
@require_http_methods(["POST"])
def multi_region_act(request: HttpRequest, team: str, pk: int, action: str) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    group = get_group(ctx, pk)
    ask_for(request, action, group, multi_region.act, "every region concerned follows")
    return redirect("web:multi_region_detail", team=team, pk=pk)
