"""Dashboard, models and versions. Thin: the services do the work and say what is wrong."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from portal.core.actors import Actor
from portal.core.errors import ApplicationError
from portal.deployments.models import LIVE_STATES, LIVE_WAVE_STATES
from portal.registry import services as registry_services
from portal.registry.models import Backend, Model, ModelVersion, VersionState
from portal.registry.packaging import PackagingError, described_plugins, repository_files
from portal.registry.plugins import version_plugins
from portal.web import summaries
from portal.web.forms import ModelForm, VersionForm, show_service_errors
from portal.web.teams import TeamContext, remembered_team, team_context

#: The backend advice shown beside the choice (from the product brief).
BACKEND_ADVICE = {
    Backend.VLLM: "Most LLMs: a Hugging Face model served by vLLM with continuous batching, "
    "the OpenAI API and constrained decoding. Needs only the weights and engine arguments.",
    Backend.PYTHON: "Anything vLLM does not run (rankers, classifiers, custom pre- or "
    "post-processing): your own Triton model.py with a declared tensor I/O spec.",
}


def require_write(ctx: TeamContext) -> None:
    if not ctx.can_write:
        raise PermissionDenied("Your role in this team is read only.")


def get_model(ctx: TeamContext, slug: str) -> Model:
    return get_object_or_404(Model, team=ctx.team, slug=slug)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    team = remembered_team(request)
    if team is None:
        return render(request, "web/no_team.html")
    return redirect("web:dashboard", team=team.slug)


@login_required
def dashboard(request: HttpRequest, team: str) -> HttpResponse:
    ctx = team_context(request, team)
    rows = summaries.model_rows(Model.objects.filter(team=ctx.team))
    return render(request, "web/dashboard.html", {"ctx": ctx, "rows": rows})


@login_required
@require_http_methods(["GET", "POST"])
def model_new(request: HttpRequest, team: str) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    form = ModelForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            model = registry_services.create_model(
                team=ctx.team, created_by=request.user, **form.cleaned_data
            )
        except (ValidationError, ApplicationError) as exc:
            show_service_errors(form, exc)
        else:
            return redirect("web:version_new", team=team, model=model.slug)
    return render(request, "web/model_new.html", {"ctx": ctx, "form": form})


@login_required
def model_detail(request: HttpRequest, team: str, model: str) -> HttpResponse:
    ctx = team_context(request, team)
    obj = get_model(ctx, model)
    deployments = obj.deployments.select_related("target_version", "region").order_by("-created_at")
    live = [d for d in deployments if d.observed_state in LIVE_STATES]
    versions = list(obj.versions.select_related("materialization"))
    multi = obj.multi_region.filter(observed_state__in=LIVE_WAVE_STATES).select_related(
        "target_version"
    )
    return render(
        request,
        "web/model_detail.html",
        {
            "ctx": ctx,
            "model": obj,
            "versions": versions,
            "any_ready": any(v.state == VersionState.READY for v in versions),
            "live": live,
            "multi_region": list(multi),
            "past": [d for d in deployments if d.observed_state not in LIVE_STATES][:10],
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def version_new(request: HttpRequest, team: str, model: str) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    obj = get_model(ctx, model)
    latest = obj.versions.first()
    initial = {}
    if latest is not None:  # a new version usually changes little: start from the last one
        initial = {
            "artifact_uri": latest.artifact_uri,
            "backend": latest.backend,
            "engine_args": latest.engine_args,
            "api_surface": latest.api_surface,
            "tool_call_parser": latest.tool_call_parser,
            "constraint_plugins": latest.constraint_plugins,
            "io_spec": latest.io_spec,
        }
    form = VersionForm(request.POST or None, request.FILES or None, initial=initial)
    if request.method == "POST":
        if form.is_valid():
            try:
                version = registry_services.register_version(
                    model=obj, created_by=request.user, **form.service_fields()
                )
            except (ValidationError, ApplicationError) as exc:
                show_service_errors(form, exc)
            else:
                return redirect("web:version_detail", team=team, model=model, number=version.number)
        else:
            _check_parsed_fields(form)
    return render(
        request,
        "web/version_new.html",
        {
            "ctx": ctx,
            "model": obj,
            "form": form,
            "backend_advice": BACKEND_ADVICE,
            "kept_model_py": _kept_model_py(form),
        },
    )


#: What the service is given for a field that did not parse (its errors are then dropped).
_UNPARSED = {
    "artifact_uri": "",
    "backend": Backend.VLLM,
    "engine_args": {},
    "io_spec": {},
    "api_surface": "",
    "constraint_plugins": [],
    "python_model": "",
}


def _check_parsed_fields(form: VersionForm) -> None:
    """Some fields did not parse (broken JSON, say): still check the others with the service,
    so the page lists every field's errors at once, as the API does."""
    data = form.service_fields()
    spec = {name: data.get(name, default) for name, default in _UNPARSED.items()}
    spec["api_surface"] = spec["api_surface"] or registry_services.default_api_surface(
        spec["backend"]
    )
    try:
        registry_services.check_version_spec(
            release=registry_services.default_release(),
            tool_call_parser=data.get("tool_call_parser") or "hermes",
            **spec,
        )
    except ApplicationError:
        return  # no release to check against: the submit that parses says so
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            if field in data and field in form.fields and field not in form.errors:
                form.add_error(field, messages)


def _kept_model_py(form: VersionForm) -> dict[str, str] | None:
    """The model.py to send back with a page that has errors, and its name."""
    if not form.is_bound or not form.errors:
        return None
    content = form.cleaned_data.get("python_model")
    if not content or form.cleaned_data.get("backend") == Backend.VLLM:
        return None
    return {"content": content, "name": getattr(form, "model_py_name", "model.py")}


def _version(ctx: TeamContext, model: str, number: int) -> ModelVersion:
    return get_object_or_404(
        ModelVersion.objects.select_related("model__team", "release"),
        model__team=ctx.team,
        model__slug=model,
        number=number,
    )


def _package_files(version: ModelVersion) -> dict[str, str]:
    """The generated Triton repository files, as text, for a packaged version."""
    if not version.package_digest:
        return {}
    try:
        return {
            path: content.decode("utf-8", "replace")
            for path, content in repository_files(
                version, plugins=described_plugins(version)
            ).items()
            if not path.endswith(".py")
        }
    except PackagingError as exc:
        return {"(error)": str(exc)}


@login_required
def version_detail(request: HttpRequest, team: str, model: str, number: int) -> HttpResponse:
    ctx = team_context(request, team)
    version = _version(ctx, model, number)
    return render(
        request,
        "web/version_detail.html",
        {
            "ctx": ctx,
            "version": version,
            "model": version.model,
            **_version_live_context(version),
        },
    )


def _version_live_context(version: ModelVersion) -> dict:
    return {
        "version": version,
        "plugins": version_plugins(version),
        "not_deployable": registry_services.not_deployable_reason(version),
        "copy": getattr(version, "materialization", None),
        "events": version.events.order_by("-created_at", "-id")[:20],
        "files": _package_files(version),
        "manifest_json": json.dumps(version.package_manifest, indent=2, sort_keys=True),
    }


@login_required
def version_live(request: HttpRequest, team: str, model: str, number: int) -> HttpResponse:
    """The part of the version page that changes while workers copy and package it."""
    ctx = team_context(request, team)
    version = _version(ctx, model, number)
    return render(request, "web/_version_live.html", {"ctx": ctx, **_version_live_context(version)})


@login_required
@require_http_methods(["POST"])
def version_retry(request: HttpRequest, team: str, model: str, number: int) -> HttpResponse:
    ctx = team_context(request, team)
    require_write(ctx)
    version = _version(ctx, model, number)
    source = request.POST.get("artifact_uri", "").strip() or None
    try:
        registry_services.retry_version(
            version, actor=Actor.for_request(request.user), artifact_uri=source
        )
    except ApplicationError as exc:
        messages.error(request, exc.message)
    except ValidationError as exc:
        messages.error(request, f"Not retried: {' '.join(exc.messages)}")
    return redirect("web:version_detail", team=team, model=model, number=number)
