"""Device check for the constraint processor's GPU apply: correctness bit for bit, then timing.

Run from the repository root on a CUDA machine (``bench/gpu_check.sh`` builds the native
extension and installs carried wheels first)::

    python3 bench/gpu_check.py --out bench/results/gpu_check.json
    python3 bench/gpu_check.py --cpu-interpret     # no GPU: tiny sizes, Triton's interpreter

1. **Check.** For B in {1, 32, 256}, V in {32,000, 128,256, 262,144} (plus 50,257, a width that is
   not a multiple of 32), float32 and bfloat16, with every row constrained and with only some
   rows (an unordered index list), the logits after each of the project's device paths must
   equal, bit for bit, the native CPU apply on a copy of the same logits: ``kernel`` (what the
   vLLM adapter runs: ``apply_bitmask_async_``, mask rows copied as they are, the fused Triton
   kernel), ``kernel_gather`` (``apply_bitmask_``: rows gathered on the host first),
   ``kernel_write_only`` (the kernel's no-read variant), ``torch_path`` and ``torch_indexed``
   (the fallbacks without triton). XGrammar's apply is compared too, as a peer (reported, not
   required).
2. **Time.** CUDA events around each call, 10 warm-up calls, the median of 50, the L2 cache
   flushed before each call: the kernel on a device-resident mask, the same from pinned host
   memory (copy + launch, and gather + copy + launch), the torch path, a plain
   ``masked_fill_`` with a precomputed bool mask, and XGrammar's apply. The floor is the time to
   read and write the logits once at the bandwidth of a device-to-device copy measured here.

Only torch, numpy, triton, xgrammar (optional), ``serving.constraints`` and ``bench.machine``
(standard library only) are imported; no vLLM. Without a CUDA device (and without ``--cpu-interpret``) it says so and exits 0. It exits
1 when one of the project's paths differs from the CPU apply. Results go to ``--out`` (JSON);
a short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.machine import gpu_info, machine_info  # noqa: E402

DEADLINE_S = 360.0  # stop timing (keep what is done) well inside the device's 10 minutes
FULL_BATCHES = (1, 32, 256)
FULL_VOCABS = (32_000, 128_256, 262_144)
ODD_VOCAB = 50_257  # checked only: a width that is not a multiple of 32
TINY_BATCHES = (1, 3)
TINY_VOCABS = (100, 1_000)
TINY_ODD_VOCAB = 77


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench/results/gpu_check.json"))
    parser.add_argument(
        "--cpu-interpret",
        action="store_true",
        help="no GPU: run the same checks and timing code on CPU tensors at tiny sizes, the "
        "kernel in Triton's interpreter (a dry run of this script, not a measurement)",
    )
    parser.add_argument("--reps", type=int, default=50, help="timed calls per measurement")
    args = parser.parse_args(argv)
    if args.cpu_interpret:
        # Triton reads this when a kernel is built; set it before anything imports triton.
        os.environ["TRITON_INTERPRET"] = "1"

    import torch

    if not args.cpu_interpret and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; nothing to check (use --cpu-interpret for a dry run)"
        )
        return 0
    started = time.perf_counter()
    check = DeviceCheck(
        device=torch.device("cpu" if args.cpu_interpret else "cuda"),
        reps=2 if args.cpu_interpret else args.reps,
        warmup=1 if args.cpu_interpret else 10,
    )
    batches = TINY_BATCHES if args.cpu_interpret else FULL_BATCHES
    vocabs = TINY_VOCABS if args.cpu_interpret else FULL_VOCABS
    odd = TINY_ODD_VOCAB if args.cpu_interpret else ODD_VOCAB
    dtypes = (torch.float32, torch.bfloat16)

    results: dict[str, Any] = {
        "mode": "cpu-interpret (dry run, not a measurement)" if args.cpu_interpret else "cuda",
        "machine": check.machine(),
        "notes": check.notes,
    }
    print(f"gpu_check: {results['machine'].get('device_name')}", flush=True)
    results["copy_bandwidth_gb_s"] = check.copy_bandwidth()
    print(f"device-to-device copy: {results['copy_bandwidth_gb_s']:.0f} GB/s", flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        """Written after every stage, so a run cut short still leaves its results."""
        results["elapsed_s"] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps(results, indent=2) + "\n")

    checks: list[dict[str, Any]] = []
    results["checks"] = checks
    timings: list[dict[str, Any]] = []
    results["timings"] = timings
    for vocab in (*vocabs, odd):
        for batch in batches:
            for dtype in dtypes:
                for subset in (False, True):
                    checks.append(check.check_case(batch, vocab, dtype, subset))
                    checks[-1]["elapsed_s"] = round(time.perf_counter() - started, 1)
                    print(_check_line(checks[-1]), flush=True)
    save()

    for vocab in vocabs:
        for batch in batches:
            for dtype in dtypes:
                if time.perf_counter() - started > DEADLINE_S:
                    check.notes.append(f"timing stopped at the {DEADLINE_S:.0f} s deadline")
                    break
                timings.append(check.time_case(batch, vocab, dtype))
                print(_timing_line(timings[-1]), flush=True)
                save()
    results["tuning"] = check.tune(max(batches), vocabs[1], torch.bfloat16)
    save()
    failed = [c for c in checks if not c["ours_equal"]]
    print()
    print(summary_table(results))
    print(f"\nresults: {out}  ({results['elapsed_s']} s)")
    for note in check.notes:
        print(f"note: {note}")
    if failed:
        print(f"FAILED: {len(failed)} check(s) where a project path differs from the CPU apply")
        return 1
    print("all project paths equal the CPU apply bit for bit")
    return 0


class DeviceCheck:
    """The cases, the peers and the timer, on one device (CUDA, or CPU for the dry run)."""

    def __init__(self, device: Any, reps: int, warmup: int) -> None:
        import torch

        from serving.constraints import apply, triton_apply

        self.torch = torch
        self.apply = apply
        self.triton_apply = triton_apply
        self.device = device
        self.cuda = device.type == "cuda"
        self.reps = reps
        self.warmup = warmup
        self.notes: list[str] = []
        self.bandwidth: float | None = None
        if not triton_apply.available():
            raise SystemExit("gpu_check: triton is not installed; the fused kernel cannot run")
        self.xgrammar_apply = self._load_xgrammar()
        # Flushing L2 between timed calls: write a buffer larger than any L2 there is.
        self._flush = torch.empty((256 if self.cuda else 1) << 20, dtype=torch.int8, device=device)
        forbidden = [m for m in ("django", "fastapi", "vllm") if m in sys.modules]
        if forbidden:
            self.notes.append(f"unexpected imports: {forbidden}")

    # -- setup ---------------------------------------------------------------------------

    def machine(self) -> dict[str, Any]:
        info = machine_info(("torch", "triton", "xgrammar", "numpy"))
        if self.cuda:
            info.update(gpu_info(self.torch, self.device))
        else:
            info["device_name"] = "cpu (Triton interpreter)"
        return info

    def _load_xgrammar(self) -> Callable[..., Any] | None:
        """XGrammar's public apply; failing that (its wheel installed without its dependencies)
        its Triton kernel module loaded on its own; failing that, None with a note."""
        try:
            import xgrammar

            return xgrammar.apply_token_bitmask_inplace  # type: ignore[no-any-return]
        except Exception as exc:  # ImportError, or a dependency missing inside it
            reason = f"{type(exc).__name__}: {exc}"
        import importlib.util

        try:
            spec = importlib.util.find_spec("xgrammar")
        except Exception:
            spec = None
        if spec is None or not spec.submodule_search_locations or not self.cuda:
            self.notes.append(f"xgrammar skipped: {reason}")
            return None
        path = Path(next(iter(spec.submodule_search_locations)))
        path = path / "kernels" / "apply_token_bitmask_inplace_triton.py"
        try:
            kernel_spec = importlib.util.spec_from_file_location("_xgr_triton_apply", path)
            assert kernel_spec is not None and kernel_spec.loader is not None
            module = importlib.util.module_from_spec(kernel_spec)
            kernel_spec.loader.exec_module(module)
            fn = module.apply_token_bitmask_inplace_triton
        except Exception as exc:
            self.notes.append(f"xgrammar skipped: {reason}; its kernel file: {exc}")
            return None
        self.notes.append(f"xgrammar's package did not import ({reason}); timed its Triton kernel")

        def apply(logits: Any, bitmask: Any, *, indices: Any = None) -> None:
            fn(logits, bitmask, None, indices)

        return apply

    def case(self, batch: int, vocab: int, dtype: Any, seed: int) -> tuple[Any, Any]:
        """Device logits and a host bitmask (pinned on CUDA, as the adapter's) whose rows mix
        the masks constrained decoding produces: sparse, half, dense, all and none allowed."""
        import numpy as np

        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(seed)
        logits = torch.randn(batch, vocab, generator=gen, device=self.device, dtype=torch.float32)
        logits = (logits * 8).to(dtype)
        logits[0, :2] = float("nan")  # specials the apply must not touch where allowed
        rng = np.random.default_rng(seed)
        words = (vocab + 31) // 32
        rand = rng.integers(0, 2**32, size=(batch, words), dtype=np.uint64).astype(np.uint32)
        mask = np.empty((batch, words), dtype=np.uint32)
        for r in range(batch):
            kind = r % 5
            if kind == 0:  # sparse: about 0.3% allowed
                row = np.zeros(vocab, dtype=bool)
                row[rng.integers(0, vocab, size=max(1, vocab // 300))] = True
                mask[r] = _pack(row, words)
            elif kind == 1:
                mask[r] = rand[r]
            elif kind == 2:  # dense: about 97% allowed
                mask[r] = ~(rand[r] & rand[(r + 1) % batch] & (rand[r] >> 1) & (rand[r] << 3))
            elif kind == 3:
                mask[r] = 0xFFFFFFFF
            else:
                mask[r] = 0
        if batch == 1:
            mask[0] = rand[0]
        host = torch.from_numpy(mask.view(np.int32))
        if self.cuda:
            host = host.pin_memory()
        return logits, host

    # -- correctness ---------------------------------------------------------------------

    def check_case(self, batch: int, vocab: int, dtype: Any, subset: bool) -> dict[str, Any]:
        torch = self.torch
        logits, mask = self.case(batch, vocab, dtype, seed=batch * 7 + vocab)
        rows = _subset(batch) if subset else None
        expected = logits.cpu()
        self.apply.apply_bitmask_(expected, mask.numpy(), rows=rows)  # the native CPU apply
        expected_bits = _bits(expected)
        result: dict[str, Any] = {
            "batch": batch,
            "vocab": vocab,
            "dtype": str(dtype).removeprefix("torch."),
            "rows": "subset" if subset else "all",
        }

        def run(name: str, fn: Callable[[Any], Any]) -> None:
            out = logits.clone()
            try:
                fn(out)
                if self.cuda:
                    torch.cuda.synchronize()
                result[name] = bool(torch.equal(_bits(out.cpu()), expected_bits))
            except Exception as exc:
                result[name] = False
                result[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()

        all_rows = rows if rows is not None else list(range(batch))
        run("kernel", lambda out: self.production_apply(out, mask, all_rows))
        run("kernel_gather", lambda out: self.gather_apply(out, mask, rows))
        run("kernel_write_only", lambda out: self.kernel_write_only(out, mask, rows))
        run("torch_path", lambda out: self.apply._apply_torch_(out, mask, rows))
        run("torch_indexed", lambda out: self.torch_indexed(out, mask, all_rows))
        result["ours_equal"] = all(result[k] for k in OURS)
        xgr = self.xgrammar_apply
        if xgr is not None:
            device_mask = mask.to(self.device)
            run("xgrammar", lambda out: xgr(out, device_mask, indices=rows))
        return result

    def production_apply(self, logits: Any, mask: Any, rows: list[int]) -> None:
        """What the vLLM adapter runs on CUDA logits: ``apply_bitmask_async_`` (the mask rows
        copied as they are, the kernel picks each row's). On the CPU dry run the same body is
        called directly (CPU logits would take the native apply there)."""
        if self.cuda:
            if not self.apply._kernel_applies(logits):
                raise AssertionError("the adapter would not use the kernel for these logits")
            self.apply.apply_bitmask_async_(logits, mask, rows)
        else:
            self.apply._apply_indexed_(logits, mask, rows, use_kernel=True)

    def gather_apply(self, logits: Any, mask: Any, rows: list[int] | None) -> None:
        """``apply_bitmask_`` on CUDA logits (the Hugging Face adapter's path): the constrained
        rows gathered into a fresh pinned block, copied, the kernel."""
        if self.cuda:
            self.apply.apply_bitmask_(logits, mask, rows=rows)
        else:
            self.apply._apply_kernel_(logits, mask, rows)

    def torch_indexed(self, logits: Any, mask: Any, rows: list[int]) -> None:
        """The adapter's path where triton is absent: the same copy, torch on the device."""
        self.apply._apply_indexed_(logits, mask, rows, use_kernel=False)

    def kernel_write_only(self, logits: Any, mask: Any, rows: list[int] | None) -> None:
        torch = self.torch
        index = None if rows is None else torch.tensor(rows, dtype=torch.int32, device=self.device)
        packed = (mask if rows is None else mask[torch.tensor(rows)]).to(self.device)
        self.triton_apply.apply_packed_(logits, packed.contiguous(), index, read_row=False)

    # -- timing --------------------------------------------------------------------------

    def timed(self, fn: Callable[[], Any]) -> float:
        """Median microseconds of ``fn`` over ``reps`` calls, each after an L2 flush; CUDA
        events on a GPU, the wall clock on the CPU dry run."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        times = []
        if self.cuda:
            pairs = []
            for _ in range(self.reps):
                self._flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) * 1000 for s, e in pairs]
        else:
            for _ in range(self.reps):
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e6)
        return round(statistics.median(times), 2)

    def copy_bandwidth(self) -> float:
        """GB/s of a device-to-device copy (bytes read + bytes written, over the time)."""
        torch = self.torch
        n = (1 << 30) if self.cuda else (16 << 20)
        src = torch.empty(n, dtype=torch.int8, device=self.device).fill_(1)
        dst = torch.empty_like(src)
        us = self.timed(lambda: dst.copy_(src))
        self.bandwidth = round(2 * n / (us * 1e-6) / 1e9, 1)
        return self.bandwidth

    def time_case(self, batch: int, vocab: int, dtype: Any) -> dict[str, Any]:
        torch = self.torch
        logits, mask = self.case(batch, vocab, dtype, seed=batch + vocab)
        device_mask = mask.to(self.device)
        index = torch.arange(batch, dtype=torch.int32, device=self.device)
        rows = list(range(batch))
        words = device_mask.shape[1]
        unpacked = (
            (device_mask.unsqueeze(-1) >> torch.arange(32, device=self.device, dtype=torch.int32))
            & 1
        ).bool()
        disallowed = ~unpacked.flatten(-2)[:, :vocab]
        kernel = self.triton_apply.apply_packed_
        row_bytes = vocab * logits.element_size()
        result: dict[str, Any] = {
            "batch": batch,
            "vocab": vocab,
            "dtype": str(dtype).removeprefix("torch."),
            "words": words,
            "logits_mb": round(batch * row_bytes / 1e6, 2),
        }
        candidates: dict[str, Callable[[], Any]] = {
            "kernel_us": lambda: kernel(logits, device_mask, index),
            "kernel_write_only_us": lambda: kernel(logits, device_mask, index, read_row=False),
            "kernel_from_host_us": lambda: self.production_apply(logits, mask, rows),
            "kernel_gather_from_host_us": lambda: self.gather_apply(logits, mask, rows),
            "torch_path_from_host_us": lambda: self.apply._apply_torch_(logits, mask, rows),
            "masked_fill_us": lambda: logits.masked_fill_(disallowed, float("-inf")),
        }
        if self.xgrammar_apply is not None:
            xgr = self.xgrammar_apply
            candidates["xgrammar_us"] = lambda: xgr(logits, device_mask)
        for name, fn in candidates.items():
            try:
                result[name] = self.timed(fn)
            except Exception as exc:
                result[name] = None
                result[f"{name.removesuffix('_us')}_error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
        bandwidth = self.bandwidth
        if bandwidth:
            result["floor_us"] = round(2 * batch * row_bytes / (bandwidth * 1e9) * 1e6, 2)
            if result.get("kernel_us"):
                result["kernel_over_floor"] = round(result["kernel_us"] / result["floor_us"], 2)
        return result

    def tune(self, batch: int, vocab: int, dtype: Any) -> list[dict[str, Any]]:
        """The kernel's block size and warp count around the defaults, at one size, so the
        defaults can be set from data."""
        torch = self.torch
        logits, mask = self.case(batch, vocab, dtype, seed=11)
        device_mask = mask.to(self.device)
        index = torch.arange(batch, dtype=torch.int32, device=self.device)
        out = []
        settings = [(1024, 4), (2048, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)]
        if not self.cuda:
            settings = settings[:2]
        apply_packed_ = self.triton_apply.apply_packed_
        for block, warps in settings:
            for read_row in (True, False):

                def launch(b: int = block, w: int = warps, r: bool = read_row) -> None:
                    apply_packed_(logits, device_mask, index, block=b, num_warps=w, read_row=r)

                us: float | None
                try:
                    us = self.timed(launch)
                except Exception as exc:
                    us = None
                    self.notes.append(f"tuning block={block} warps={warps}: {exc}")
                out.append(
                    {
                        "batch": batch,
                        "vocab": vocab,
                        "dtype": str(dtype).removeprefix("torch."),
                        "block": block,
                        "num_warps": warps,
                        "read_row": read_row,
                        "us": us,
                    }
                )
        return out


OURS = ("kernel", "kernel_gather", "kernel_write_only", "torch_path", "torch_indexed")


def _pack(allowed: Any, words: int) -> Any:
    """Bit ``t % 32`` of word ``t // 32`` set where token ``t`` is allowed."""
    import numpy as np

    padded = np.zeros(words * 32, dtype=bool)
    padded[: allowed.shape[0]] = allowed
    weights = (np.uint64(1) << np.arange(32, dtype=np.uint64)).astype(np.uint64)
    return (padded.reshape(words, 32).astype(np.uint64) * weights).sum(axis=1).astype(np.uint32)


def _subset(batch: int) -> list[int]:
    """An unordered index list leaving some rows unconstrained."""
    if batch == 1:
        return [0]
    rows = list(range(0, batch, 2))[::-1]
    return rows if batch < 4 else rows[1:] + rows[:1]


def _bits(t: Any) -> Any:
    import torch

    return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def _check_line(c: dict[str, Any]) -> str:
    keys = (*OURS, "xgrammar")
    flags = " ".join(f"{k}={'ok' if c[k] else 'DIFF'}" for k in keys if k in c)
    return f"check B={c['batch']} V={c['vocab']} {c['dtype']} rows={c['rows']}: {flags}"


def _timing_line(t: dict[str, Any]) -> str:
    parts = [f"{k.removesuffix('_us')}={v}" for k, v in t.items() if k.endswith("_us")]
    return f"time B={t['batch']} V={t['vocab']} {t['dtype']} (µs): " + " ".join(parts)


def summary_table(results: dict[str, Any]) -> str:
    checks = results["checks"]
    ok = sum(c["ours_equal"] for c in checks)
    xgr = [c["xgrammar"] for c in checks if "xgrammar" in c]
    lines = [
        f"mode: {results['mode']}; device: {results['machine'].get('device_name')}; "
        f"copy bandwidth {results['copy_bandwidth_gb_s']} GB/s",
        f"bit-for-bit checks: {ok}/{len(checks)} cases equal for all of {', '.join(OURS)}"
        + (f"; xgrammar equal in {sum(xgr)}/{len(xgr)}" if xgr else "; xgrammar not run"),
        "",
        "| B | V | dtype | floor | kernel | x floor | write-only | from host | gather+host "
        "| torch path | masked_fill_ | xgrammar |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in results["timings"]:
        cells = [
            t.get(k)
            for k in (
                "floor_us",
                "kernel_us",
                "kernel_over_floor",
                "kernel_write_only_us",
                "kernel_from_host_us",
                "kernel_gather_from_host_us",
                "torch_path_from_host_us",
                "masked_fill_us",
                "xgrammar_us",
            )
        ]
        shown = ["-" if v is None else str(v) for v in cells]
        lines.append(f"| {t['batch']} | {t['vocab']} | {t['dtype']} | " + " | ".join(shown) + " |")
    lines.append("(times: median µs per call, L2 flushed before each; floor: read + write the")
    lines.append(" logits once at the measured copy bandwidth)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
