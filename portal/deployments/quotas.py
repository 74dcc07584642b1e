"""A team's quotas: how many live deployments, replicas and GPUs it may ask for.

Checked when a deploy or a scale is asked for, against what the team's live deployments ask for
(the most replicas each one's scaling policy allows, not the instances a rollout stage briefly
runs beside them), with the team's row locked so two requests at once cannot both take the last
unit. The error names the quota, what is in use and what the request adds, so the caller knows
what to free or whom to ask.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, F, Sum

from portal.accounts.models import Team
from portal.core.errors import QuotaExceeded
from portal.deployments.models import LIVE_STATES, Deployment, InstanceType


@dataclass(frozen=True)
class Usage:
    deployments: int = 0
    instances: int = 0
    gpus: int = 0


def usage(team: Team, excluding: Deployment | None = None) -> Usage:
    live = Deployment.objects.filter(model__team=team, observed_state__in=LIVE_STATES)
    if excluding is not None:
        live = live.exclude(pk=excluding.pk)
    totals = live.aggregate(
        deployments=Count("pk"),
        instances=Sum("max_replicas"),
        gpus=Sum(F("max_replicas") * F("instance_type__gpus")),
    )
    return Usage(totals["deployments"], totals["instances"] or 0, totals["gpus"] or 0)


def check_quota(
    team_id: int,
    *,
    replicas: int,
    instance_type: InstanceType,
    replacing: Deployment | None = None,
) -> None:
    """Refuse a deployment of ``replicas`` on ``instance_type`` (a new one, or ``replacing``'s
    new size) that would take the team past a quota. Call inside the transaction that saves it."""
    team = Team.objects.select_for_update().get(pk=team_id)
    if team.max_live_deployments is None and team.max_instances is None and team.max_gpus is None:
        return
    used = usage(team, excluding=replacing)
    asked = Usage(1, replicas, replicas * instance_type.gpus)
    for name, limit, in_use, adding, unit in (
        ("live deployments", team.max_live_deployments, used.deployments, asked.deployments, ""),
        ("instances", team.max_instances, used.instances, asked.instances, " replica(s)"),
        ("GPUs", team.max_gpus, used.gpus, asked.gpus, " GPU(s)"),
    ):
        if limit is not None and in_use + adding > limit:
            raise QuotaExceeded(
                f"Team {team.slug}'s quota of {limit} {name} would be exceeded: {in_use} in use "
                f"by its other live deployments, and this asks for {adding}{unit}. Scale down or "
                "retire a deployment, or ask an operator to raise the quota.",
                detail={"quota": name, "limit": limit, "in_use": in_use, "requested": adding},
            )
