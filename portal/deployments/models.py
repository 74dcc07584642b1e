"""Deployments put a model version in front of callers; instances are what actually serve.

A deployment stores *desired* state (version, replicas, strategy, desired_state) written by
people, and *observed* state (observed_state, current_stage) written by the rollout controller.
Every change to either is recorded as a :class:`DeploymentEvent`.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from portal.core.models import AppendOnlyModel
from portal.deployments.state import rollout_limits
from portal.deployments.state.autoscaling import ScaleMetric, ScalingState
from portal.deployments.state.rollout_limits import (
    default_stages,  # the initial migration names it here
)
from portal.deployments.state.rollout_state import (
    RolloutStep,
    Traffic,
    traffic_from_json,
    traffic_to_json,
)
from portal.registry.models import Backend, Model, ModelVersion
from serving.instance.engines import engine_for_gpus


def all_backends() -> list[str]:
    """An instance type's default: every backend (both engines serve both)."""
    return list(Backend.values)


class TrafficField(models.JSONField):
    """A traffic split, :data:`~.rollout_state.Traffic` in Python (version numbers as ints),
    a JSON object in the database (numbers as its keys)."""

    def from_db_value(self, value, expression, connection) -> Traffic:
        return traffic_from_json(super().from_db_value(value, expression, connection))

    def get_prep_value(self, value):
        return super().get_prep_value(traffic_to_json(value) if value is not None else None)

    def value_to_string(self, obj):
        return traffic_to_json(self.value_from_object(obj))


class RolloutStepField(models.JSONField):
    """The controller's :class:`~.rollout_state.RolloutStep`, stored as its JSON."""

    def from_db_value(self, value, expression, connection) -> RolloutStep:
        return RolloutStep.from_json(super().from_db_value(value, expression, connection))

    def get_prep_value(self, value):
        if isinstance(value, RolloutStep):
            value = value.to_json()
        return super().get_prep_value(value)

    def value_to_string(self, obj):
        return self.value_from_object(obj).to_json()


class ScalingStateField(models.JSONField):
    """The autoscaler's :class:`~.autoscaling.ScalingState`, stored as its JSON."""

    def from_db_value(self, value, expression, connection) -> ScalingState:
        return ScalingState.from_json(super().from_db_value(value, expression, connection))

    def get_prep_value(self, value):
        if isinstance(value, ScalingState):
            value = value.to_json()
        return super().get_prep_value(value)

    def value_to_string(self, obj):
        return self.value_from_object(obj).to_json()


class Engine(models.TextChoices):
    """What serves an instance: Triton in the serving image, or the CPU engine."""

    AUTO = "auto", "Automatic (Triton with GPUs, else the CPU engine)"
    TRITONSERVER = "tritonserver", "Triton (tritonserver, the serving image)"
    CPU = "cpu", "CPU engine (python -m serving.kserve)"


class InstanceType(models.Model):
    """An operator-defined machine shape an instance runs on (maps to Kubernetes scheduling)."""

    name = models.SlugField(max_length=63, unique=True)
    description = models.CharField(max_length=200, blank=True)
    accelerator = models.CharField(
        max_length=64, blank=True, help_text="e.g. nvidia-h100; blank for CPU."
    )
    gpus = models.PositiveSmallIntegerField(default=0)
    cpus = models.PositiveSmallIntegerField(default=1)
    memory_gib = models.PositiveIntegerField(default=4)
    node_selector = models.JSONField(default=dict, blank=True)
    tolerations = models.JSONField(default=list, blank=True)
    engine = models.CharField(
        max_length=16,
        choices=Engine.choices,
        default=Engine.AUTO,
        help_text="Automatic runs tritonserver on GPU types and the CPU engine otherwise; "
        "force one here (e.g. the CPU engine on a GPU node for a smoke test).",
    )
    #: The model backends this type's engine and image can serve (operator-set): a type whose
    #: image lacks Triton's Python backend, or is kept for LLMs, lists only ``vllm``.
    backends = models.JSONField(
        default=all_backends,
        help_text="The backends this type can serve: vllm, python, or both.",
    )
    is_active = models.BooleanField(default=True)
    #: What one instance of this type costs, for the estimates on the deploy form, the
    #: deployment page and the API (:mod:`portal.deployments.costs`); nothing is billed here.
    price_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="USD per instance-hour, operator-set; blank: no estimate shown.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def spec_line(self) -> str:
        """One instance's shape in a few words ("2 x nvidia-h100 · 16 vCPU · 200 GiB", with a
        multiplication sign), as the deploy form, the deployment page and the API put it, so
        people compare types by what they get rather than by name."""
        times = "\u00d7"  # the multiplication sign, as the pages write counts of things
        machine = f"{self.gpus} {times} {self.accelerator or 'GPU'}" if self.gpus else "CPU"
        return f"{machine} · {self.cpus} vCPU · {self.memory_gib} GiB"

    @property
    def serving_engine(self) -> str:
        """The engine its instances run: the operator's choice, or by GPUs when automatic."""
        return engine_for_gpus(self.gpus) if self.engine == Engine.AUTO else self.engine

    def cannot_run(self, backend: str) -> str | None:
        """Why this type cannot serve a ``backend`` version, or None when it can.

        Besides the operator's list: a Python-backend package asks Triton for a GPU instance
        group (``KIND_GPU``, :func:`portal.registry.packaging.python_config`), which Triton
        refuses to load where there is no GPU, so tritonserver without GPUs cannot run it."""
        if backend not in self.backends:
            served = ", ".join(str(Backend(b).label) for b in self.backends if b in Backend.values)
            return (
                f"Instance type {self.name} serves {served or 'no'} models only (set by an "
                f"operator), not the {Backend(backend).label} backend."
            )
        if backend == Backend.PYTHON and self.serving_engine == "tritonserver" and not self.gpus:
            return (
                f"Instance type {self.name} runs Triton without a GPU, and a Python-backend "
                "package asks Triton for a GPU instance; choose a CPU-engine or GPU type."
            )
        return None

    def clean(self) -> None:
        unknown = (
            [b for b in self.backends if b not in Backend.values]
            if isinstance(self.backends, list)
            else [self.backends]
        )
        if unknown or not self.backends:
            raise ValidationError(
                {"backends": [f"A non-empty list of: {', '.join(Backend.values)}."]}
            )


class Region(models.Model):
    """Where deployments run: an operator-defined place with its own launcher, gateways and
    routing table (``portal.deployments.regions`` makes a launcher for one).

    The embedded default is one region whose blank settings mean the platform's own
    (``INSTANCE_LAUNCHER``, ``INSTANCE_RUN_ROOT``, ``GATEWAY_REDIS_PREFIX``, ``GATEWAY_URL``,
    ``KUBERNETES_NAMESPACE``), so a single-region platform needs no region configured.
    """

    name = models.SlugField(max_length=40, unique=True, help_text="e.g. us-east-1.")
    description = models.CharField(max_length=200, blank=True)
    #: Deployments made without naming a region go here; exactly one region is the default.
    is_default = models.BooleanField(default=False)
    launcher = models.CharField(
        max_length=200,
        blank=True,
        help_text="local, kubernetes, or the dotted path of a Launcher class; blank: the "
        "platform's INSTANCE_LAUNCHER.",
    )
    run_directory = models.CharField(
        max_length=500,
        blank=True,
        help_text="Local launcher: where instances' run directories go; blank: "
        "INSTANCE_RUN_ROOT (the default region) or INSTANCE_RUN_ROOT/regions/<name>.",
    )
    gateway_redis_prefix = models.CharField(
        max_length=100,
        blank=True,
        help_text="The Redis prefix this region's gateways follow (python -m serving.gateway "
        "--prefix); blank: GATEWAY_REDIS_PREFIX (the default region) or "
        "<GATEWAY_REDIS_PREFIX>.<name>.",
    )
    gateway_url = models.URLField(
        blank=True,
        help_text="The base URL callers in this region use; blank: GATEWAY_URL.",
    )
    kubernetes_context = models.CharField(
        max_length=200,
        blank=True,
        help_text="Kubernetes launcher: the kubeconfig context of this region's cluster; "
        "blank: in-cluster config or the current context.",
    )
    kubernetes_namespace = models.CharField(
        max_length=63, blank=True, help_text="Blank: KUBERNETES_NAMESPACE."
    )
    model_cache_root = models.CharField(
        max_length=500,
        blank=True,
        help_text="Where the platform's workers reach this region's own model cache (e.g. its "
        "FSx file system mounted on them); its instances see it at MODEL_CACHE_ROOT. A version "
        "is copied there before it rolls out in the region. Blank: the region shares the "
        "platform's cache.",
    )
    #: The instance types this region offers; none listed: every active type.
    instance_types = models.ManyToManyField(
        InstanceType, blank=True, related_name="regions", help_text="None: every active type."
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["-is_default", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="region_one_default",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def gateway_prefix(self) -> str:
        if self.gateway_redis_prefix:
            return self.gateway_redis_prefix
        base = settings.GATEWAY_REDIS_PREFIX
        return base if self.is_default else f"{base}.{self.name}"

    @property
    def public_gateway_url(self) -> str:
        return (self.gateway_url or settings.GATEWAY_URL).rstrip("/")

    def clean(self) -> None:
        """Two regions following one gateway prefix would publish over each other's table."""
        for other in Region.objects.exclude(pk=self.pk):
            if other.gateway_prefix == self.gateway_prefix:
                raise ValidationError(
                    {
                        "gateway_redis_prefix": [
                            f"Region {other} follows gateway prefix {self.gateway_prefix!r}."
                        ]
                    }
                )

    def offers(self, instance_type: InstanceType) -> bool:
        """Whether deployments here may use ``instance_type`` (none listed: every type)."""
        listed = [t.pk for t in self.instance_types.all()]
        return not listed or instance_type.pk in listed


def default_region() -> Region:
    """The region deployments go to when none is named (made on first use if missing)."""
    region = Region.objects.filter(is_default=True).first()
    if region is None:
        region, _ = Region.objects.get_or_create(name="local", defaults={"is_default": True})
    return region


def default_region_id() -> int:
    """The default region's id, reading that column alone: a migration that fills the
    ``region`` of existing rows calls this while later columns may not exist yet."""
    found = Region.objects.filter(is_default=True).values_list("pk", flat=True).first()
    return found if found is not None else default_region().pk


def gateway_prefixes() -> list[str]:
    """The Redis prefixes of every region's gateways, the platform's own first: caller keys
    are published to each, and wakes and last uses read from each."""
    prefixes = [settings.GATEWAY_REDIS_PREFIX]
    for region in Region.objects.all():
        if region.gateway_prefix not in prefixes:
            prefixes.append(region.gateway_prefix)
    return prefixes


class RegionalCopyState(models.TextChoices):
    PENDING = "pending", "Pending"
    COPYING = "copying", "Copying"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class RegionalCopy(models.Model):
    """A ready version's files (its package and its weights) copied from the platform's model
    cache into a region's own (:mod:`portal.deployments.runtime.regional_cache`)."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="+")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="copies")
    state = models.CharField(
        max_length=16, choices=RegionalCopyState.choices, default=RegionalCopyState.PENDING
    )
    reason = models.TextField(blank=True)
    bytes_copied = models.BigIntegerField(default=0)
    attempts = models.PositiveSmallIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["version", "region"], name="regional_copy_unique")
        ]

    def __str__(self) -> str:
        return f"{self.version} in {self.region}: {self.state}"


class Strategy(models.TextChoices):
    RED_BLACK = "red_black", "Red-Black (one endpoint, staged traffic shift)"
    VERSIONED = "versioned", "Versioned (one endpoint per version)"


class DesiredState(models.TextChoices):
    """What people asked for; the controller works towards it."""

    ACTIVE = "active", "Active"
    PAUSED = "paused", "Paused"
    ABORTED = "aborted", "Abort the rollout"
    ROLLBACK = "rollback", "Roll back to the previous version"


class ObservedState(models.TextChoices):
    """Where the rollout actually is, as the controller last saw it.

    A rollback is not a resting state: once done, the deployment is ``serving`` its previous
    version again. ``aborted`` and ``failed`` are final only when nothing was serving before.
    """

    PENDING = "pending", "Pending"
    PROGRESSING = "progressing", "Progressing"
    PAUSED = "paused", "Paused"
    SERVING = "serving", "Serving"
    ROLLING_BACK = "rolling_back", "Rolling back"
    ABORTED = "aborted", "Aborted"
    FAILED = "failed", "Failed"
    RETIRED = "retired", "Retired"


#: Observed states in which a deployment still owns instances and an endpoint.
LIVE_STATES = (
    ObservedState.PENDING,
    ObservedState.PROGRESSING,
    ObservedState.PAUSED,
    ObservedState.SERVING,
    ObservedState.ROLLING_BACK,
)


class Deployment(models.Model):
    """A model served with one strategy.

    Red-Black: one live deployment per model; changing its target version starts a new staged
    rollout beside the serving version, which ``previous_version`` remembers for rollback.
    Versioned: one live deployment per (model, version), each with its own endpoint.
    """

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="deployments")
    strategy = models.CharField(max_length=16, choices=Strategy.choices)
    target_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    previous_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: Bounds and defaults of the rollout settings: :mod:`portal.deployments.state.rollout_limits`, which the
    #: service enforces (the admin cannot change a deployment).
    #: How many instances serve now: people's fixed count, or, when ``min_replicas <
    #: max_replicas``, the autoscaler's (the controller writes it, :mod:`~portal.deployments.state.autoscaling`).
    replicas = models.PositiveSmallIntegerField(default=rollout_limits.REPLICAS.default)
    #: The scaling policy; ``min == max`` (the default) is a fixed count.
    min_replicas = models.PositiveSmallIntegerField(default=rollout_limits.MIN_REPLICAS.default)
    max_replicas = models.PositiveSmallIntegerField(default=rollout_limits.MAX_REPLICAS.default)
    scale_metric = models.CharField(
        max_length=16, choices=ScaleMetric.choices, default=ScaleMetric.IN_FLIGHT
    )
    #: The signal's target per instance (requests, or the KV-cache fraction).
    scale_target = models.FloatField(default=rollout_limits.SCALE_TARGET.default)
    scale_up_window_seconds = models.PositiveIntegerField(
        default=rollout_limits.SCALE_UP_WINDOW_SECONDS.default
    )
    scale_down_window_seconds = models.PositiveIntegerField(
        default=rollout_limits.SCALE_DOWN_WINDOW_SECONDS.default
    )
    #: Stop every instance after this long without a request (the gateway holds the next ones
    #: and wakes the deployment); None: never.
    scale_to_zero_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    #: The autoscaler's memory: recent recommendations, sleep and wake, last decisions.
    scaling = ScalingStateField(default=ScalingState, blank=True)
    instance_type = models.ForeignKey(InstanceType, on_delete=models.PROTECT, related_name="+")
    #: Where it runs: the region's launcher starts its instances and its gateways route to them.
    region = models.ForeignKey(
        Region, on_delete=models.PROTECT, related_name="deployments", default=default_region_id
    )
    #: A region's part of a multi-region deployment (which rolls its regions out in waves),
    #: and its place in the wave order (1 first); None for a deployment on its own.
    multi_region = models.ForeignKey(
        "MultiRegionDeployment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="regional",
    )
    wave = models.PositiveSmallIntegerField(default=0)
    #: Percent of traffic on the new version after each stage; the last is always 100.
    stages = models.JSONField(default=default_stages)
    bake_seconds = models.PositiveIntegerField(default=rollout_limits.BAKE_SECONDS.default)
    #: A new instance must pass its health check within this long of being started.
    health_deadline_seconds = models.PositiveIntegerField(
        default=rollout_limits.HEALTH_DEADLINE_SECONDS.default
    )
    #: During a stage's bake, the new version's share of failed inference requests (from its
    #: instances' own metrics) above which the rollout is rolled back.
    max_error_rate = models.FloatField(default=rollout_limits.MAX_ERROR_RATE.default)
    #: Roll out Red-Black even though the new version's I/O spec differs from the serving one.
    allow_io_change = models.BooleanField(default=False)
    #: Judge each bake below 100% by comparing the new version with the old over the same
    #: minutes (:mod:`portal.deployments.rollout.canary`), with ``canary_policy``: the whole
    #: policy as :class:`~portal.deployments.rollout.judge.CanaryPolicy` writes it, resolved
    #: from what was given when it was set, so a later change of the platform default does not
    #: change how a deployment is judged.
    canary_analysis = models.BooleanField(default=False)
    canary_policy = models.JSONField(default=dict, blank=True)
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.ACTIVE
    )
    promote_requested = models.BooleanField(default=False)
    observed_state = models.CharField(
        max_length=16, choices=ObservedState.choices, default=ObservedState.PENDING
    )
    current_stage = models.PositiveSmallIntegerField(default=0)
    #: Percent of the endpoint's requests per version number, as the controller last set it:
    #: ``{1: 75, 2: 25}``. Empty until something serves.
    traffic = TrafficField(default=dict, blank=True)
    #: The controller's notes for the step in progress (when it began, metric baselines), so a
    #: restarted worker picks the step up where it was.
    step = RolloutStepField(default=RolloutStep, blank=True)
    status_message = models.TextField(blank=True)
    last_reconciled_at = models.DateTimeField(null=True, blank=True)
    #: When the gateways last saw a request for the endpoint, as the Versioned clean-up last
    #: read it from them: kept here so that Redis losing its data does not make it unknown.
    last_request_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "region"],
                condition=models.Q(strategy="red_black", observed_state__in=LIVE_STATES),
                name="deployment_one_live_red_black_per_model_region",
            ),
            models.UniqueConstraint(
                fields=["model", "target_version", "region"],
                condition=models.Q(strategy="versioned", observed_state__in=LIVE_STATES),
                name="deployment_one_live_versioned_per_version_region",
            ),
            models.CheckConstraint(
                condition=models.Q(replicas__gte=1), name="deployment_replicas_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(min_replicas__gte=1, max_replicas__gte=models.F("min_replicas")),
                name="deployment_replica_bounds",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.get_strategy_display().split(' ')[0]} v{self.target_version.number}"

    @property
    def team_id(self) -> int:
        return self.model.team_id

    @property
    def stage_percent(self) -> int | None:
        """Traffic percent on the target version that the current stage asks for; ``None``
        before the first stage. The one place this is computed (API, pages, controller)."""
        stage = self.current_stage
        if stage < 1 or stage > len(self.stages):
            return None
        return int(self.stages[stage - 1])


class LauncherKind(models.TextChoices):
    """Which launcher runs an instance (the launchers themselves: ``portal.deployments.runtime.launchers``)."""

    LOCAL = "local", "Local process"
    KUBERNETES = "kubernetes", "Kubernetes"


class InstanceState(models.TextChoices):
    PENDING = "pending", "Pending"
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    UNHEALTHY = "unhealthy", "Unhealthy"
    DRAINING = "draining", "Draining"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"


class Instance(models.Model):
    """One running copy of a model version, started by a launcher for a deployment."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="instances")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="instances")
    launcher = models.CharField(
        max_length=16, choices=LauncherKind.choices, default=LauncherKind.LOCAL
    )
    name = models.CharField(max_length=128, help_text="Launcher's handle: process id, pod name.")
    endpoints = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=16, choices=InstanceState.choices, default=InstanceState.PENDING
    )
    health_message = models.TextField(blank=True)
    last_health_at = models.DateTimeField(null=True, blank=True)
    #: When it first passed its health check (a later failure is then "unhealthy", not "slow").
    ready_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment_id", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["launcher", "name"], name="instance_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

    @property
    def was_ready(self) -> bool:
        return self.ready_at is not None


class EventKind(models.TextChoices):
    CREATED = "created", "Created"
    UPDATED = "updated", "Updated"
    ACTION = "action", "Action requested"
    STATE = "state", "State changed"
    INSTANCE = "instance", "Instance changed"
    SCALING = "scaling", "Scaled"


class DeploymentEvent(AppendOnlyModel):
    """An append-only line of a deployment's timeline: who or what did what, when and why.

    Rows are never updated or deleted; this is the audit trail.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: Who acted, kept even if the user is deleted: ``user:alice``, ``token:ci (ab12cd34)``,
    #: ``controller``, ``operator:bob``.
    actor_label = models.CharField(max_length=200)
    message = models.TextField()
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_label}: {self.message}"


class StageAnalysis(AppendOnlyModel):
    """One canary analysis of a bake: the new version's requests against the old version's over
    the same window, metric by metric, and what the rollout did about it. A bake extended for
    want of data has one row per look."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="analyses")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    stage = models.PositiveSmallIntegerField()
    #: The stage's traffic share on the new version while it baked.
    percent = models.PositiveSmallIntegerField()
    baseline_version = models.PositiveIntegerField()
    canary_version = models.PositiveIntegerField()
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    #: promote, hold, rollback or not_enough_data (the judge's), and what the rollout did.
    decision = models.CharField(max_length=16)
    action = models.CharField(max_length=200)
    score = models.FloatField(null=True, blank=True)
    reason = models.TextField()
    #: Every metric's verdict with the numbers behind it (``MetricVerdict.to_dict``).
    verdicts = models.JSONField(default=list)
    #: Requests observed per side, and instances read and not read.
    sample = models.JSONField(default=dict)
    policy = models.JSONField(default=dict)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "stage analyses"

    def __str__(self) -> str:
        return (
            f"stage {self.stage} v{self.canary_version} vs v{self.baseline_version}: "
            f"{self.decision}"
        )


class OnRegionFailure(models.TextChoices):
    """What a multi-region rollout does when its new version fails in one region (that region
    always rolls itself back)."""

    HALT = "halt", "Halt the wave: regions already moved keep the new version"
    ROLL_BACK_ALL = "roll_back_all", "Roll back every region already moved"


class WaveState(models.TextChoices):
    """Where a multi-region rollout is, as the wave controller last saw it."""

    PENDING = "pending", "Pending"
    PROGRESSING = "progressing", "Progressing"
    PAUSED = "paused", "Paused"
    SERVING = "serving", "Serving"
    #: The new version failed in a region and the policy is to halt: regions already moved keep
    #: it, the rest keep the previous version, until someone rolls back or deploys again.
    HALTED = "halted", "Halted"
    ROLLING_BACK = "rolling_back", "Rolling back"
    ABORTED = "aborted", "Aborted"
    FAILED = "failed", "Failed"


#: Wave states in which a multi-region deployment still has live regional deployments.
LIVE_WAVE_STATES = (
    WaveState.PENDING,
    WaveState.PROGRESSING,
    WaveState.PAUSED,
    WaveState.SERVING,
    WaveState.HALTED,
    WaveState.ROLLING_BACK,
)


class WavePhase(models.TextChoices):
    ROLLOUT = "rollout", "Rolling out in the wave's region"
    BAKE = "bake", "Baking before the next wave"


class MultiRegionDeployment(models.Model):
    """A model served Red-Black in several regions, each a :class:`Deployment` of its own
    (``regional``, ordered by ``wave``), rolled out to a new version region by region.

    Each region's deployment runs its own stages and bakes under the rollout controller; the
    wave controller (:mod:`portal.deployments.regions.waves`) only decides when each region starts,
    bakes between waves, and what a failure in one region does to the others. People act on
    this record (pause, promote, abort, rollback); the regions' deployments follow.
    """

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="multi_region")
    target_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    previous_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    on_region_failure = models.CharField(
        max_length=16, choices=OnRegionFailure.choices, default=OnRegionFailure.ROLL_BACK_ALL
    )
    #: How long a region that took the new version must stay healthy before the next starts.
    wave_bake_seconds = models.PositiveIntegerField(
        default=rollout_limits.WAVE_BAKE_SECONDS.default
    )
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.ACTIVE
    )
    promote_requested = models.BooleanField(default=False)
    observed_state = models.CharField(
        max_length=16, choices=WaveState.choices, default=WaveState.PENDING
    )
    #: The wave under way (1 is the first region); 0 before the first.
    current_wave = models.PositiveSmallIntegerField(default=0)
    wave_phase = models.CharField(max_length=16, choices=WavePhase.choices, blank=True)
    #: Unix times, so a restarted worker picks the wave up where it was.
    wave_started_at = models.FloatField(null=True, blank=True)
    bake_started_at = models.FloatField(null=True, blank=True)
    #: Promoted: the remaining regions roll out without stages' bakes or a bake between waves.
    promoted = models.BooleanField(default=False)
    #: Why the rollout is rolling back or halted, and in which region it failed.
    reason = models.TextField(blank=True)
    failed_region = models.CharField(max_length=40, blank=True)
    status_message = models.TextField(blank=True)
    last_reconciled_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model"],
                condition=models.Q(observed_state__in=LIVE_WAVE_STATES),
                name="multi_region_one_live_per_model",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} in {self.regional.count()} regions v{self.target_version.number}"

    @property
    def team_id(self) -> int:
        return self.model.team_id

    @property
    def wave_bake_ends_at(self) -> float | None:
        """Unix time the bake between waves under way ends; None when none bakes."""
        if self.wave_phase != WavePhase.BAKE or self.bake_started_at is None:
            return None
        return self.bake_started_at + self.wave_bake_seconds
