"""The portal's forms. They only parse what people type; every rule about what is valid lives in
the services the API also calls, whose errors :func:`show_service_errors` puts next to the
field they are about."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from portal.accounts.models import Role
from portal.core.errors import ApplicationError
from portal.deployments import costs
from portal.deployments.models import InstanceType, Strategy
from portal.deployments.rollout.judge import CanaryPolicy
from portal.deployments.scaling_policy import DEFAULT_TARGETS, POLICY_SETTINGS
from portal.deployments.state import rollout_limits
from portal.deployments.state.autoscaling import ScaleMetric
from portal.registry.models import (
    ApiSurface,
    Backend,
    Model,
    ModelVersion,
    TaskKind,
    ToolCallParser,
    VersionState,
)

#: An uploaded model.py larger than this is refused before it is read.
MAX_MODEL_PY_BYTES = 1024 * 1024


def show_service_errors(form: forms.Form, exc: Exception) -> None:
    """Attach a service's refusal to the form: by field where it names one of the form's fields,
    otherwise at the top of the form. A key that names a part of a field's value
    (``canary_policy.metrics[0].alpha``) goes on that field, its messages led by the part's
    path, since one text box holds the whole value and the path is what says where to look."""
    if isinstance(exc, ValidationError) and hasattr(exc, "error_dict"):
        for key, messages in exc.message_dict.items():
            field, _, path = key.partition(".")
            if key in form.fields:
                form.add_error(key, messages)
            elif path and field in form.fields:
                form.add_error(field, [f"{path}: {message}" for message in messages])
            else:
                form.add_error(None, messages)
    elif isinstance(exc, ValidationError):
        form.add_error(None, exc.messages)
    elif isinstance(exc, ApplicationError):
        form.add_error(None, exc.message)
    else:
        raise exc


class JSONField(forms.CharField):
    """A JSON text box whose parse error says where the JSON is broken."""

    def __init__(self, *, expect: type, **kwargs: Any) -> None:
        self.expect = expect
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}))
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        text = (super().to_python(value) or "").strip()
        if not text:
            return self.expect()
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
            ) from exc
        if not isinstance(parsed, self.expect):
            raise ValidationError(f"Must be a JSON {'object' if self.expect is dict else 'list'}.")
        return parsed

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict | list):
            return json.dumps(value, indent=2) if value else ""
        return value


def policy_text(policy: dict[str, Any]) -> str:
    """A canary policy as JSON with one metric a line: a whole policy has eight metrics of nine
    fields each, which indented one field a line would make a text box of a hundred lines."""
    rest = {key: value for key, value in policy.items() if key != "metrics"}
    if "metrics" not in policy:
        return json.dumps(rest)
    lines = ",\n".join(f"  {json.dumps(metric)}" for metric in policy["metrics"])
    tail = "".join(f", {json.dumps(key)}: {json.dumps(value)}" for key, value in rest.items())
    return f'{{"metrics": [\n{lines}\n]{tail}}}'


class CanaryPolicyField(JSONField):
    """The canary policy's JSON text box. Empty means the platform default policy, so a policy
    equal to today's default is shown empty (posted back, it means the same), and the default
    is the box's placeholder."""

    def __init__(self, **kwargs: Any) -> None:
        default = policy_text(CanaryPolicy.default().to_dict())
        widget = forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "placeholder": default})
        super().__init__(expect=dict, widget=widget, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return "" if value == CanaryPolicy.default().to_dict() else policy_text(value)
        return super().prepare_value(value)


class ModelForm(forms.Form):
    slug = forms.SlugField(
        max_length=63,
        label="Name",
        help_text="Letters, digits, - and _; part of the model's endpoint, e.g. support-bot.",
    )
    task = forms.ChoiceField(choices=TaskKind.choices, initial=TaskKind.CHAT)
    description = forms.CharField(
        required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2})
    )


class VersionForm(forms.Form):
    artifact_uri = forms.CharField(
        max_length=1024,
        label="Artifact source",
        help_text="Where the weights are: s3://bucket/prefix, hf://org/repo[@revision], or "
        "file:///path under an allowed root.",
    )
    backend = forms.ChoiceField(
        choices=Backend.choices, initial=Backend.VLLM, widget=forms.RadioSelect
    )
    engine_args = JSONField(
        expect=dict,
        label="Engine arguments (vLLM)",
        help_text='A JSON object of vLLM engine arguments, e.g. {"max_model_len": 4096}. '
        "The platform release fixes the vLLM version and image.",
    )
    api_surface = forms.ChoiceField(
        choices=ApiSurface.choices,
        initial=ApiSurface.OPENAI_GRPC,
        widget=forms.RadioSelect,
        label="API surface",
        required=False,  # not sent: the backend's own (the Python backend has only one)
    )
    tool_call_parser = forms.ChoiceField(
        choices=ToolCallParser.choices,
        initial=ToolCallParser.HERMES,
        required=False,  # absent from a posted form: the default
        label="Tool-call format",
        help_text="How the model writes a tool call when it may choose (tool_choice auto): the "
        "format its chat template teaches. Forced calls do not depend on it.",
    )
    constraint_plugins = forms.MultipleChoiceField(
        choices=[],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Logits processors loaded into the engine (constrained decoding).",
    )
    io_spec = JSONField(
        expect=dict,
        label="I/O spec (Python backend)",
        help_text='{"inputs": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}], '
        '"outputs": [...]}',
    )
    python_model = forms.FileField(
        required=False,
        label="model.py (Python backend)",
        help_text="Your Triton model.py; leave empty to use the one in the artifact.",
    )
    #: A model.py uploaded with a form that had errors, sent back with the page (a browser
    #: cannot refill a file input), so fixing another field does not mean uploading it again.
    kept_model_py = forms.CharField(required=False, widget=forms.HiddenInput, strip=False)
    kept_model_py_name = forms.CharField(required=False, widget=forms.HiddenInput, max_length=255)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.MultipleChoiceField, self.fields["constraint_plugins"]).choices = [
            (name, name) for name in settings.CONSTRAINT_PLUGINS
        ]

    def clean_tool_call_parser(self) -> str:
        return self.cleaned_data.get("tool_call_parser") or ToolCallParser.HERMES

    def clean_python_model(self) -> str:
        """The uploaded model.py, else the one kept from an earlier try of this form."""
        upload = self.cleaned_data.get("python_model")
        if not upload:
            kept = (self.data.get("kept_model_py") or "").replace("\r\n", "\n")
            if len(kept.encode()) > MAX_MODEL_PY_BYTES:
                raise ValidationError(f"model.py is over {MAX_MODEL_PY_BYTES // 1024} KiB.")
            self.model_py_name = (self.data.get("kept_model_py_name") or "model.py")[:255]
            return kept
        self.model_py_name = upload.name or "model.py"
        if upload.size > MAX_MODEL_PY_BYTES:
            raise ValidationError(f"model.py is over {MAX_MODEL_PY_BYTES // 1024} KiB.")
        try:
            return upload.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError("model.py must be UTF-8 text.") from exc

    def service_fields(self) -> dict[str, Any]:
        """What the registry's service takes, from the fields that parsed: the other backend's
        fields dropped, and the Python backend on the one API surface it supports."""
        data = {
            name: value
            for name, value in self.cleaned_data.items()
            if name not in ("kept_model_py", "kept_model_py_name")
        }
        data["api_surface"] = data.get("api_surface") or None
        if data.get("backend") == Backend.VLLM:
            data["io_spec"], data["python_model"] = {}, ""
        elif data.get("backend") == Backend.PYTHON:
            data["api_surface"] = ApiSurface.GRPC
            data["engine_args"], data["tool_call_parser"] = {}, ToolCallParser.HERMES
        return data


def _parse_stages(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError as exc:
        raise ValidationError("Write whole percentages separated by commas: 10, 50, 100.") from exc


def _version_choice(version: ModelVersion) -> str:
    if version.state == VersionState.READY:
        return f"v{version.number} ({version.get_backend_display()})"
    return f"v{version.number} ({version.get_state_display().lower()}: deploys once ready)"


def _instance_type_choice(instance_type: InstanceType) -> str:
    """A type as the deploy form lists it: what one instance is, and what it costs."""
    price = instance_type.price_per_hour
    cost = f"{costs.dollars(price)}/hour" if price is not None else costs.NO_PRICE
    return f"{instance_type.name}: {instance_type.spec_line} · {cost}"


class InstanceTypeSelect(forms.Select):
    """Each option carries its type's price per hour (``data-price``, absent when unset), which
    static/web/cost_estimate.js multiplies by the replicas as people change them."""

    def create_option(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option = super().create_option(*args, **kwargs)
        instance = getattr(option["value"], "instance", None)
        if instance is not None and instance.price_per_hour is not None:
            option["attrs"]["data-price"] = str(instance.price_per_hour)
        return option


def _bounded(name: str, **kwargs: Any) -> forms.Field:
    """An optional scaling setting's field with its bounds from :mod:`portal.deployments.state.rollout_limits`."""
    bounds = rollout_limits.BOUNDS[name]
    if isinstance(bounds, rollout_limits.IntBounds):
        return forms.IntegerField(
            min_value=bounds.min, max_value=bounds.max, required=False, **kwargs
        )
    return forms.FloatField(min_value=bounds.min, max_value=bounds.max, required=False, **kwargs)


class DeployForm(forms.Form):
    version = forms.ModelChoiceField(queryset=ModelVersion.objects.none(), empty_label=None)
    strategy = forms.ChoiceField(
        choices=Strategy.choices, initial=Strategy.RED_BLACK, widget=forms.RadioSelect
    )
    replicas = forms.IntegerField(
        min_value=rollout_limits.REPLICAS.min,
        max_value=rollout_limits.REPLICAS.max,
        initial=rollout_limits.REPLICAS.default,
        required=False,  # required for a fixed count (clean); autoscaling owns the count
        help_text="A fixed count (unless Autoscale is on, under Scaling).",
    )
    instance_type = forms.ModelChoiceField(
        queryset=InstanceType.objects.filter(is_active=True),
        empty_label=None,
        widget=InstanceTypeSelect,
    )
    stages = forms.CharField(
        initial=", ".join(str(s) for s in rollout_limits.DEFAULT_STAGES),
        help_text="Traffic percent on the new version after each stage, ending at 100.",
    )
    bake_seconds = forms.IntegerField(
        min_value=rollout_limits.BAKE_SECONDS.min,
        max_value=rollout_limits.BAKE_SECONDS.max,
        initial=rollout_limits.BAKE_SECONDS.default,
        label="Bake time (seconds)",
        help_text="How long each stage is watched before the next.",
    )
    health_deadline_seconds = forms.IntegerField(
        min_value=rollout_limits.HEALTH_DEADLINE_SECONDS.min,
        max_value=rollout_limits.HEALTH_DEADLINE_SECONDS.max,
        initial=rollout_limits.HEALTH_DEADLINE_SECONDS.default,
        label="Health deadline (seconds)",
    )
    max_error_rate = forms.FloatField(
        min_value=rollout_limits.MAX_ERROR_RATE.min,
        max_value=rollout_limits.MAX_ERROR_RATE.max,
        initial=rollout_limits.MAX_ERROR_RATE.default,
        label="Roll back above this error rate",
    )
    allow_io_change = forms.BooleanField(
        required=False,
        label="Roll out Red-Black even though the interface changed",
        help_text="Only if every caller copes with both the old and the new interface.",
    )
    canary_analysis = forms.BooleanField(
        required=False,
        label="Judge each bake against the old version (canary analysis)",
        help_text="At the end of each bake below 100%, compare the new version's requests with "
        "the old version's over the same minutes (latency, tokens, errors, empty, length-stopped "
        "and schema-invalid answers), then promote, hold for a person, or roll back.",
    )
    canary_policy = CanaryPolicyField(
        label="Canary policy (JSON)",
        help_text="Empty: the platform default policy, shown greyed in the box. Fields left out "
        'take the default\'s, e.g. {"metrics": [{"name": "latency_s", "max_change": 0.2}, '
        '{"name": "error_rate"}], "pass_score": 95}.',
    )
    autoscale = forms.BooleanField(
        required=False,
        label="Autoscale",
        help_text="Let the load change the count between a minimum and a maximum, instead of "
        "the fixed replicas.",
    )
    min_replicas = _bounded(
        "min_replicas",
        label="Minimum instances",
        initial=rollout_limits.MIN_REPLICAS.default,
    )
    max_replicas = _bounded(
        "max_replicas",
        label="Maximum instances",
        help_text="Quotas count the maximum.",
    )
    scale_metric = forms.ChoiceField(
        choices=ScaleMetric.choices,
        initial=ScaleMetric.IN_FLIGHT,
        required=False,
        label="Signal",
    )
    scale_target = _bounded(
        "scale_target",
        label="Target per instance",
        help_text="Blank: the signal's default ("
        + ", ".join(f"{value} {target:g}" for value, target in DEFAULT_TARGETS.items())
        + "). KV-cache usage is a fraction, at most 1.",
    )
    scale_up_window_seconds = _bounded(
        "scale_up_window_seconds",
        label="Scale-up window (s)",
        initial=rollout_limits.SCALE_UP_WINDOW_SECONDS.default,
        help_text="Scales up to the lowest count asked for over this window.",
    )
    scale_down_window_seconds = _bounded(
        "scale_down_window_seconds",
        label="Scale-down window (s)",
        initial=rollout_limits.SCALE_DOWN_WINDOW_SECONDS.default,
        help_text="Scales down to the highest count asked for over this window.",
    )
    scale_to_zero_after_seconds = _bounded(
        "scale_to_zero_after_seconds",
        label="Scale to zero after (s)",
        help_text="Stop every instance after this long without a request (the gateway holds "
        "the next one and wakes it). Blank: never.",
    )

    #: The fields Autoscale reveals: ignored (and their errors dropped) when it is off.
    AUTOSCALE_FIELDS = POLICY_SETTINGS

    def __init__(
        self, *args: Any, model: Any, instance_types: list[InstanceType], **kwargs: Any
    ) -> None:
        """``instance_types``: those that can serve the version the page is about (the
        service refuses another version's mismatch on submit)."""
        super().__init__(*args, **kwargs)
        version = cast(forms.ModelChoiceField, self.fields["version"])
        version.queryset = model.versions.exclude(state=VersionState.FAILED)
        version.label_from_instance = _version_choice  # type: ignore[method-assign,assignment]
        if not self.initial.get("version"):  # none picked for the visitor: they choose
            version.empty_label = "Choose a version"
        types = cast(forms.ModelChoiceField, self.fields["instance_type"])
        types.queryset = InstanceType.objects.filter(pk__in=[t.pk for t in instance_types])
        types.label_from_instance = _instance_type_choice  # type: ignore[method-assign,assignment]
        if len(instance_types) < InstanceType.objects.filter(is_active=True).count():
            types.help_text = "Types that cannot serve this version's backend are not listed."

    def clean_stages(self) -> list[int]:
        return _parse_stages(self.cleaned_data["stages"])

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("autoscale"):
            for name in ("min_replicas", "max_replicas"):
                if data.get(name) is None and name not in self.errors:
                    self.add_error(name, "Required to autoscale.")
        else:
            # Hidden while Autoscale is off: what they hold is not used, nor judged.
            for name in self.AUTOSCALE_FIELDS:
                self.errors.pop(name, None)
                data.pop(name, None)
            if data.get("replicas") is None and "replicas" not in self.errors:
                self.add_error("replicas", "This field is required.")
        return data

    @property
    def scaling_open(self) -> bool:
        """Whether the Scaling section shows open: autoscaling, or an error to see there."""
        on = self["autoscale"].value()
        return bool(on) or any(self[name].errors for name in self.AUTOSCALE_FIELDS)

    def service_fields(self) -> dict[str, Any]:
        """What :func:`~portal.deployments.services.deploy` takes, from the cleaned form: a
        fixed count is ``replicas`` (and no scale to zero); with Autoscale, the policy (blank
        settings not given, a blank scale to zero off) and no ``replicas``: a new deployment
        starts at the minimum, a live one keeps its count within the new bounds."""
        data = dict(self.cleaned_data)
        autoscale = data.pop("autoscale", False)
        given = {name: data.pop(name, None) for name in POLICY_SETTINGS}
        if not autoscale:
            return {**data, "scaling": {"scale_to_zero_after_seconds": None}}
        scaling = {
            name: value
            for name, value in given.items()
            if value not in (None, "") or name == "scale_to_zero_after_seconds"
        }
        return {**data, "replicas": None, "scaling": scaling}

    def cost_estimate(self) -> str:
        """The estimate under the replicas for the type and count the form shows now (posted,
        or initial); static/web/cost_estimate.js keeps it up to date as they change."""
        offered = list(cast(forms.ModelChoiceField, self.fields["instance_type"]).queryset or [])
        chosen = self["instance_type"].value()
        chosen_pk = str(getattr(chosen, "pk", chosen))
        # What the select shows selected: the chosen type, else its first option.
        instance_type = next((t for t in offered if str(t.pk) == chosen_pk), None) or next(
            iter(offered), None
        )
        replicas = str(self["replicas"].value() or "")
        if instance_type is None or not replicas.isdigit() or int(replicas) < 1:
            return ""
        return costs.summary(costs.estimate(instance_type.price_per_hour, int(replicas)))


def expiry_field() -> forms.IntegerField:
    """How long a new CI token or caller key lives, in days (both forms ask the same)."""
    return forms.IntegerField(
        min_value=1,
        max_value=3650,
        required=False,
        label="Expires in (days)",
        help_text="Empty: never expires (revoke it when done).",
    )


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. ci-main.")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)
    expires_in_days = expiry_field()


class ModelSlugsField(forms.ModelMultipleChoiceField):
    """Models listed by slug: the form is about one team's."""

    def label_from_instance(self, obj: Any) -> str:
        return obj.slug


class CallerKeyForm(forms.Form):
    """A caller key: which of the team's models it calls, for how long, how fast. What makes a
    key invalid is :func:`portal.deployments.traffic.caller_keys.check_key`'s to say."""

    name = forms.CharField(max_length=100, help_text="What calls with it, e.g. search-app.")
    models = ModelSlugsField(
        queryset=Model.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Models it may call",
        help_text="None checked: all of the team's models, including ones registered later.",
    )
    expires_in_days = expiry_field()
    requests_per_second = forms.FloatField(
        min_value=0.001,
        required=False,
        label="Requests per second",
        help_text="Empty: no limit of its own (the team's, if any, still applies).",
    )
    tokens_per_minute = forms.IntegerField(
        min_value=1,
        max_value=2**31 - 1,
        required=False,
        label="Tokens per minute",
        help_text="Prompt (estimated) plus max_tokens. Empty: no limit of its own.",
    )

    def __init__(self, *args: Any, team: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        models_field = cast(ModelSlugsField, self.fields["models"])
        models_field.queryset = Model.objects.filter(team=team).order_by("slug")
