"""The one home of a deployment's rollout limits and defaults.

The model's field defaults, the service's checks, the API's serializers and the web form's
fields all read them from here, so a limit changes in one place. The service enforces every
one of them itself (:func:`check_settings`); the serializers and forms repeat the bounds only
so that a caller learns of a bad value next to the field, before anything is looked up.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from django.core.exceptions import ValidationError


@dataclass(frozen=True)
class Bounds:
    """The smallest and largest value a setting may take, and what it is when not given."""

    min: float
    max: float
    default: float

    def error(self, value: object) -> str | None:
        """Why ``value`` is not a valid setting, in the words Django's own validators use."""
        if not isinstance(value, int | float) or isinstance(value, bool):
            return "A valid number is required."
        if value < self.min:
            return f"Ensure this value is greater than or equal to {self.min}."
        if value > self.max:
            return f"Ensure this value is less than or equal to {self.max}."
        return None


@dataclass(frozen=True)
class IntBounds(Bounds):
    min: int
    max: int
    default: int

    def error(self, value: object) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return "A valid integer is required."
        return super().error(value)


#: How many instances serve the target version once its rollout is complete.
REPLICAS = IntBounds(min=1, max=64, default=1)
#: How long each stage is watched before the next.
BAKE_SECONDS = IntBounds(min=0, max=24 * 3600, default=60)
#: How long a region that took a new version bakes before the next region's wave starts.
WAVE_BAKE_SECONDS = IntBounds(min=0, max=24 * 3600, default=300)
#: A new instance must pass its health check within this long of being started.
HEALTH_DEADLINE_SECONDS = IntBounds(min=1, max=24 * 3600, default=600)
#: The new version's share of failed requests during a bake above which it is rolled back.
MAX_ERROR_RATE = Bounds(min=0.0, max=1.0, default=0.05)

#: The traffic percent on the new version after each stage: at most this many stages, each a
#: percent within ``STAGE_PERCENT``, increasing, the last 100.
MAX_STAGES = 10
STAGE_PERCENT = IntBounds(min=1, max=100, default=100)
DEFAULT_STAGES = (10, 50, 100)

#: Autoscaling (:mod:`portal.deployments.state.autoscaling`): the replica bounds reuse ``REPLICAS``'s;
#: ``min_replicas == max_replicas`` is a fixed count, today's default.
MIN_REPLICAS = REPLICAS
MAX_REPLICAS = REPLICAS
#: The target per instance of the chosen signal: in-flight or waiting requests per instance,
#: or the KV-cache usage fraction (which must then be at most 1, checked with the metric).
SCALE_TARGET = Bounds(min=0.01, max=1000.0, default=4.0)
#: How long a higher (up) or lower (down) replica count must be recommended before it is
#: applied: scale-up acts on the lowest recommendation of its window, scale-down on the highest
#: of its, as Kubernetes' HPA stabilization does.
SCALE_UP_WINDOW_SECONDS = IntBounds(min=0, max=3600, default=10)
SCALE_DOWN_WINDOW_SECONDS = IntBounds(min=0, max=3600, default=300)
#: Scale to zero after this long without a request; None (the default) never does.
SCALE_TO_ZERO_AFTER_SECONDS = IntBounds(min=10, max=7 * 24 * 3600, default=900)

#: The numeric settings, by the name they have on the model, the service, the API and the form.
BOUNDS: dict[str, Bounds] = {
    "replicas": REPLICAS,
    "bake_seconds": BAKE_SECONDS,
    "health_deadline_seconds": HEALTH_DEADLINE_SECONDS,
    "max_error_rate": MAX_ERROR_RATE,
    "min_replicas": MIN_REPLICAS,
    "max_replicas": MAX_REPLICAS,
    "scale_target": SCALE_TARGET,
    "scale_up_window_seconds": SCALE_UP_WINDOW_SECONDS,
    "scale_down_window_seconds": SCALE_DOWN_WINDOW_SECONDS,
    "scale_to_zero_after_seconds": SCALE_TO_ZERO_AFTER_SECONDS,
}

STAGES_MESSAGE = (
    f"Must be 1 to {MAX_STAGES} increasing traffic percentages ending at 100, e.g. [10, 50, 100]."
)


def default_stages() -> list[int]:
    return list(DEFAULT_STAGES)


def validate_stages(stages: object) -> list[int]:
    valid = (
        isinstance(stages, list)
        and 1 <= len(stages) <= MAX_STAGES
        and all(
            isinstance(s, int)
            and not isinstance(s, bool)
            and STAGE_PERCENT.min <= s <= STAGE_PERCENT.max
            for s in stages
        )
        and all(a < b for a, b in itertools.pairwise(stages))
        and stages[-1] == 100
    )
    if not valid:
        raise ValidationError({"stages": [STAGES_MESSAGE]})
    return stages  # type: ignore[return-value]


def check_settings(**values: object) -> None:
    """Refuse, by field, any given setting outside its bounds (``None`` means not given);
    ``stages`` is checked by :func:`validate_stages`."""
    errors: dict[str, list[str]] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name == "stages":
            try:
                validate_stages(value)
            except ValidationError as exc:
                errors.update(exc.message_dict)
            continue
        problem = BOUNDS[name].error(value)
        if problem:
            errors[name] = [problem]
    if errors:
        raise ValidationError(errors)
