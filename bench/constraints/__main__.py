"""``python -m bench.constraints``: the command line; what it measures is in the package's
docstring."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import bench.constraints
from bench.constraints.engines import DEFAULT_ENGINES, ENGINES, native_apply_available
from bench.constraints.grid import log, run
from bench.constraints.plan import FULL, QUICK, Plan
from bench.constraints.report import render_markdown
from bench.machine import git_commit, git_dirty, host_info, package_versions


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(bench.constraints.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small grid (about a minute)")
    parser.add_argument(
        "--engines",
        default=",".join(DEFAULT_ENGINES),
        help=f"comma-separated, from {', '.join(ENGINES)} (default: %(default)s)",
    )
    parser.add_argument("--out", default="bench/results/constraints.json")
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("CONSTRAINTS_THREADS", 0)) or os.cpu_count() or 1,
        help="threads for every engine (native pool, xgrammar, llguidance, torch)",
    )
    parser.add_argument("--vocab-sizes", help="override, e.g. 32000,128256")
    parser.add_argument("--batch-sizes", help="override, e.g. 1,8,32")
    parser.add_argument("--choice-sizes", help="override the catalog sizes, e.g. 10000")
    parser.add_argument("--workloads", help="override, from choice,regex,allowed-set")
    parser.add_argument(
        "--peer-max-choices",
        type=int,
        help="run xgrammar/llguidance on choice catalogs up to this size (default 10000)",
    )
    parser.add_argument(
        "--peer-compile",
        action="store_true",
        help="also time XGrammar compiling the 100k-string catalog (minutes)",
    )
    parser.add_argument("--render", metavar="JSON", help="only re-render the Markdown of a result")
    return parser.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(",") if x)

    if args.vocab_sizes:
        overrides["vocab_sizes"] = ints(args.vocab_sizes)
        if plan.compile_vocab not in overrides["vocab_sizes"]:
            overrides["compile_vocab"] = overrides["vocab_sizes"][0]
    if args.batch_sizes:
        overrides["batch_sizes"] = ints(args.batch_sizes)
    if args.choice_sizes:
        overrides["choice_sizes"] = ints(args.choice_sizes)
    if args.workloads:
        overrides["workloads"] = tuple(args.workloads.split(","))
    if args.peer_max_choices is not None:
        overrides["peer_max_choices"] = args.peer_max_choices
    return Plan(**{**plan.__dict__, **overrides})


def machine_and_threads(threads: int) -> dict[str, Any]:
    """The machine, the peers' versions, and the threads each engine actually ran with (the
    native pool and torch may not have taken ``--threads``)."""
    info = host_info()
    info["threads"] = threads
    info.update(package_versions(("torch", "numpy", "xgrammar", "llguidance")))
    info["git_commit"] = git_commit()
    info["git_dirty"] = git_dirty()
    if native_apply_available():
        from serving.constraints.native import threads as native_threads

        info["native_threads"] = native_threads()
    info["torch_threads"] = torch.get_num_threads()
    return info


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.render:
        results = json.loads(Path(args.render).read_text())
        out.with_suffix(".md").write_text(render_markdown(results))
        return 0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise SystemExit(f"unknown engines: {', '.join(sorted(unknown))}")
    # The native pool reads its size when it starts, so set it before the first engine runs.
    os.environ["CONSTRAINTS_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    plan = plan_from(args)
    command = "python -m bench.constraints" + (
        " " + shlex.join(sys.argv[1:] if argv is None else list(argv))
        if (sys.argv[1:] if argv is None else argv)
        else ""
    )
    log(f"plan: {plan}")
    results = run(plan, engines, args.threads, args.peer_compile)
    results["machine"] = machine_and_threads(args.threads)
    results["command"] = command
    results["plan"] = plan.__dict__
    results["engines"] = engines
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    out.with_suffix(".md").write_text(render_markdown(results))
    log(f"wrote {out} and {out.with_suffix('.md')} in {results['elapsed_s'] / 60:.1f} min")
    failed = [v for v in results["verification"] if v["verdict"] in ("DIFFERENT", "ERROR")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
