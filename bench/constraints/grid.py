"""The whole run: every (vocabulary, constraint, engine, batch size) of a plan, checked for
mask agreement first and timed after."""

from __future__ import annotations

import gc
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.constraints.agreement import verify_engines
from bench.constraints.decode_loop import LogitsPool, Schedule, run_steps, time_config
from bench.constraints.engines import (
    Compiled,
    EngineSkipped,
    VocabContext,
    compile_for,
    engine_available,
    make_runner,
    prime_reference,
)
from bench.constraints.fits import fits, ratios
from bench.constraints.micro import admission_costs, apply_vs_memory, compile_times, mask_row_floor
from bench.constraints.plan import Plan
from bench.constraints.workloads import (
    Workload,
    allowed_set_workload,
    choice_workload,
    regex_workload,
)
from bench.machine import llc_bytes
from bench.synthetic_vocab import synthetic_vocab
from serving.constraints.engine import bitmask_words
from serving.constraints.vocab import Vocabulary


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_workloads(vocab: Vocabulary, plan: Plan) -> list[Workload]:
    workloads = []
    for kind in plan.workloads:
        if kind == "choice":
            workloads.extend(choice_workload(vocab, n) for n in plan.choice_sizes)
        elif kind == "regex":
            workloads.append(regex_workload(vocab))
        elif kind == "allowed-set":
            workloads.append(allowed_set_workload(vocab))
        else:
            raise ValueError(f"unknown workload {kind!r}")
    return workloads


def run(plan: Plan, engines: Sequence[str], threads: int, peer_compile: bool) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {
        "configs": [],
        "verification": [],
        "compile": [],
        "admission": [],
        "apply": [],
        "floor": [],
        "skipped": [],
        "notes": [],
    }
    runnable = []
    for engine in engines:
        why = engine_available(engine)
        if why is None:
            runnable.append(engine)
        else:
            results["skipped"].append({"engine": engine, "what": "everything", "why": why})
            log(f"skipping {engine}: {why}")
    llc = llc_bytes()
    pool_bytes = max(4 * llc, 64 * 2**20)
    for size in plan.vocab_sizes:
        vocab = synthetic_vocab(size)
        ctx = VocabContext(vocab, threads)
        results["floor"].append(mask_row_floor(size))
        verify_bitmask: np.ndarray | None = None
        for workload in build_workloads(vocab, plan):
            compiled: dict[str, Compiled] = {}
            for engine in runnable:
                try:
                    compiled[engine] = compile_for(engine, ctx, workload, plan)
                except (EngineSkipped, RuntimeError) as exc:
                    results["skipped"].append(
                        {"engine": engine, "what": f"{workload.name} @ {size}", "why": str(exc)}
                    )
                    continue
                results["compile"].append(
                    {
                        "engine": engine,
                        "vocab": size,
                        "workload": workload.name,
                        "compile_s": compiled[engine].compile_s,
                        "samples": 1,
                        "vocab_setup_s": ctx.setup_s.get(
                            "reference" if engine == "baseline" else engine, 0.0
                        ),
                    }
                )
                log(
                    f"V={size} {workload.name}: {engine} compiled in {compiled[engine].compile_s:.3f}s"
                )
            report = verify_engines(ctx, workload, compiled, plan.verify_rows, plan.verify_steps)
            for engine, verdict in report.items():
                results["verification"].append(
                    {"vocab": size, "workload": workload.name, "engine": engine, **verdict}
                )
                if verdict["verdict"] in ("DIFFERENT", "ERROR"):
                    log(f"MASK CHECK FAILED: {engine} {workload.name} @ {size}: {verdict}")
            primed = {id(c.value) for e, c in compiled.items() if e in ("reference", "baseline")}
            for value in [c.value for c in compiled.values() if id(c.value) in primed][:1]:
                baseline = compiled.get("baseline")
                seconds = prime_reference(
                    ctx, value, workload, baseline.transitions if baseline else None
                )
                results["notes"].append(
                    f"V={size} {workload.name}: reference memo primed from native masks in "
                    f"{seconds:.1f}s (untimed)"
                )
            if workload.name == "regex" and "native" in compiled:
                verify_bitmask = regex_bitmask_sample(ctx, compiled["native"], workload)
            if size == plan.compile_vocab and workload.name.startswith(("regex", "choice")):
                results["admission"].extend(admission_costs(ctx, workload, compiled, 2000))
            for engine, comp in compiled.items():
                for rows in plan.batch_sizes:
                    config = time_config(engine, ctx, comp, workload, rows, plan, pool_bytes)
                    results["configs"].append(config)
                    log(
                        f"V={size} {workload.name} B={rows} {engine}: "
                        f"p50 {config['step_us']['p50']:.1f} us, p99 {config['step_us']['p99']:.1f} us "
                        f"({config['steps']} steps)"
                    )
            del compiled
            gc.collect()
        for rows in plan.batch_sizes:
            bitmask = tile_rows(verify_bitmask, rows, size)
            results["apply"].append(
                apply_vs_memory(
                    size, rows, bitmask, pool_bytes, plan.budget_s, "xgrammar" in runnable
                )
            )
        results.setdefault("vocab_setup", []).append({"vocab": size, **ctx.setup_s})
        del ctx
        gc.collect()
    compile_rows, compile_skips = compile_times(
        synthetic_vocab(plan.compile_vocab), plan.compile_catalog, runnable, threads, peer_compile
    )
    results["compile"].extend(compile_rows)
    results["skipped"].extend(compile_skips)
    results["fits"] = fits(results["configs"])
    results["ratios"] = ratios(results["configs"])
    results["elapsed_s"] = time.perf_counter() - started
    reduced = [c for c in results["configs"] if c["reduced_steps"]]
    results["notes"].append(
        f"Timed steps per configuration: {plan.min_steps}-{plan.max_steps} "
        f"(about {plan.budget_s}s each); {len(reduced)} slow configurations ran fewer "
        f"(at least {plan.floor_steps}, about {plan.slow_cap_s}s each), so their p99 is "
        "close to their maximum."
    )
    return results


def regex_bitmask_sample(ctx: VocabContext, compiled: Compiled, workload: Workload) -> np.ndarray:
    """Real masks (the regex along its streams) for the apply measurements."""
    runner = make_runner("native", ctx, compiled, 64)
    schedule = Schedule(workload.streams, 64)
    schedule.start(runner, ctx.vocab.eos_token_ids)
    pool = LogitsPool(64, ctx.vocab.size, 0)
    run_steps(runner, schedule, pool, 7, None)
    assert runner.bitmask is not None
    return runner.bitmask.copy()


def tile_rows(sample: np.ndarray | None, rows: int, size: int) -> np.ndarray:
    if sample is None:
        rng = np.random.default_rng(4)
        return rng.integers(-(2**31), 2**31, size=(rows, bitmask_words(size)), dtype=np.int32)
    reps = math.ceil(rows / sample.shape[0])
    return np.ascontiguousarray(np.tile(sample, (reps, 1))[:rows])
