"""Small display filters for the portal's pages."""

from __future__ import annotations

import time
from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def seconds(value: float | None) -> str:
    """``75`` → ``1 min 15 s``: durations people read at a glance."""
    if value is None:
        return "—"
    total = round(value)
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@register.filter
def seconds_until(moment: float | None) -> float | None:
    """Seconds from now until a Unix time (never negative): a countdown's value."""
    return None if moment is None else max(0.0, moment - time.time())


@register.filter
def ago(moment: datetime | None) -> str:
    """``3 minutes ago``, and ``just now`` under a minute (Django's timesince says "0 minutes")."""
    if moment is None:
        return "—"
    if (timezone.now() - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment)} ago"


@register.filter
def strategy_name(deployment) -> str:
    """``Red-Black`` or ``Versioned``: the choice's label without its explanation."""
    return deployment.get_strategy_display().split(" (")[0]
