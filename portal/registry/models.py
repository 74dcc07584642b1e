"""Models, their versions, and the pinned platform releases versions are packaged against."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from portal.accounts.models import Team
from portal.core.models import AppendOnlyModel
from portal.registry.engine_args import allow_list_errors


class PlatformRelease(models.Model):
    """A pinned, known-good pair of Triton serving image and vLLM version, owned by operators.

    Triton's vLLM backend is compiled against one vLLM API surface; a mismatched pair does not
    load at all. So the pair is chosen here, once, and model authors can never override it.
    """

    name = models.CharField(max_length=64, unique=True)
    triton_image = models.CharField(max_length=255, help_text="Full image reference with tag.")
    vllm_version = models.CharField(max_length=32)
    allowed_engine_args = models.JSONField(
        default=list, help_text="vLLM engine-argument names authors may set in model.json."
    )
    is_default = models.BooleanField(default=False)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="platformrelease_single_default",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} (Triton {self.triton_image}, vLLM {self.vllm_version})"

    def clean(self) -> None:
        """Refuse an allow-list naming an argument the pinned vLLM lacks: Triton's backend
        passes model.json to ``AsyncEngineArgs(**json)``, so every model setting it would fail
        to load (as ``swap_space`` did against vLLM 0.24.0)."""
        errors = allow_list_errors(self.vllm_version, self.allowed_engine_args)
        if errors:
            raise ValidationError({"allowed_engine_args": errors})


class TaskKind(models.TextChoices):
    CHAT = "chat", "Chat"
    COMPLETION = "completion", "Completion"
    EMBEDDING = "embedding", "Embedding"
    RANKING = "ranking", "Ranking"


class Model(models.Model):
    """A named model owned by a team; what callers address. Its versions hold the artifacts."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="models")
    slug = models.SlugField(max_length=63)
    task = models.CharField(max_length=16, choices=TaskKind.choices)
    description = models.TextField(blank=True, max_length=5000)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    #: The number the next version gets. Never decreases, so numbers are never reused.
    next_version_number = models.PositiveIntegerField(default=1, editable=False)

    class Meta:
        ordering = ["team__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["team", "slug"], name="model_unique_slug_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.slug}"


class Backend(models.TextChoices):
    VLLM = "vllm", "vLLM (default)"
    PYTHON = "python", "Python (custom model.py)"


class ApiSurface(models.TextChoices):
    OPENAI_GRPC = "openai+grpc", "OpenAI HTTP + KServe v2 gRPC (embedded Triton)"
    GRPC = "grpc", "KServe v2 gRPC only (standalone Triton)"


class ToolCallParser(models.TextChoices):
    """Values of :data:`serving.package.TOOL_CALL_PARSERS` (a test keeps them equal)."""

    HERMES = "hermes", "Hermes <tool_call> blocks (Qwen 2.5/3, Hermes)"
    LLAMA3_JSON = "llama3_json", "Llama 3 JSON calls"
    MISTRAL = "mistral", "Mistral [TOOL_CALLS]"


class VersionState(models.TextChoices):
    REGISTERED = "registered", "Registered"
    MATERIALIZING = "materializing", "Materializing weights"
    MATERIALIZED = "materialized", "Weights materialized"
    PACKAGING = "packaging", "Packaging"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class PluginWheel(models.Model):
    """An author's plugin wheel, uploaded to a team and stored content-addressed in the model
    cache (:mod:`portal.registry.plugins` inspected it without running it). Versions name it."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="plugin_wheels")
    sha256 = models.CharField(max_length=64)
    filename = models.CharField(max_length=255)
    name = models.CharField(max_length=255, help_text="The distribution name in its METADATA.")
    version = models.CharField(max_length=64)
    #: ``{"vllm.general_plugins": {name: "module:attr"}, "vllm.logits_processors": {...}}``
    entry_points = models.JSONField(default=dict)
    #: Its Requires-Dist lines, as read.
    requires = models.JSONField(default=list)
    size = models.PositiveBigIntegerField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team_id", "name", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "sha256"], name="pluginwheel_unique_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.filename} ({self.sha256[:12]})"

    @property
    def storage_path(self) -> str:
        """Where its bytes lie, relative to ``MODEL_CACHE_ROOT``."""
        return f"plugins/sha256/{self.sha256[:2]}/{self.sha256}.whl"


class ModelVersion(models.Model):
    """One immutable-once-ready revision of a model: where its weights come from, how it is
    served (backend, engine arguments or I/O spec, API surface) and which release packages it."""

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    artifact_uri = models.CharField(max_length=1024)
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.VLLM)
    engine_args = models.JSONField(default=dict, blank=True)
    io_spec = models.JSONField(default=dict, blank=True)
    api_surface = models.CharField(
        max_length=16, choices=ApiSurface.choices, default=ApiSurface.OPENAI_GRPC
    )
    constraint_plugins = models.JSONField(default=list, blank=True)
    #: How the model writes tool calls when it may choose (OpenAI ``tool_choice: auto``); written
    #: into config.pbtxt for the front end. Depends on the model's chat template.
    tool_call_parser = models.CharField(
        max_length=16, choices=ToolCallParser.choices, default=ToolCallParser.HERMES
    )
    #: The author's Triton ``model.py`` (Python backend); blank means "take it from the artifact".
    python_model = models.TextField(blank=True)
    #: Filled by packaging: the sha256 of the package archive and its manifest.
    package_digest = models.CharField(max_length=64, blank=True)
    package_manifest = models.JSONField(default=dict, blank=True)
    release = models.ForeignKey(PlatformRelease, on_delete=models.PROTECT, related_name="versions")
    #: Uploaded plugin wheels the version ships (those under ``plugins/`` in its artifact are
    #: found at packaging and recorded in the package manifest).
    plugins = models.ManyToManyField(PluginWheel, blank=True, related_name="versions")
    state = models.CharField(
        max_length=16, choices=VersionState.choices, default=VersionState.REGISTERED
    )
    failure_reason = models.TextField(blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "number"], name="version_unique_number")
        ]

    def __str__(self) -> str:
        return f"{self.model} v{self.number}"

    @property
    def team_id(self) -> int:
        return self.model.team_id

    @property
    def cache_tree(self) -> str:
        """Where the version's weights live in the model cache, relative to
        ``MODEL_CACHE_ROOT``: the one rule the copy (which writes them there) and packaging
        (which points ``model.json`` at them) share."""
        return f"models/{self.model.team.slug}/{self.model.slug}/{self.number}"


class VersionEvent(AppendOnlyModel):
    """An append-only line of a version's lifecycle: which worker step moved it, when and why."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_label = models.CharField(max_length=200)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.version}: {self.from_state} → {self.to_state}"
