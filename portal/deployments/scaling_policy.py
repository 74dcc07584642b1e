"""A scaling policy as people give it (API, deploy form), checked and turned into fields.

``replicas`` alone is a fixed count: ``min_replicas = max_replicas = replicas``, the policy
every deployment had before autoscaling. Given bounds (and the signal, target, windows, scale
to zero) make the controller own the count within them (:mod:`~portal.deployments.state.autoscaling`); a ``replicas``
given beside them is where it starts. Settings not given keep the deployment's (or the
defaults of :mod:`~portal.deployments.state.rollout_limits` for a new one). Every refusal names its field.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from portal.deployments.state import rollout_limits
from portal.deployments.state.autoscaling import ScaleMetric
from portal.registry.models import ModelVersion

#: The policy's settings, by the name they have on the model, the service, the API and the form.
POLICY_SETTINGS = (
    "min_replicas",
    "max_replicas",
    "scale_metric",
    "scale_target",
    "scale_up_window_seconds",
    "scale_down_window_seconds",
    "scale_to_zero_after_seconds",
)
#: The default target per signal: requests per instance, or the KV-cache fraction.
DEFAULT_TARGETS = {ScaleMetric.IN_FLIGHT: 4.0, ScaleMetric.WAITING: 1.0, ScaleMetric.KV_CACHE: 0.7}


def defaults() -> dict[str, Any]:
    return {
        "min_replicas": rollout_limits.REPLICAS.default,
        "max_replicas": rollout_limits.REPLICAS.default,
        "scale_metric": ScaleMetric.IN_FLIGHT.value,
        "scale_target": rollout_limits.SCALE_TARGET.default,
        "scale_up_window_seconds": rollout_limits.SCALE_UP_WINDOW_SECONDS.default,
        "scale_down_window_seconds": rollout_limits.SCALE_DOWN_WINDOW_SECONDS.default,
        "scale_to_zero_after_seconds": None,
    }


def resolve(
    *,
    current: dict[str, Any] | None,
    current_replicas: int | None,
    replicas: int | None,
    given: dict[str, Any],
    version: ModelVersion,
) -> dict[str, Any]:
    """The policy's fields and ``replicas`` after applying ``replicas`` and ``given`` (only the
    keys people gave; ``scale_to_zero_after_seconds: None`` turns it off) to ``current`` (None
    for a new deployment). Raises ``ValidationError`` by field."""
    unknown = set(given) - set(POLICY_SETTINGS)
    if unknown:
        raise TypeError(f"unknown scaling settings: {sorted(unknown)}")
    rollout_limits.check_settings(replicas=replicas)  # alone: it may be copied into the bounds next
    errors: dict[str, list[str]] = {}
    policy = dict(current or defaults())
    bounds_given = "min_replicas" in given or "max_replicas" in given
    if replicas is not None and not bounds_given:
        policy["min_replicas"] = policy["max_replicas"] = replicas
    if "scale_metric" in given and "scale_target" not in given:
        metric = given["scale_metric"]
        if metric in DEFAULT_TARGETS:
            policy["scale_target"] = DEFAULT_TARGETS[ScaleMetric(metric)]
    policy.update(given)
    try:
        rollout_limits.check_settings(**{k: v for k, v in policy.items() if k != "scale_metric"})
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if policy["scale_metric"] not in ScaleMetric.values:
        errors["scale_metric"] = [f"One of: {', '.join(ScaleMetric.values)}."]
    if errors:
        raise ValidationError(errors)
    low, high = policy["min_replicas"], policy["max_replicas"]
    if low > high:
        errors["max_replicas"] = [f"Must be at least min_replicas ({low})."]
    if policy["scale_metric"] == ScaleMetric.KV_CACHE and policy["scale_target"] > 1:
        errors["scale_target"] = ["KV-cache usage is a fraction: the target must be at most 1."]
    if replicas is not None and bounds_given and not low <= replicas <= high:
        errors["replicas"] = [f"Must be within min_replicas and max_replicas ({low} to {high})."]
    if policy["scale_to_zero_after_seconds"] is not None:
        why = cannot_scale_to_zero(version)
        if why:
            errors["scale_to_zero_after_seconds"] = [why]
    if errors:
        raise ValidationError(errors)
    if replicas is None:
        replicas = current_replicas if current_replicas is not None else low
    return {**policy, "replicas": max(low, min(high, replicas))}


def cannot_scale_to_zero(version: ModelVersion) -> str | None:
    """Why a deployment of ``version`` cannot scale to zero, or None: only callers that come
    through the platform's gateway can be held while an instance starts."""
    if version.api_surface == "grpc":
        return (
            f"v{version.number} is served over KServe v2 gRPC, which callers reach on the "
            "instances directly, not through the gateway: nothing could hold their requests "
            "while it is scaled to zero."
        )
    if settings.KUBERNETES_GATEWAY_NAME:
        return (
            "Requests reach instances through the cluster's Gateway API here "
            "(KUBERNETES_GATEWAY_NAME), which cannot hold them while an instance starts: scale "
            "to zero needs the platform's gateway."
        )
    return None
