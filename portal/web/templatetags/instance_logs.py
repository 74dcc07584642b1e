"""The deployment page's Logs panel as an inclusion tag, so the page's view stays as it is:
the panel picks its instances and, for failed ones, their summaries itself."""

from __future__ import annotations

from typing import Any

from django import template

from portal.deployments.models import Deployment, InstanceState
from portal.deployments.runtime.logs import failure_summary

register = template.Library()

S = InstanceState
#: Live instances first (their logs are followed), then the newest failed ones (their end is
#: shown once); stopped ones are left out.
PICKED_STATES = (S.PENDING, S.STARTING, S.READY, S.UNHEALTHY, S.DRAINING)
FAILED_SHOWN = 3


@register.inclusion_tag("web/_instance_logs.html")
def instance_logs_panel(deployment: Deployment) -> dict[str, Any]:
    rows = deployment.instances.select_related(
        "version__release", "deployment__model__team", "deployment__instance_type"
    )
    live = list(rows.filter(state__in=PICKED_STATES).order_by("-created_at"))
    failed = list(rows.filter(state=S.FAILED).order_by("-updated_at")[:FAILED_SHOWN])
    return {
        "instances": live + failed,
        "summaries": [(row, failure_summary(row)) for row in failed],
    }
