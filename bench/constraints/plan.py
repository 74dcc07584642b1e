"""The grid a run covers: one full plan for the published figures, one quick plan to check
the harness in a minute, both overridable from the command line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    vocab_sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    choice_sizes: tuple[int, ...]
    workloads: tuple[str, ...]  # "choice" (one per choice size), "regex", "allowed-set"
    warmup_steps: int  # at most this many warm-up steps ...
    warmup_cap_s: float  # ... or this much time, whichever comes first (at least 3 steps)
    min_steps: int  # timed steps wanted for a p99
    max_steps: int
    budget_s: float  # target timed time per configuration
    slow_cap_s: float  # when min_steps would take longer than this, fewer steps ...
    floor_steps: int  # ... but never fewer than this
    verify_rows: int
    verify_steps: int
    peer_max_choices: int  # xgrammar/llguidance choice workloads up to this many strings
    compile_catalog: int  # catalog size for the compile-time measurement
    compile_vocab: int


FULL = Plan(
    vocab_sizes=(32_000, 128_256, 262_144),
    batch_sizes=(1, 8, 32, 128, 256),
    choice_sizes=(10_000, 1_000_000),
    workloads=("choice", "regex", "allowed-set"),
    warmup_steps=30,
    warmup_cap_s=1.0,
    min_steps=200,
    max_steps=3000,
    budget_s=1.5,
    slow_cap_s=4.0,
    floor_steps=25,
    verify_rows=8,
    verify_steps=40,
    peer_max_choices=10_000,
    compile_catalog=100_000,
    compile_vocab=128_256,
)

QUICK = Plan(
    vocab_sizes=(128_256,),
    batch_sizes=(1, 8, 32, 128),
    choice_sizes=(1_000,),
    workloads=("choice", "regex", "allowed-set"),
    warmup_steps=5,
    warmup_cap_s=0.1,
    min_steps=30,
    max_steps=300,
    budget_s=0.15,
    slow_cap_s=0.3,
    floor_steps=10,
    verify_rows=4,
    verify_steps=20,
    peer_max_choices=10_000,
    compile_catalog=100_000,
    compile_vocab=128_256,
)
