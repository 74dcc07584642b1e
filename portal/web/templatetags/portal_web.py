"""Small display filters for the portal's pages."""

from __future__ import annotations

from django import template

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
def number(value: float | None) -> str:
    """A chart value with about three significant digits."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


@register.filter
def strategy_name(deployment) -> str:
    """``Red-Black`` or ``Versioned``: the choice's label without its explanation."""
    return deployment.get_strategy_display().split(" (")[0]
