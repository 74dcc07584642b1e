"""Per-step cost as fixed + per-row (a line over batch sizes), and each peer against native,
so the summary can say where the cost comes from and how far apart the engines are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least squares ``y = a + b x``; also R^2."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if len(x) < 2:
        return {"a": float(y[0]) if len(y) else float("nan"), "b": float("nan"), "r2": float("nan")}
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"a": float(a), "b": float(b), "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def fits(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for c in configs:
        groups.setdefault((c["engine"], c["vocab"], c["workload"]), []).append(c)
    out = []
    for (engine, vocab, workload), items in groups.items():
        items.sort(key=lambda c: c["batch"])
        batches = [c["batch"] for c in items]
        out.append(
            {
                "engine": engine,
                "vocab": vocab,
                "workload": workload,
                "batches": batches,
                "step": fit_line(batches, [c["step_us"]["p50"] for c in items]),
                "fill": fit_line(batches, [c["fill_us"]["p50"] for c in items]),
            }
        )
    return out


def ratios(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step-time p50 of each other engine over native's (how many times slower than native)."""
    by_key = {(c["engine"], c["vocab"], c["workload"], c["batch"]): c for c in configs}
    out = []
    for (engine, vocab, workload, batch), c in by_key.items():
        if engine != "native":
            continue
        row: dict[str, Any] = {"vocab": vocab, "workload": workload, "batch": batch}
        for other in ("baseline", "xgrammar", "llguidance", "reference"):
            o = by_key.get((other, vocab, workload, batch))
            if o is not None:
                row[f"{other}_over_native_step_p50"] = o["step_us"]["p50"] / c["step_us"]["p50"]
                row[f"{other}_over_native_fill_p50"] = o["fill_us"]["p50"] / c["fill_us"]["p50"]
        out.append(row)
    return out
