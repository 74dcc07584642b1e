"""Display helpers for a deployment's status and for the JSON a version carries (engine
arguments, I/O spec), so pages never show a raw Python dict."""

from __future__ import annotations

from typing import Any

from django import template

from portal.deployments.models import Deployment, Instance
from portal.deployments.rollout.status import DeploymentStatus, describe, traffic_text
from portal.deployments.state.rollout_state import Traffic
from portal.deployments.traffic.routing import endpoint_url
from portal.registry.display import engine_arg_items, io_spec_rows

register = template.Library()


@register.simple_tag
def deployment_status(deployment: Deployment, instances: list[Instance] | None = None):
    """``{% deployment_status deployment instances as status %}``: the one status the page,
    the dashboard, the admin and the API show (:func:`~portal.deployments.rollout.status.describe`)."""
    return describe(deployment, instances or ())


@register.filter
def traffic(value: Traffic | DeploymentStatus, first: int | None = None) -> str:
    """A split as ``v2 10% · v1 90%`` (a status's bar, or a traffic dict)."""
    if isinstance(value, DeploymentStatus):
        return value.traffic
    return traffic_text(value or {}, first)


@register.filter
def endpoint(deployment: Deployment) -> str:
    """The deployment's base URL (the one the deployment page gives callers)."""
    return endpoint_url(deployment)


@register.filter
def percent_of(fraction: float) -> int:
    """``0.5`` → ``50``: a status's progress for a bar's width."""
    return round((fraction or 0) * 100)


@register.inclusion_tag("web/_engine_args.html")
def engine_args_list(engine_args: Any) -> dict[str, Any]:
    """``{% engine_args_list version.engine_args %}``: a key/value list, or "defaults"."""
    return {"items": engine_arg_items(engine_args)}


@register.inclusion_tag("web/_io_spec.html")
def io_spec_table(io_spec: Any) -> dict[str, Any]:
    """``{% io_spec_table version.io_spec %}``: the tensors as a table (name, datatype, dims)."""
    spec = io_spec if isinstance(io_spec, dict) else {}
    return {"rows": io_spec_rows(spec), "max_batch_size": spec.get("max_batch_size")}
