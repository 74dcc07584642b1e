"""Line charts drawn on the server as SVG: no chart library, no script, readable without one.

A chart is a fixed viewBox; each line is one or more polylines (a missing sample breaks the
line instead of drawing a false slope through it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WIDTH, HEIGHT = 320.0, 120.0
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 4.0, 4.0, 8.0, 14.0
COLOURS = ("#0b5cad", "#d9480f")


@dataclass(frozen=True)
class Line:
    label: str
    colour: str
    segments: list[str]  # SVG "x,y x,y ..." point lists
    last: float | None
    last_xy: tuple[str, str] | None  # where the newest sample is drawn (a dot marks it)


@dataclass(frozen=True)
class Grid:
    """A guide line: vertical at a time (``x``) or horizontal at a value (``y``)."""

    position: str
    label: str


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str
    lines: list[Line]
    top: float  # the value of the top edge
    peak: float  # the largest value drawn (0 when none)
    has_data: bool
    times: list[Grid]  # every 15 minutes back from the right edge
    levels: list[Grid]  # half the top value

    width = WIDTH
    height = HEIGHT
    plot_bottom = HEIGHT - PAD_BOTTOM
    plot_top = PAD_TOP


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


def _scale(value: float, low: float, high: float, out_low: float, out_high: float) -> float:
    if high <= low:
        return out_low
    return out_low + (value - low) * (out_high - out_low) / (high - low)


def _nice_top(peak: float) -> float:
    """A round number just above ``peak`` for the top edge (1, 2 or 5 times a power of ten)."""
    if peak <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(peak))
    for step in (1, 2, 5):
        if peak <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def build(spec: Any, points: Sequence[dict[str, Any]], since: datetime, until: datetime) -> Chart:
    """One chart of ``spec`` (key, title, unit, lines of (field, label)) over ``since..until``."""
    values = [p[f] for p in points for f, _ in spec.lines if p.get(f) is not None]
    top = _nice_top(max(values, default=0.0))
    start, end = since.timestamp(), until.timestamp()
    lines = []
    for index, (field, label) in enumerate(spec.lines):
        segments: list[str] = []
        current: list[str] = []
        last, last_xy = None, None
        for point in points:
            value = point.get(field)
            if value is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            x = _scale(point["at"].timestamp(), start, end, PAD_LEFT, WIDTH - PAD_RIGHT)
            y = _scale(value, 0.0, top, HEIGHT - PAD_BOTTOM, PAD_TOP)
            current.append(f"{x:.1f},{y:.1f}")
            last, last_xy = value, (f"{x:.1f}", f"{y:.1f}")
        if current:
            segments.append(" ".join(current))
        lines.append(Line(label, COLOURS[index % len(COLOURS)], segments, last, last_xy))
    return Chart(
        spec.key,
        spec.title,
        spec.unit,
        lines,
        top,
        max(values, default=0.0),
        bool(values),
        times=_time_grid(start, end),
        levels=[
            Grid(f"{_scale(top / 2, 0.0, top, HEIGHT - PAD_BOTTOM, PAD_TOP):.1f}", number(top / 2))
        ],
    )


def _time_grid(start: float, end: float, step: float = 15 * 60) -> list[Grid]:
    """Lines ``step`` apart counted back from ``end``, labelled by how long ago they are."""
    grid = []
    at = end - step
    while at > start:
        x = _scale(at, start, end, PAD_LEFT, WIDTH - PAD_RIGHT)
        grid.append(Grid(f"{x:.1f}", f"\u2212{round((end - at) / 60)} min"))
        at -= step
    return grid
