"""The REST API under ``/api/v1/``: thin views over the services, scoped to the caller's teams.

Objects of teams the caller cannot read do not exist for it (404); a viewer's writes are 403.
A body field that names another team's object reads as unknown (400), like a missing one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response

from portal.accounts.access import Access, access_for, default_team
from portal.accounts.models import CallerKey, Team
from portal.api import filters, idempotency, log_follow, log_serializers
from portal.api import serializers as s
from portal.api.idempotency import idempotent
from portal.api.schema import CONFLICT, error
from portal.core.actors import Actor
from portal.deployments import services as deployment_services
from portal.deployments.lifecycle import Action
from portal.deployments.models import (
    Deployment,
    DeploymentEvent,
    Instance,
    InstanceType,
    MultiRegionDeployment,
    Region,
)
from portal.deployments.regions import multi_region
from portal.deployments.regions.multi_region import RegionPart
from portal.deployments.runtime import logs as instance_logs
from portal.deployments.runtime.launchers.base import LogCursorError
from portal.deployments.traffic import caller_keys
from portal.metrics import services as metrics_services
from portal.registry import services as registry_services
from portal.registry.models import Model, ModelVersion, PlatformRelease, PluginWheel

IDEMPOTENCY_KEY = OpenApiParameter(
    idempotency.HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Any unique string (at most 255 printable characters): a retry with the same "
    "key and body replays the first answer instead of acting twice.",
)
#: What creating calls answer besides their own result (see portal.api.idempotency).
IDEMPOTENT_ERRORS = {
    422: error(f"This {idempotency.HEADER} was already used for a different request."),
}


#: The schema of the deployment actions (pause, resume, abort, promote, rollback).
ACTION_SCHEMA: dict[str, Any] = {
    "request": s.ActionIn,
    "responses": {200: s.DeploymentOut, 409: CONFLICT, **IDEMPOTENT_ERRORS},
    "parameters": [IDEMPOTENCY_KEY],
}
#: The schema of the multi-region deployment actions.
MULTI_REGION_ACTION_SCHEMA: dict[str, Any] = {
    **ACTION_SCHEMA,
    "responses": {200: s.MultiRegionDeploymentOut, 409: CONFLICT, **IDEMPOTENT_ERRORS},
}


def instance_type_named(name: str, field: str = "instance_type") -> InstanceType:
    """The instance type called ``name``, else a 400 on ``field``."""
    instance_type = InstanceType.objects.filter(name=name).first()
    if instance_type is None:
        raise ValidationError({field: [f"No instance type {name!r}."]})
    return instance_type


def region_named(name: str, field: str = "region") -> Region:
    """The region called ``name``, else a 400 on ``field``."""
    region = Region.objects.filter(name=name).first()
    if region is None:
        raise ValidationError({field: [f"No region {name!r}."]})
    return region


class ScopedViewSet(viewsets.GenericViewSet):
    """Base for team-owned resources. ``team_field`` is the lookup path to the owning team."""

    team_field = "team"

    @property
    def access(self) -> Access:
        if not hasattr(self, "_access"):
            self._access = access_for(self.request.user, self.request.auth)
        return self._access

    @property
    def actor(self) -> Actor:
        return Actor.for_request(self.request.user, self.request.auth)

    def get_queryset(self):
        return self.access.filter_teams(super().get_queryset(), self.team_field)

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "access": self.access}

    def require_write(self, team_id: int) -> None:
        if not self.access.can_write(team_id):
            raise PermissionDenied("Your role in this team is viewer: you can read but not change.")

    def readable(self, queryset, pk: int, field: str, team_field: str):
        """The object with ``pk`` that the caller can read, else a 400 on ``field``."""
        obj = self.access.filter_teams(queryset, team_field).filter(pk=pk).first()
        if obj is None:
            raise ValidationError({field: [f"No {field} with id {pk}."]})
        return obj

    def valid_input(self, serializer_class, **kwargs) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data, **kwargs)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def answer(self, serializer_class, obj, status_code: int = status.HTTP_200_OK) -> Response:
        return Response(
            serializer_class(obj, context=self.get_serializer_context()).data, status=status_code
        )

    def _team_for_create(self, slug: str | None) -> Team:
        """The team a create call names, or, naming none, the caller's only writable team."""
        if slug is None:
            team = default_team(self.access)
            if team is None:
                raise ValidationError(
                    {"team": ["Required: you can write to more than one team, or none."]}
                )
            return team
        team = self.access.filter_teams(Team.objects.all(), "pk").filter(slug=slug).first()
        if team is None:
            raise ValidationError({"team": [f"No team {slug!r}."]})
        return team

    def metrics_answer(self, deployments: list[Deployment]) -> Response:
        """The deployments' merged points over ``?range=`` (or the last ``?minutes=``), split by
        version too, the timeline's marks, their sources and the charts' descriptions."""
        query = s.MetricsQuery(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        until = timezone.now()
        window = timedelta(minutes=query.validated_data["minutes"])
        since, step = until - window, metrics_services.bin_seconds(window)
        by_version = metrics_services.version_series(deployments, since, step)
        body = {
            "since": since,
            "until": until,
            "step": step,
            "points": metrics_services.series(deployments, since, step),
            "versions": [{"version": n, "points": p} for n, p in by_version.items()],
            "markers": metrics_services.markers(deployments, since),
            "sources": [src for d in deployments for src in metrics_services.source_status(d)],
            "charts": metrics_services.CHARTS,
        }
        return Response(s.MetricsOut(body).data)


class TeamViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Team.objects.all()
    serializer_class = s.TeamOut
    team_field = "pk"
    lookup_field = "slug"


class ReleaseViewSet(viewsets.ReadOnlyModelViewSet):
    """Platform releases: which Triton image and vLLM version new versions are packaged with."""

    queryset = PlatformRelease.objects.all()
    serializer_class = s.ReleaseOut
    filterset_class = filters.ReleaseFilter


class RegionViewSet(viewsets.ReadOnlyModelViewSet):
    """The regions deployments can run in, the default one first: where callers reach each,
    and which instance types it offers."""

    queryset = Region.objects.filter(is_active=True).prefetch_related("instance_types")
    serializer_class = s.RegionOut
    lookup_field = "name"


class InstanceTypeViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = InstanceType.objects.filter(is_active=True)
    serializer_class = s.InstanceTypeOut
    lookup_field = "name"


# The registry's models (portal.registry.models.Model), named apart from DRF's ModelViewSet.
class RegisteredModelViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Model.objects.select_related("team")
    serializer_class = s.ModelOut
    filterset_class = filters.ModelFilter
    ordering_fields = ["slug", "created_at"]

    @extend_schema(
        request=s.ModelCreateIn,
        responses={201: s.ModelOut, **IDEMPOTENT_ERRORS},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent
    def create(self, request):
        data = self.valid_input(s.ModelCreateIn)
        team = self._team_for_create(data.get("team"))
        self.require_write(team.pk)
        model = registry_services.create_model(
            team=team,
            slug=data["slug"],
            task=data["task"],
            description=data["description"],
            created_by=self.actor.user,
        )
        return self.answer(s.ModelOut, model, status.HTTP_201_CREATED)

    @extend_schema(request=s.ModelUpdateIn, responses=s.ModelOut)
    def partial_update(self, request, pk=None):
        model = self.get_object()
        self.require_write(model.team_id)
        data = self.valid_input(s.ModelUpdateIn, partial=True)
        registry_services.update_model(model, description=data.get("description"))
        return self.answer(s.ModelOut, model)

    @extend_schema(parameters=[s.MetricsQuery], responses=s.MetricsOut)
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """Serving metrics of all the model's deployments merged, one point per scrape pass."""
        return self.metrics_answer(list(self.get_object().deployments.all()))


class PluginWheelViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """Author plugin wheels (vLLM ``general_plugins`` and ``logits_processors`` entry points),
    uploaded once and named by versions at registration. Each is read without running any of
    its code, and refused with the reason: not a wheel, tags the serving image cannot install,
    no entry point, requirements the release's serving image does not meet, over the size
    limit. Stored by sha256: the same bytes uploaded again answer the existing one (200)."""

    queryset = PluginWheel.objects.select_related("team")
    serializer_class = s.PluginWheelOut
    parser_classes = [MultiPartParser]
    ordering_fields = ["name", "created_at"]

    @extend_schema(
        request={"multipart/form-data": s.PluginWheelUploadIn},
        responses={
            201: s.PluginWheelOut,
            200: s.PluginWheelOut,
            415: error("The body is not multipart/form-data, or its media type is unreadable."),
        },
    )
    def create(self, request):
        data = self.valid_input(s.PluginWheelUploadIn)
        team = self._team_for_create(data.get("team"))
        self.require_write(team.pk)
        upload = data["wheel"]
        wheel, created = registry_services.upload_plugin_wheel(
            team=team,
            chunks=upload.chunks(),
            filename=upload.name,
            created_by=self.actor.user,
        )
        return self.answer(
            s.PluginWheelOut, wheel, status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class VersionViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = ModelVersion.objects.select_related(
        "model__team", "release", "materialization"
    ).prefetch_related("plugins")
    serializer_class = s.VersionOut
    filterset_class = filters.VersionFilter
    team_field = "model__team"
    ordering_fields = ["number", "created_at"]

    @extend_schema(
        request=s.VersionCreateIn,
        responses={201: s.VersionOut, 409: CONFLICT, **IDEMPOTENT_ERRORS},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent
    def create(self, request):
        data = self.valid_input(s.VersionCreateIn)
        model = self.readable(Model.objects.all(), data.pop("model"), "model", "team")
        self.require_write(model.team_id)
        version = registry_services.register_version(
            model=model, created_by=self.actor.user, **data
        )
        return self.answer(s.VersionOut, version, status.HTTP_201_CREATED)

    # All of them, unpaginated and unfiltered: a version has a handful of moves, and the list's
    # filters are the versions' own, not the events'.
    @extend_schema(responses=s.VersionEventOut(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def events(self, request, pk=None):
        """The version's lifecycle moves, oldest first (materialization, packaging, failures)."""
        version = self.get_object()
        return Response(s.VersionEventOut(version.events.all(), many=True).data)

    @extend_schema(request=s.VersionUpdateIn, responses={200: s.VersionOut, 409: CONFLICT})
    def partial_update(self, request, pk=None):
        version = self.get_object()
        self.require_write(version.model.team_id)
        data = self.valid_input(s.VersionUpdateIn, partial=True)
        version = registry_services.update_version(version, **data)
        return self.answer(s.VersionOut, version)

    @extend_schema(request=s.VersionRetryIn, responses={200: s.VersionOut, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """Start a failed version again from the top (its failure reason was acted on), from a
        corrected ``artifact_uri`` if given; copies of the same source resume from what earlier
        attempts left in the cache's staging area."""
        version = self.get_object()
        self.require_write(version.model.team_id)
        data = self.valid_input(s.VersionRetryIn)
        version = registry_services.retry_version(
            version, actor=self.actor, artifact_uri=data.get("artifact_uri")
        )
        return self.answer(s.VersionOut, version)


class DeploymentViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Deployment.objects.select_related(
        "model__team", "target_version", "previous_version", "instance_type", "region"
    ).prefetch_related("instances__version")
    serializer_class = s.DeploymentOut
    filterset_class = filters.DeploymentFilter
    team_field = "model__team"
    ordering_fields = ["created_at", "updated_at"]

    @extend_schema(
        request=s.DeploymentCreateIn,
        responses={201: s.DeploymentOut, 200: s.DeploymentOut, 409: CONFLICT, **IDEMPOTENT_ERRORS},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent
    def create(self, request):
        """Deploy a version: a new deployment (201), or, Red-Black onto a model whose Red-Black
        deployment is live, that deployment rolled onto the version (200)."""
        data = self.valid_input(s.DeploymentCreateIn)
        model = self.readable(Model.objects.all(), data["model"], "model", "team")
        self.require_write(model.team_id)
        version = self.readable(
            ModelVersion.objects.all(), data["version"], "version", "model__team"
        )
        instance_type = instance_type_named(data["instance_type"])
        region = region_named(data["region"]) if "region" in data else None
        deployed = deployment_services.deploy(
            model=model,
            strategy=data["strategy"],
            version=version,
            instance_type=instance_type,
            actor=self.actor,
            replicas=data.get("replicas"),
            stages=data.get("stages"),
            bake_seconds=data.get("bake_seconds"),
            health_deadline_seconds=data.get("health_deadline_seconds"),
            max_error_rate=data.get("max_error_rate"),
            canary_analysis=data.get("canary_analysis"),
            canary_policy=data.get("canary_policy"),
            allow_io_change=data["allow_io_change"],
            scaling=s.ScalingPolicyIn.policy_given(data),
            region=region,
        )
        return self.answer(
            s.DeploymentOut,
            deployed.deployment,
            status.HTTP_201_CREATED if deployed.created else status.HTTP_200_OK,
        )

    @extend_schema(parameters=[s.AdviceQuery], responses=s.AdviceOut)
    @action(detail=False, methods=["get"], url_path="advice")
    def advice(self, request):
        """Which strategy fits rolling out a version, and why (stable interface → Red-Black;
        changed interface → Versioned, at the cost of running both versions for a while)."""
        query = s.AdviceQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        version = self.readable(
            ModelVersion.objects.select_related("model"),
            query.validated_data["version"],
            "version",
            "model__team",
        )
        advice = deployment_services.advise_strategy(version.model, version)
        return Response(s.AdviceOut(advice).data)

    @extend_schema(request=s.DeploymentUpdateIn, responses={200: s.DeploymentOut, 409: CONFLICT})
    def partial_update(self, request, pk=None):
        deployment = self.get_object()
        self.require_write(deployment.model.team_id)
        data = self.valid_input(s.DeploymentUpdateIn, partial=True)
        version = None
        if "version" in data:
            version = self.readable(
                ModelVersion.objects.all(), data["version"], "version", "model__team"
            )
        deployment = deployment_services.update_deployment(
            deployment,
            actor=self.actor,
            version=version,
            replicas=data.get("replicas"),
            allow_io_change=data.get("allow_io_change", False),
            scaling=s.ScalingPolicyIn.policy_given(data),
            **{k: data[k] for k in deployment_services.ROLLOUT_SETTINGS if k in data},
        )
        return self.answer(s.DeploymentOut, deployment)

    # All of them, oldest first and unpaginated: a rollout has a few bakes, each judged once
    # (more when a bake is extended for want of data).
    @extend_schema(responses=s.StageAnalysisOut(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def analysis(self, request, pk=None):
        """The canary analysis of each bake: both versions' metrics side by side with their
        verdicts, the score, the decision (promote, hold, rollback, not_enough_data) and what
        the rollout did. A pipeline waits on a rollout by polling this and the deployment's
        ``observed_state``."""
        deployment = self.get_object()
        return Response(s.StageAnalysisOut(deployment.analyses.all(), many=True).data)

    @extend_schema(parameters=[s.MetricsQuery], responses=s.MetricsOut)
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """Serving metrics of the deployment's instances, one point per scrape pass."""
        return self.metrics_answer([self.get_object()])

    def _act(self, request, pk, what: Action) -> Response:
        deployment = self.get_object()
        self.require_write(deployment.model.team_id)
        data = self.valid_input(s.ActionIn)
        deployment = deployment_services.act(
            deployment, what, actor=self.actor, reason=data["reason"]
        )
        return self.answer(s.DeploymentOut, deployment)

    @extend_schema(**ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def pause(self, request, pk=None):
        return self._act(request, pk, Action.PAUSE)

    @extend_schema(**ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def resume(self, request, pk=None):
        return self._act(request, pk, Action.RESUME)

    @extend_schema(**ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def abort(self, request, pk=None):
        return self._act(request, pk, Action.ABORT)

    @extend_schema(**ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def promote(self, request, pk=None):
        return self._act(request, pk, Action.PROMOTE)

    @extend_schema(**ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def rollback(self, request, pk=None):
        return self._act(request, pk, Action.ROLLBACK)


class MultiRegionDeploymentViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """A model served Red-Black in several regions, rolled out to a new version one region
    (wave) at a time, with a bake between waves; act on it here, not on its regions'
    deployments."""

    queryset = multi_region.with_regions()
    serializer_class = s.MultiRegionDeploymentOut
    team_field = "model__team"
    ordering_fields = ["created_at", "updated_at"]

    def _fresh(self, group: MultiRegionDeployment) -> MultiRegionDeployment:
        """``group`` read again as the answer shows it (its regions as they are now)."""
        return self.get_queryset().get(pk=group.pk)

    @extend_schema(
        request=s.MultiRegionCreateIn,
        responses={201: s.MultiRegionDeploymentOut, 409: CONFLICT, **IDEMPOTENT_ERRORS},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent
    def create(self, request):
        """Deploy a version Red-Black in every region named, one wave per region in the order
        given: the first starts now, each next once the previous serves it and baked."""
        data = self.valid_input(s.MultiRegionCreateIn)
        model = self.readable(Model.objects.all(), data["model"], "model", "team")
        self.require_write(model.team_id)
        version = self.readable(
            ModelVersion.objects.all(), data["version"], "version", "model__team"
        )
        parts = [
            RegionPart(
                region=region_named(part["region"], "regions"),
                replicas=part.get("replicas"),
                instance_type=(
                    instance_type_named(part["instance_type"], "regions")
                    if part.get("instance_type")
                    else None
                ),
            )
            for part in data["regions"]
        ]
        group = multi_region.create(
            model=model,
            version=version,
            regions=parts,
            instance_type=instance_type_named(data["instance_type"]),
            actor=self.actor,
            on_region_failure=data["on_region_failure"],
            wave_bake_seconds=data.get("wave_bake_seconds"),
            **{name: data[name] for name in s.MultiRegionCreateIn.ROLLOUT if name in data},
        )
        return self.answer(s.MultiRegionDeploymentOut, self._fresh(group), status.HTTP_201_CREATED)

    @extend_schema(
        request=s.MultiRegionUpdateIn, responses={200: s.MultiRegionDeploymentOut, 409: CONFLICT}
    )
    def partial_update(self, request, pk=None):
        """Roll every region to another version, one wave at a time."""
        group = self.get_object()
        self.require_write(group.team_id)
        data = self.valid_input(s.MultiRegionUpdateIn)
        version = self.readable(
            ModelVersion.objects.all(), data["version"], "version", "model__team"
        )
        group = multi_region.roll_out(
            group, version, actor=self.actor, allow_io_change=data["allow_io_change"]
        )
        return self.answer(s.MultiRegionDeploymentOut, self._fresh(group))

    def _act(self, request, pk, what: Action) -> Response:
        group = self.get_object()
        self.require_write(group.team_id)
        data = self.valid_input(s.ActionIn)
        group = multi_region.act(group, what, actor=self.actor, reason=data["reason"])
        return self.answer(s.MultiRegionDeploymentOut, self._fresh(group))

    @extend_schema(**MULTI_REGION_ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def pause(self, request, pk=None):
        return self._act(request, pk, Action.PAUSE)

    @extend_schema(**MULTI_REGION_ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def resume(self, request, pk=None):
        return self._act(request, pk, Action.RESUME)

    @extend_schema(**MULTI_REGION_ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def abort(self, request, pk=None):
        return self._act(request, pk, Action.ABORT)

    @extend_schema(**MULTI_REGION_ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def promote(self, request, pk=None):
        return self._act(request, pk, Action.PROMOTE)

    @extend_schema(**MULTI_REGION_ACTION_SCHEMA)
    @action(detail=True, methods=["post"])
    @idempotent
    def rollback(self, request, pk=None):
        return self._act(request, pk, Action.ROLLBACK)


class EventViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """A deployment's timeline, oldest first: filter by ``deployment`` and ``after_id`` to follow it."""

    queryset = DeploymentEvent.objects.all()
    serializer_class = s.EventOut
    filterset_class = filters.EventFilter
    team_field = "deployment__model__team"


class InstanceViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    queryset = Instance.objects.select_related("version")
    serializer_class = s.InstanceOut
    filterset_class = filters.InstanceFilter
    team_field = "deployment__model__team"

    @extend_schema(
        parameters=[log_serializers.LogQuery],
        responses={
            200: log_serializers.LogOut,
            400: error("A bad since or tail."),
            429: error("Too many follows open, yours or the portal process's: see Retry-After."),
            503: error("The log's source (a cluster's API server) did not answer."),
        },
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def logs(self, request, pk=None):
        """The instance's log, bounded: the last ``tail`` lines, or those after ``since`` (the
        previous answer's ``next``). ``follow=1`` waits up to 20 s for new lines, then answers,
        possibly with none: call again with ``next`` to keep following. Each user may hold a
        few follows open at once (429 past that; see :mod:`portal.api.log_follow`)."""
        query = log_serializers.LogQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        instance = self.get_object()
        since = query.validated_data.get("since") or None
        tail = query.validated_data["tail"]
        try:
            if query.validated_data["follow"] and since is not None:
                if log_follow.waits_on_event_loop(request):
                    return log_follow.follow_answer(request, instance, since=since, tail=tail)
                chunk = instance_logs.follow_instance_log(instance, since=since, tail=tail)
            else:
                chunk = instance_logs.read_instance_log(instance, since=since, tail=tail)
        except LogCursorError as exc:
            raise ValidationError({"since": [str(exc)]}) from exc
        body = {"lines": chunk.lines, "next": chunk.next, "ended": chunk.ended}
        return Response(log_serializers.LogOut(body).data)


class CallerKeyViewSet(ScopedViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """Keys that programs present to the gateway to call the team's models (``Authorization:
    Bearer mlk_...``). Not API tokens: they cannot call this API, and API tokens cannot call
    models. The plaintext is in the create answer only; revoking keeps the key listed."""

    queryset = CallerKey.objects.select_related("team", "created_by").prefetch_related("models")
    serializer_class = s.CallerKeyOut

    # Not @idempotent: a replayed answer is stored, and this one holds the plaintext, which
    # must never be stored. A retried create makes a second key; revoke the one not kept.
    @extend_schema(request=s.CallerKeyCreateIn, responses={201: s.CallerKeyCreatedOut})
    def create(self, request):
        """Issue a key; the answer's ``key`` is its plaintext, shown this once."""
        data = self.valid_input(s.CallerKeyCreateIn)
        team = self._team_for_create(data.pop("team", None))
        self.require_write(team.pk)
        try:
            issued = caller_keys.issue_caller_key(
                team=team,
                models=caller_keys.team_models(team, data.pop("models")),
                created_by=self.actor.user,
                **data,
            )
        except caller_keys.CallerKeyError as exc:
            raise ValidationError({exc.field or "non_field_errors": [exc.message]}) from exc
        return Response(
            s.CallerKeyCreatedOut(
                issued.key, context={**self.get_serializer_context(), "plaintext": issued.plaintext}
            ).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=None, responses={200: s.CallerKeyOut})
    def destroy(self, request, pk=None):
        """Revoke the key: gateways refuse it about a second later. It stays listed, revoked;
        revoking it again changes nothing."""
        key = self.get_object()
        self.require_write(key.team_id)
        caller_keys.revoke_caller_keys(CallerKey.objects.filter(pk=key.pk))
        key.refresh_from_db()
        return self.answer(s.CallerKeyOut, key)
