"""Measurements outside the decode loop that explain its figures: the memory floor of a mask
row, apply against plain tensor ops, admission and compile costs."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from bench.constraints.decode_loop import LogitsPool, percentile
from bench.constraints.engines import (
    Compiled,
    EngineSkipped,
    VocabContext,
    apply_bitmask,
    compile_for,
    native_apply_available,
)
from bench.constraints.plan import FULL, Plan
from bench.constraints.workloads import Workload, ebnf_literal, regex_escape, short_count
from bench.synthetic_vocab import Streams, catalog
from serving.constraints.engine import bitmask_words
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import Choice


def time_call(fn: Callable[[], Any], repeat: int, inner: int = 1) -> list[float]:
    """Per-call seconds of ``fn``, ``repeat`` samples of ``inner`` calls each."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t0) / inner / 1e9)
    return samples


def mask_row_floor(vocab_size: int, rows: int = 256, repeat: int = 200) -> dict[str, Any]:
    """The floor for writing one precomputed mask row: a memcpy of ceil(V/32)*4 bytes, timed
    over a block of rows (so no Python call per row) and per row with one call each."""
    words = bitmask_words(vocab_size)
    rng = np.random.default_rng(0)
    src = rng.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int32)
    dst = np.empty_like(src)
    block = time_call(lambda: np.copyto(dst, src), repeat)
    one_src, one_dst = src[0], dst[0]
    single = time_call(lambda: np.copyto(one_dst, one_src), repeat, inner=50)
    return {
        "vocab": vocab_size,
        "row_bytes": words * 4,
        "memcpy_per_row_us_block": percentile(block, 50) / rows * 1e6,
        "memcpy_one_row_call_us": percentile(single, 50) * 1e6,
    }


def apply_vs_memory(
    vocab_size: int,
    rows: int,
    bitmask: np.ndarray,
    pool_bytes: int,
    budget_s: float,
    with_xgrammar: bool,
) -> dict[str, Any]:
    """Applying a bitmask to fp32 logits [rows, V] against plain memory passes over the same
    logits (in-place add_, which reads and writes every element as the apply does; fill_,
    write only; copy_ from another buffer). All on the same rotating buffers."""
    pool = LogitsPool(rows, vocab_size, pool_bytes, seed=2)
    other = LogitsPool(rows, vocab_size, 0, seed=3).buffers[0]
    mask_t = torch.from_numpy(bitmask)
    ops: dict[str, Callable[[torch.Tensor], Any]] = {
        "add_": lambda x: x.add_(0.0),
        "fill_": lambda x: x.fill_(0.5),
        "copy_": lambda x: x.copy_(other),
    }
    if native_apply_available():
        ops["native_apply"] = lambda x: apply_bitmask(x, bitmask)
    if with_xgrammar:
        import xgrammar as xgr

        ops["xgrammar_apply"] = lambda x: xgr.apply_token_bitmask_inplace(x, mask_t)
    result: dict[str, Any] = {"vocab": vocab_size, "batch": rows, "bytes": rows * vocab_size * 4}
    one = max(rows * vocab_size * 4 / 5e9, 1e-6)  # rough seconds per pass
    count = int(min(500, max(15, budget_s / one)))
    for name, op in ops.items():
        samples = []
        for _ in range(count):
            buf = pool.next()
            t0 = time.perf_counter_ns()
            op(buf)
            samples.append(time.perf_counter_ns() - t0)
            pool.restore(buf)
        result[f"{name}_us"] = percentile(samples, 50) / 1e3
    result["passes"] = count
    if "native_apply_us" in result:
        result["native_apply_over_add_"] = result["native_apply_us"] / result["add__us"]
        result["native_apply_GBps"] = 2 * result["bytes"] / result["native_apply_us"] / 1e3
    if "xgrammar_apply_us" in result:
        result["xgrammar_apply_over_add_"] = result["xgrammar_apply_us"] / result["add__us"]
    result["add__GBps"] = 2 * result["bytes"] / result["add__us"] / 1e3
    return result


def admission_costs(
    ctx: VocabContext, workload: Workload, compiled: dict[str, Compiled], count: int
) -> list[dict[str, Any]]:
    """Admitting a request whose constraint is already compiled, per engine (µs each)."""
    out = []
    rows = 256
    for engine, comp in compiled.items():
        if engine in ("native", "reference"):
            factory = ctx.native_engine() if engine == "native" else ctx.reference_engine()
            batch = factory.new_batch(rows)
            outputs: list[list[int]] = [[] for _ in range(rows)]
            state = {"i": 0}

            def admit(batch: Any = batch, value: Any = comp.value, outputs=outputs, state=state):
                row = state["i"] % rows
                state["i"] += 1
                batch.add(row, value, outputs[row], [1, 2, 3])

            what = "Batch.add(row, compiled, output_ids, prompt_ids)"
        elif engine == "baseline":

            def admit(value: Any = comp.value) -> None:
                value.initial_state()

            what = "compiled.initial_state()"
        elif engine == "xgrammar":
            import xgrammar as xgr

            def admit(value: Any = comp.value) -> None:
                xgr.GrammarMatcher(value)

            what = "GrammarMatcher(compiled)"
        elif engine == "llguidance":

            def admit(value: Any = comp.value) -> None:
                value.deep_copy()

            what = "LLMatcher.deep_copy() of a compiled matcher"
        else:
            continue
        for _ in range(min(50, count)):
            admit()
        samples = time_call(admit, count)
        out.append(
            {
                "engine": engine,
                "vocab": ctx.vocab.size,
                "workload": workload.name,
                "what": what,
                "p50_us": percentile(samples, 50) * 1e6,
                "p99_us": percentile(samples, 99) * 1e6,
                "count": count,
            }
        )
    return out


def compile_times(
    vocab: Vocabulary, n_titles: int, engines: Sequence[str], threads: int, peer_compile: bool
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Compile time of an ``n_titles``-string catalog against ``vocab`` (a fresh engine each
    time, so no cache is hit), with the vocabulary's own setup time reported apart."""
    out: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    titles = tuple(catalog(n_titles))
    spec = Choice(titles)
    name = f"choice-{short_count(n_titles)}"
    for engine in engines:
        ctx = VocabContext(vocab, threads)
        samples: list[float] = []
        try:
            if engine == "native":
                from serving.constraints.native import NativeEngine

                ctx.native_engine()
                for _ in range(3):
                    fresh = NativeEngine(vocab)  # an empty compile cache
                    t0 = time.perf_counter()
                    fresh.compile(spec)
                    samples.append(time.perf_counter() - t0)
            elif engine in ("reference", "baseline"):
                if engine == "baseline" and "reference" in engines:
                    continue
                t0 = time.perf_counter()
                ctx.reference_engine().compile(spec)
                samples.append(time.perf_counter() - t0)
            elif engine == "xgrammar":
                if not peer_compile:
                    skipped.append(
                        {
                            "engine": engine,
                            "what": f"compile {name} @ {vocab.size}",
                            "why": "minutes on this machine (see the choice-10k compile time "
                            "in the grid); run with --peer-compile to include it",
                        }
                    )
                    continue
                ctx.xgr_info()
                plan = Plan(**{**FULL.__dict__, "peer_max_choices": n_titles})
                wl = Workload(
                    name,
                    spec,
                    Streams(()),
                    ebnf="root ::= " + " | ".join(ebnf_literal(t) for t in titles),
                    n_choices=n_titles,
                )
                samples.append(compile_for(engine, ctx, wl, plan).compile_s)
            elif engine == "llguidance":
                ctx.ll_tokenizer()
                plan = Plan(**{**FULL.__dict__, "peer_max_choices": n_titles})
                wl = Workload(
                    name,
                    spec,
                    Streams(()),
                    regex="(" + "|".join(regex_escape(t) for t in titles) + ")",
                    n_choices=n_titles,
                )
                samples.append(compile_for(engine, ctx, wl, plan).compile_s)
            else:
                continue
        except (ImportError, EngineSkipped, RuntimeError) as exc:
            skipped.append({"engine": engine, "what": f"compile {name}", "why": str(exc)})
            continue
        out.append(
            {
                "engine": "reference" if engine == "baseline" else engine,
                "vocab": vocab.size,
                "workload": name,
                "compile_s": min(samples),
                "samples": len(samples),
                "vocab_setup_s": ctx.setup_s.get(
                    "reference" if engine == "baseline" else engine, 0.0
                ),
            }
        )
    return out, skipped
