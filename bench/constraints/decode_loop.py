"""The timed decode step: teacher-forced streams with re-admission as they end, and logits
buffers rotated through more memory than the cache holds, so apply reads cold rows as in serving."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.constraints.engines import Compiled, Runner, VocabContext, make_runner
from bench.constraints.plan import Plan
from bench.constraints.workloads import Workload
from bench.synthetic_vocab import Streams
from serving.constraints.engine import bitmask_words


class Schedule:
    """Which stream each row is on and what it feeds next. Every engine gets the same schedule:
    row r starts on stream r; a row whose next token is EOS is re-admitted (untimed) on the
    next unused stream, in row order."""

    def __init__(self, streams: Streams, rows: int) -> None:
        self.streams = streams.streams
        self.rows = rows
        self.eos: set[int] = set()
        self.current = [self.streams[r % len(self.streams)] for r in range(rows)]
        self.pos = [0] * rows
        self.next_stream = rows
        self.sampled: list[int | None] = [None] * rows

    def start(self, runner: Runner, eos: Sequence[int]) -> None:
        self.eos = set(eos)
        for row in range(self.rows):
            runner.admit(row)

    def feed(self) -> list[tuple[int, int]]:
        return [(r, t) for r, t in enumerate(self.sampled) if t is not None]

    def after_step(self, runner: Runner) -> list[tuple[int, int]]:
        """Pretend to sample each row's next token from its stream; re-admit finished rows. Returns the
        (row, token) pairs sampled, EOS included, for mask checks."""
        sampled = []
        for row in range(self.rows):
            token = self.current[row][self.pos[row]]
            sampled.append((row, token))
            if token in self.eos:
                self.current[row] = self.streams[self.next_stream % len(self.streams)]
                self.next_stream += 1
                self.pos[row] = 0
                self.sampled[row] = None
                runner.admit(row)
            else:
                self.pos[row] += 1
                self.sampled[row] = token
        return sampled


class LogitsPool:
    """Rotating float32 logits buffers whose total size exceeds the last-level cache, each
    restored to the same random values after use (the restore is not timed)."""

    def __init__(self, rows: int, size: int, target_bytes: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.pristine = torch.randn((rows, size), generator=generator, dtype=torch.float32)
        count = max(3, math.ceil(target_bytes / (rows * size * 4)))
        self.buffers = [self.pristine.clone() for _ in range(count)]
        self.index = 0

    def next(self) -> torch.Tensor:
        buffer = self.buffers[self.index]
        self.index = (self.index + 1) % len(self.buffers)
        return buffer

    def restore(self, buffer: torch.Tensor) -> None:
        buffer.copy_(self.pristine)


def applied_bitmask(logits: torch.Tensor, rows: int) -> np.ndarray:
    """The bitmask a row's logits show after apply: bit set where the logit is not -inf."""
    allowed = (logits[:rows] != -math.inf).numpy()
    words = bitmask_words(logits.shape[1])
    packed = np.packbits(allowed, axis=1, bitorder="little")
    out = np.zeros((rows, words * 4), dtype=np.uint8)
    out[:, : packed.shape[1]] = packed
    return out.view(np.int32)


@dataclass
class StepTimes:
    advance: list[int] = field(default_factory=list)
    fill: list[int] = field(default_factory=list)
    apply: list[int] = field(default_factory=list)

    def add(self, t0: int, t1: int, t2: int, t3: int) -> None:
        self.advance.append(t1 - t0)
        self.fill.append(t2 - t1)
        self.apply.append(t3 - t2)


def run_steps(
    runner: Runner,
    schedule: Schedule,
    pool: LogitsPool,
    steps: int,
    times: StepTimes | None,
    check: Callable[[int, torch.Tensor, list[tuple[int, int]]], None] | None = None,
) -> float:
    """Run ``steps`` decode steps; returns the wall time they took (timed part only)."""
    clock = time.perf_counter_ns
    total = 0
    for step in range(steps):
        runner.prepare(schedule.feed())
        logits = pool.next()
        t0 = clock()
        runner.advance()
        t1 = clock()
        runner.fill()
        t2 = clock()
        runner.apply(logits)
        t3 = clock()
        total += t3 - t0
        if times is not None:
            moved = getattr(runner, "inner_fill_ns", 0)
            times.add(t0, t1, t2 + moved, t3)
        sampled = schedule.after_step(runner)
        if check is not None:
            check(step, logits, sampled)
        pool.restore(logits)
    return total / 1e9


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(times: StepTimes) -> dict[str, Any]:
    step = np.asarray(times.advance) + np.asarray(times.fill) + np.asarray(times.apply)
    fill = np.asarray(times.advance) + np.asarray(times.fill)
    us = 1e-3
    return {
        "steps": len(step),
        "step_us": {
            "p50": percentile(step, 50) * us,
            "p90": percentile(step, 90) * us,
            "p99": percentile(step, 99) * us,
            "max": float(step.max()) * us,
            "mean": float(step.mean()) * us,
        },
        # advance + fill: the mask computation, without the apply
        "fill_us": {"p50": percentile(fill, 50) * us, "p99": percentile(fill, 99) * us},
        "advance_us": {"p50": percentile(times.advance, 50) * us},
        "apply_us": {
            "p50": percentile(times.apply, 50) * us,
            "p99": percentile(times.apply, 99) * us,
        },
    }


def time_config(
    engine: str,
    ctx: VocabContext,
    compiled: Compiled,
    workload: Workload,
    rows: int,
    plan: Plan,
    pool_bytes: int,
) -> dict[str, Any]:
    runner = make_runner(engine, ctx, compiled, rows)
    schedule = Schedule(workload.streams, rows)
    schedule.start(runner, ctx.vocab.eos_token_ids)
    pool = LogitsPool(rows, ctx.vocab.size, pool_bytes)
    # Warm-up: up to warmup_steps or warmup_cap_s, at least 3 steps.
    warm = StepTimes()
    started = time.perf_counter()
    done = 0
    while done < 3 or (
        done < plan.warmup_steps and time.perf_counter() - started < plan.warmup_cap_s
    ):
        run_steps(runner, schedule, pool, 1, warm)
        done += 1
    estimate = max(float(np.median(np.asarray(warm.advance) + warm.fill + warm.apply)) / 1e9, 1e-7)
    steps = int(min(plan.max_steps, max(plan.min_steps, plan.budget_s / estimate)))
    reduced = steps * estimate > plan.slow_cap_s
    if reduced:
        steps = max(plan.floor_steps, int(plan.slow_cap_s / estimate))
    times = StepTimes()
    gc.collect()
    gc.disable()
    try:
        run_steps(runner, schedule, pool, steps, times)
    finally:
        gc.enable()
    dead = getattr(runner, "dead", [])
    runner.close()
    result = summarize(times)
    result.update(
        engine=engine,
        vocab=ctx.vocab.size,
        workload=workload.name,
        batch=rows,
        warmup_steps=done,
        reduced_steps=reduced,
        logits_buffers=len(pool.buffers),
        dead_rows_last_step=len(dead),
    )
    return result
