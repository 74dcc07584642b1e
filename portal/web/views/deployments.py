"""Deploying, the live deployment page, its actions, and the metrics charts."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from portal.core.actors import Actor
from portal.core.errors import ApplicationError
from portal.deployments import costs
from portal.deployments import services as deployment_services
from portal.deployments.lifecycle import Action
from portal.deployments.models import LIVE_STATES, Deployment
from portal.deployments.rollout.status import describe
from portal.deployments.scaling_policy import POLICY_SETTINGS
from portal.deployments.traffic.routing import endpoint_url
from portal.metrics import services as metrics
from portal.registry import services as registry_services
from portal.registry.diff import version_diff
from portal.registry.models import VersionState
from portal.registry.packaging import triton_model_name
from portal.web import summaries
from portal.web.canary import canary_context, chart_windows
from portal.web.forms import DeployForm, show_service_errors
from portal.web.playground import playground_context
from portal.web.scaling import scaling_context
from portal.web.snippets import call_context
from portal.web.teams import TeamContext, team_context
from portal.web.timeline import group_by_rollout
from portal.web.views.registry import get_model, require_write

#: The window the charts open on (static/web/charts.js offers the others of RANGES).
CHART_RANGE = "1h"
CHART_RANGE_LABELS = {"15m": "15 min", "1h": "1 h", "6h": "6 h", "24h": "24 h"}
CHART_WINDOW = timedelta(minutes=metrics.RANGES[CHART_RANGE])


@login_required
@require_http_methods(["GET", "POST"])
def deploy(request: HttpRequest, team: str, model: str) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    obj = get_model(ctx, model)
    if not obj.versions.exists():
        messages.info(request, "Register a version before deploying.")
        return redirect("web:version_new", team=team, model=model)
    serving = deployment_services.live_red_black(obj)
    candidates = obj.versions.exclude(state=VersionState.FAILED)
    initial: dict[str, Any] = {
        "version": candidates.filter(state=VersionState.READY).first() or candidates.first()
    }
    if serving is not None:  # a rollout keeps the deployment's shape unless changed here
        initial.update(
            replicas=serving.replicas,
            instance_type=serving.instance_type,
            stages=", ".join(str(s) for s in serving.stages),
            bake_seconds=serving.bake_seconds,
            health_deadline_seconds=serving.health_deadline_seconds,
            max_error_rate=serving.max_error_rate,
            canary_analysis=serving.canary_analysis,
            canary_policy=serving.canary_policy,
            # Its scaling policy, as it is: posted back unchanged, it stays as it is.
            autoscale=serving.min_replicas < serving.max_replicas
            or serving.scale_to_zero_after_seconds is not None,
            **{name: getattr(serving, name) for name in POLICY_SETTINGS},
        )
    # The version the link names, and nothing else: one that cannot deploy is explained, never
    # swapped for another (the form then asks which to deploy). One still being copied or
    # packaged can deploy (the controller waits for it), which the page says.
    not_deployable = waits_for = None
    asked = request.GET.get("version", "")
    if asked:
        named = (
            obj.versions.filter(number=asked).first()
            if asked.isdigit() and len(asked) < 10
            else None
        )
        if named is None:
            not_deployable = f"{obj.slug} has no version {asked}."
        elif named.state == VersionState.FAILED:
            not_deployable = registry_services.not_deployable_reason(named)
        elif named.state != VersionState.READY:
            waits_for = registry_services.not_deployable_reason(named)
        initial["version"] = None if not_deployable else named
    shown = initial["version"]
    if request.method == "POST" and str(request.POST.get("version", "")).isdigit():
        shown = candidates.filter(pk=request.POST["version"]).first()
    form = DeployForm(
        request.POST or None,
        model=obj,
        initial=initial,
        instance_types=deployment_services.instance_types_for(shown),
    )
    # The advice is about the version being deployed: the one posted (as the form's own field
    # cleaned it), else the one the page offers.
    valid = form.is_bound and form.is_valid()
    version = form.cleaned_data.get("version") if form.is_bound else initial["version"]
    advice = None
    if version is not None and version.state != VersionState.FAILED:
        advice = deployment_services.advise_strategy(obj, version, serving)
    if valid:
        deployment = _deploy(request, obj, form)
        if deployment is not None:
            return redirect("web:deployment_detail", team=team, pk=deployment.pk)
    return render(
        request,
        "web/deploy.html",
        {
            "ctx": ctx,
            "model": obj,
            "form": form,
            "advice": advice,
            "serving": serving,
            "not_deployable": not_deployable,
            "waits_for": waits_for,
            "nothing_to_deploy": not candidates.exists(),
            "hours_per_month": costs.HOURS_PER_MONTH,
            "no_price": costs.NO_PRICE,
            # What changes from the serving version to the one being deployed.
            "diff": (
                version_diff(serving.target_version, version)
                if serving is not None and version is not None
                else None
            ),
            "diff_version": version,
        },
    )


def _deploy(request, model, form: DeployForm) -> Deployment | None:
    """Deploy as the API does (:func:`~portal.deployments.services.deploy` decides whether
    this creates a deployment or rolls the live Red-Black one); a refusal goes on the form."""
    try:
        deployed = deployment_services.deploy(
            model=model, actor=Actor.for_request(request.user), **form.service_fields()
        )
    except (ValidationError, ApplicationError) as exc:
        show_service_errors(form, exc)
        return None
    return deployed.deployment


def get_deployment(ctx: TeamContext, pk: int) -> Deployment:
    return get_object_or_404(
        Deployment.objects.select_related(
            "model__team", "target_version", "previous_version", "instance_type", "region"
        ),
        model__team=ctx.team,
        pk=pk,
    )


def _live_context(deployment: Deployment, seen: int | None, seen_state: str | None) -> dict:
    """What the live part of the deployment page shows; ``seen`` is the newest event id the
    browser already showed, so what arrived since is marked."""
    instances = list(
        deployment.instances.filter(state__in=summaries.SHOWN_INSTANCE_STATES).select_related(
            "version"
        )
    )
    events = list(deployment.events.order_by("-created_at", "-id")[:50])
    fresh = [e.pk for e in events if seen is not None and e.pk > seen]
    # A region's part of a multi-region deployment takes its actions from that one's page
    # (the service refuses them here).
    actions = [] if deployment.multi_region_id else summaries.available_actions(deployment)
    return {
        "tag": _tag(deployment, instances, events),
        "deployment": deployment,
        "instances": instances,
        "events": events,
        "timeline": group_by_rollout(events),
        "fresh": fresh,
        "newest_event": events[0].pk if events else 0,
        "state_changed": seen_state is not None and seen_state != deployment.observed_state,
        # One status (headline, stage, badge, bar) for the whole live part.
        "status": describe(deployment, instances),
        "actions": actions,
        "action_names": [name for name, _ in actions],
        # The scaling panel (policy, count, sleep and wake, last decisions): portal.web.scaling.
        **scaling_context(deployment, instances),
    }


def _tag(deployment: Deployment, instances: list, events: list) -> str:
    """Changes whenever anything the live part shows changes (a poll that finds the same tag
    is answered 204, so the browser keeps the page, its focus and its highlights)."""
    parts = [deployment.updated_at.isoformat(), str(events[0].pk if events else 0)]
    parts += [f"{i.pk}:{i.state}:{i.health_message}" for i in instances]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _wave_count(deployment: Deployment) -> int:
    """How many waves (regions) the deployment's multi-region deployment has; 0 without one."""
    if deployment.multi_region_id is None:
        return 0
    return Deployment.objects.filter(multi_region_id=deployment.multi_region_id).count()


@login_required
def deployment_detail(request: HttpRequest, team: str, pk: int) -> HttpResponse:
    ctx = team_context(request, team)
    deployment = get_deployment(ctx, pk)
    live = _live_context(deployment, None, None)
    return render(
        request,
        "web/deployment_detail.html",
        {
            "ctx": ctx,
            "model": deployment.model,
            "endpoint": endpoint_url(deployment),
            "served_model_name": triton_model_name(deployment.target_version),
            **call_context(deployment),
            **playground_context(deployment),
            **live,
            # Each judged bake, metric by metric (portal.web.canary).
            **canary_context(deployment),
            "wave_count": _wave_count(deployment),
            # What it costs as the page loads (the live part refreshes, this line does not),
            # from the running instances the live part already read.
            "cost": costs.summary(costs.deployment_estimate(deployment, live["instances"])),
        },
    )


@login_required
def deployment_live(request: HttpRequest, team: str, pk: int) -> HttpResponse:
    ctx = team_context(request, team)
    deployment = get_deployment(ctx, pk)
    seen = request.GET.get("seen", "")
    context = _live_context(
        deployment, int(seen) if seen.isdigit() else None, request.GET.get("state")
    )
    if request.GET.get("tag") == context["tag"]:
        return HttpResponse(status=204)
    return render(
        request,
        "web/_deployment_live.html",
        {"ctx": ctx, **context},
    )


@login_required
@require_http_methods(["POST"])
def deployment_act(request: HttpRequest, team: str, pk: int, action: str) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    deployment = get_deployment(ctx, pk)
    ask_for(request, action, deployment, deployment_services.act, "the controller acts on it")
    return redirect("web:deployment_detail", team=team, pk=pk)


def ask_for(
    request: HttpRequest, action: str, target: Any, act: Callable[..., Any], then: str
) -> None:
    """Ask ``act`` (a service's pause/resume/promote/abort/rollback) for ``action`` on
    ``target`` as the signed-in person, and say how it went: a refused action is a message on
    the page, an unknown one a 404."""
    try:
        what = Action(action)
    except ValueError as exc:
        raise Http404("No such action.") from exc
    try:
        act(
            target,
            what,
            actor=Actor.for_request(request.user),
            reason=request.POST.get("reason", "")[:500],
        )
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{what.capitalize()} requested; {then}.")


def _charts_context(deployments: list[Deployment], api_url: str) -> dict:
    """What the charts' fragment needs before its script takes over: the API it reads, the
    ranges, and (for a page without JavaScript, and the first paint) sources and emptiness."""
    since = timezone.now() - CHART_WINDOW
    has_points = metrics.has_points(deployments, since)
    sources = [s for d in deployments for s in metrics.source_status(d)]
    return {
        "api_url": api_url,
        "ranges": [(key, CHART_RANGE_LABELS[key]) for key in metrics.RANGES],
        "default_range": CHART_RANGE,
        "has_points": has_points,
        "sources": sources,
        "sources_down": [s for s in sources if not s.up],
        "live": any(d.observed_state in LIVE_STATES for d in deployments),
        "scrape_seconds": f"{settings.METRICS_SCRAPE_SECONDS:g}",
    }


@login_required
def deployment_metrics(request: HttpRequest, team: str, pk: int) -> HttpResponse:
    ctx = team_context(request, team)
    deployment = get_deployment(ctx, pk)
    return render(
        request,
        "web/_metrics.html",
        {
            "ctx": ctx,
            "scope": "deployment",
            **_charts_context([deployment], reverse("deployment-metrics", args=[deployment.pk])),
            # Shaded on the charts, so a verdict can be read against the lines it was made on.
            "analysis_windows": chart_windows(list(deployment.analyses.all())),
        },
    )


@login_required
def model_metrics(request: HttpRequest, team: str, model: str) -> HttpResponse:
    ctx = team_context(request, team)
    obj = get_model(ctx, model)
    since = timezone.now() - CHART_WINDOW
    deployments = list(
        obj.deployments.filter(
            Q(observed_state__in=LIVE_STATES) | Q(metric_points__at__gte=since)
        ).distinct()
    )
    return render(
        request,
        "web/_metrics.html",
        {
            "ctx": ctx,
            "scope": "model",
            **_charts_context(deployments, reverse("model-metrics", args=[obj.pk])),
        },
    )
