"""Timing engines is only fair if they enforce the same constraint: their applied masks are
compared on the same streams before anything is timed."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bench.constraints.decode_loop import LogitsPool, Schedule, applied_bitmask, run_steps
from bench.constraints.engines import EXACT_ENGINES, Compiled, Runner, VocabContext, make_runner
from bench.constraints.workloads import Workload


def verify_engines(
    ctx: VocabContext,
    workload: Workload,
    compiled: dict[str, Compiled],
    rows: int,
    steps: int,
) -> dict[str, dict[str, Any]]:
    """Run every compiled engine ``steps`` steps on ``rows`` rows with the same schedule and
    compare the masks they applied (read back from the logits), and each engine's own bitmask
    against what it applied. The first exact engine is the reference point."""
    applied: dict[str, list[np.ndarray]] = {}
    problems: dict[str, list[str]] = {}
    for engine, comp in compiled.items():
        runner = make_runner(engine, ctx, comp, rows)
        schedule = Schedule(workload.streams, rows)
        schedule.start(runner, ctx.vocab.eos_token_ids)
        pool = LogitsPool(rows, ctx.vocab.size, 0, seed=1)
        masks: list[np.ndarray] = []
        issues: list[str] = []

        def check(
            step: int,
            logits: torch.Tensor,
            sampled: list[tuple[int, int]],
            runner: Runner = runner,
            masks: list[np.ndarray] = masks,
            issues: list[str] = issues,
        ) -> None:
            mask = applied_bitmask(logits, rows)
            masks.append(mask)
            own = runner.bitmask
            if own is not None and not np.array_equal(own[:rows], mask):
                issues.append(f"step {step}: the applied logits differ from the bitmask")
            for row, token in sampled:
                if not (int(mask[row, token >> 5]) >> (token & 31)) & 1:
                    issues.append(f"step {step} row {row}: stream token {token} not allowed")
            if getattr(runner, "dead", None):
                issues.append(f"step {step}: dead rows {runner.dead}")

        run_steps(runner, schedule, pool, steps, None, check)
        runner.close()
        applied[engine] = masks
        problems[engine] = issues
    exact = [e for e in compiled if e in EXACT_ENGINES]
    base = exact[0] if exact else next(iter(compiled))
    report: dict[str, dict[str, Any]] = {}
    for engine, masks in applied.items():
        differ = subset = 0
        for mine, theirs in zip(masks, applied[base], strict=True):
            for row in range(rows):
                if np.array_equal(mine[row], theirs[row]):
                    continue
                differ += 1
                if not np.any(mine[row] & ~theirs[row]):
                    subset += 1
        if differ == 0:
            verdict = "equal"
        elif engine == "llguidance" and subset == differ:
            verdict = "subset"
        else:
            verdict = "DIFFERENT"
        report[engine] = {
            "against": base,
            "masks": steps * rows,
            "differing_masks": differ,
            "subset_masks": subset,
            "verdict": verdict if not problems[engine] else "ERROR",
            "problems": problems[engine][:5],
        }
    return report
