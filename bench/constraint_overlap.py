"""What the constraint processor adds to a decode step when its mask fill overlaps the forward.

Run from the repository root::

    python bench/constraint_overlap.py                      # B=256, V=128,256, 10 ms forward
    python bench/constraint_overlap.py --batch 32 --forward-ms 5

One step is what vLLM's model runner does around the processor: ``update_state`` (the batch
update), the forward pass, then ``apply`` on the step's logits. The forward pass is a stand-in
of a set duration that releases the GIL and leaves the CPU free (``time.sleep``), as a GPU
forward does. The processor's cost per step is the step's wall time minus the forward's
measured wall time. ``apply`` is run two ways:

- up to the device call: everything ``apply`` does on the host before handing the mask to the
  device (waiting for or running the fill, reporting dead rows). On a GPU what follows is a
  non-blocking copy of the mask rows and one kernel launch (``bench/gpu_check.py`` times it);
- whole, on logits on PyTorch's ``meta`` device: the device path with torch's fallback ops,
  whose host-side dispatch (a dozen ops) is timed for real while their device work is nothing;
  an upper bound of the host cost, not what the kernel path costs.

Every row runs the address regex of ``bench/constraints/workloads.py`` over the synthetic
vocabulary, teacher-forced by text streams; a row whose stream ends is re-admitted with the next
one. Modes:

- ``sequential``: the fill runs inside ``apply`` (the processor before the overlap);
- ``overlap``: the production processor: ``update_state`` starts the fill in the background;
- ``overlap, async placeholders``: as under vLLM's async scheduling, each row's last token is a
  ``-1`` placeholder at ``update_state`` and written in just before ``apply``, so no row can be
  filled early and the fill lands in ``apply`` (where, on a GPU, it runs while the device is
  still busy with the forward pass, since the CPU runs ahead of it).

Results: ``--out`` (JSON) and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: E402

from bench.machine import machine_info  # noqa: E402
from bench.synthetic_vocab import ADDRESS_REGEX, address, synthetic_vocab, text_streams  # noqa: E402
from serving.constraints.native import NativeEngine, threads  # noqa: E402
from serving.constraints.vllm_v1 import ConstraintLogitsProcessor  # noqa: E402

MODES = ("sequential", "overlap", "overlap, async placeholders")


class SequentialProcessor(ConstraintLogitsProcessor):
    """The processor without the overlap: ``update_state`` only mirrors the batch, so the whole
    fill happens in ``apply``."""

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            self._update(batch_update)


class WithoutDeviceApply:
    """``apply`` up to the device call: the fill (or the wait for it) and the dead-row report,
    not the mask's copy and apply, whose host side on a GPU is a copy and one kernel launch
    (``bench/gpu_check.py`` times it there) but on the meta device a dozen torch ops."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        proc: Any = self
        if proc.batch.occupied_rows():
            dead = proc.batch.fill(proc.bitmask_np)
            if dead:
                proc._report_dead(dead)
        return logits


class SequentialWithoutDeviceApply(WithoutDeviceApply, SequentialProcessor):
    pass


class OverlapWithoutDeviceApply(WithoutDeviceApply, ConstraintLogitsProcessor):
    pass


def run(
    mode: str,
    device_apply: bool,
    engine: NativeEngine,
    streams: list[tuple[int, ...]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    sequential = mode == "sequential"
    cls: type[ConstraintLogitsProcessor]
    if device_apply:
        cls = SequentialProcessor if sequential else ConstraintLogitsProcessor
    else:
        cls = SequentialWithoutDeviceApply if sequential else OverlapWithoutDeviceApply
    proc = cls.for_engine(engine, args.batch, device="meta")
    placeholders = mode.endswith("placeholders")
    params = SamplingParams(extra_args={"constraint": {"regex": ADDRESS_REGEX}})
    rng = random.Random(5)
    outputs: list[list[int]] = [[] for _ in range(args.batch)]
    position = [0] * args.batch
    current = [rng.randrange(len(streams)) for _ in range(args.batch)]
    added = [(row, params, [1, 2, 3], outputs[row]) for row in range(args.batch)]
    update: BatchUpdate | None = BatchUpdate(args.batch, [], added, [])
    logits = torch.empty(args.batch, engine.vocab.size, device="meta")
    forward_s = args.forward_ms / 1000
    overhead: list[float] = []
    steps: list[float] = []
    in_update: list[float] = []
    in_apply: list[float] = []
    pending: list[tuple[list[int], int]] = []  # placeholders and the tokens they stand for
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        proc.update_state(update)
        f0 = time.perf_counter()
        if forward_s:
            time.sleep(forward_s)
        f1 = time.perf_counter()
        for output, token in pending:  # vLLM's _sample writes the sampled tokens in
            output[-1] = token
        proc.apply(logits)
        t1 = time.perf_counter()
        if step >= args.warmup:
            steps.append(t1 - t0)
            overhead.append((t1 - t0) - (f1 - f0))
            in_update.append(f0 - t0)
            in_apply.append(t1 - f1)
        # The sampled tokens of this step, for the next (untimed: vLLM's own bookkeeping).
        readmit = []
        pending = []
        for row in range(args.batch):
            stream = streams[current[row]]
            if position[row] >= len(stream):
                current[row] = rng.randrange(len(streams))
                position[row] = 0
                outputs[row] = []
                readmit.append((row, params, [1, 2, 3], outputs[row]))
                continue
            outputs[row].append(stream[position[row]])
            position[row] += 1
            if placeholders:
                pending.append((outputs[row], outputs[row][-1]))
                outputs[row][-1] = -1
        update = BatchUpdate(args.batch, [], readmit, []) if readmit else None
    return {
        "mode": mode,
        "apply": "meta device (torch ops)" if device_apply else "up to the device call",
        "steps": len(steps),
        "step_ms_p50": round(statistics.median(steps) * 1e3, 3),
        "overhead_ms_p50": round(statistics.median(overhead) * 1e3, 3),
        "overhead_ms_p90": round(_quantile(overhead, 0.9) * 1e3, 3),
        "overhead_ms_mean": round(statistics.fmean(overhead) * 1e3, 3),
        "update_state_ms_p50": round(statistics.median(in_update) * 1e3, 3),
        "apply_ms_p50": round(statistics.median(in_apply) * 1e3, 3),
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--forward-ms", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "bench/results/constraint_overlap.json"))
    args = parser.parse_args(argv)

    vocab = synthetic_vocab(args.vocab)
    engine = NativeEngine(vocab)
    rng = random.Random(11)
    streams = list(text_streams(vocab, [address(rng) for _ in range(500)]).streams)
    results = []
    for device_apply in (False, True):
        for forward_ms in (0.0, args.forward_ms):
            for mode in MODES:
                run_args = argparse.Namespace(**{**vars(args), "forward_ms": forward_ms})
                result = {
                    "forward_ms": forward_ms,
                    **run(mode, device_apply, engine, streams, run_args),
                }
                results.append(result)
                print(json.dumps(result), flush=True)
    report = {
        "command": " ".join(["python", "bench/constraint_overlap.py", *(argv or sys.argv[1:])]),
        "batch": args.batch,
        "vocab": args.vocab,
        "threads": threads(),
        "machine": machine_info(("torch", "numpy", "vllm")),
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Constraint processor with a stand-in forward pass (B={report['batch']}, "
        f"V={report['vocab']:,}, {report['threads']} threads)",
        "",
        f"Command: `{report['command']}`",
        "",
        "| apply | forward | mode | step p50 | processor adds p50 | p90 | mean "
        "| in update_state p50 | in apply p50 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['apply']} | {r['forward_ms']:g} ms | {r['mode']} | {r['step_ms_p50']} ms | "
            f"{r['overhead_ms_p50']} ms | {r['overhead_ms_p90']} ms | {r['overhead_ms_mean']} ms | "
            f"{r['update_state_ms_p50']} ms | {r['apply_ms_p50']} ms |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
