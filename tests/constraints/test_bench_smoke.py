"""The constraint benchmark's harness at a toy size: it runs, every engine that can be imported
applies the same masks on the same teacher-forced streams, and the summary renders. No timing
is asserted."""

from __future__ import annotations

import importlib.util

import pytest

from bench.constraints import __main__ as cli
from bench.constraints.agreement import verify_engines
from bench.constraints.decode_loop import time_config
from bench.constraints.engines import (
    ENGINES,
    EngineSkipped,
    VocabContext,
    compile_for,
    engine_available,
    prime_reference,
)
from bench.constraints.plan import QUICK, Plan
from bench.constraints.workloads import allowed_set_workload, choice_workload, regex_workload
from bench.synthetic_vocab import GreedyTokenizer, catalog, synthetic_vocab

SIZE = 2048


def available(engines):
    return [e for e in engines if engine_available(e) is None]


@pytest.fixture(scope="module")
def vocab():
    return synthetic_vocab(SIZE)


def test_synthetic_vocabulary_is_exact_and_deterministic(vocab):
    assert len(vocab.tokens) == vocab.size == SIZE
    assert vocab.tokens[:256] == tuple(bytes([b]) for b in range(256))
    assert [vocab.tokens[i] for i in vocab.eos_token_ids] == [b"", b""]
    assert len(set(vocab.tokens[:-2])) == SIZE - 2
    assert synthetic_vocab.__wrapped__(SIZE) == vocab
    titles = catalog(50)
    assert len(set(titles)) == 50 and titles == catalog(50)
    tokenizer = GreedyTokenizer(vocab)
    for title in titles:
        ids = tokenizer.encode(title.encode())
        assert b"".join(vocab.tokens[i] for i in ids) == title.encode()


@pytest.mark.parametrize("kind", ["choice", "regex", "allowed-set"])
def test_engines_apply_identical_masks_on_the_same_streams(vocab, kind):
    if kind == "choice":
        workload = choice_workload(vocab, 200, n_streams=40)
    elif kind == "regex":
        workload = regex_workload(vocab, n_streams=40)
    else:
        workload = allowed_set_workload(vocab, n_streams=40)
    plan = QUICK
    ctx = VocabContext(vocab, threads=1)
    engines = available(ENGINES)
    assert "native" in engines or "reference" in engines
    compiled = {}
    for engine in engines:
        try:
            compiled[engine] = compile_for(engine, ctx, workload, plan)
        except EngineSkipped:
            assert engine in workload.peer_skip
    report = verify_engines(ctx, workload, compiled, rows=3, steps=25)
    assert set(report) == set(compiled)
    for engine, verdict in report.items():
        assert verdict["problems"] == [], (engine, verdict)
        if engine == "llguidance":
            assert verdict["verdict"] in ("equal", "subset"), verdict
        else:
            assert verdict["verdict"] == "equal", (engine, verdict)
    # The timed path runs for each engine at batch 2 (no figures are checked).
    tiny = Plan(**{**plan.__dict__, "min_steps": 3, "max_steps": 3, "floor_steps": 3})
    for engine, comp in compiled.items():
        if engine in ("reference", "baseline"):
            prime_reference(ctx, comp.value, workload, comp.transitions)
        result = time_config(engine, ctx, comp, workload, 2, tiny, pool_bytes=1 << 20)
        assert result["steps"] == 3 and result["step_us"]["p50"] > 0


@pytest.mark.slow
def test_results_render_to_markdown(vocab, tmp_path, monkeypatch):
    engines = [e for e in available(("native", "reference", "baseline")) if e != "baseline"]
    out = tmp_path / "constraints.json"
    argv = [
        "--vocab-sizes", str(SIZE),
        "--batch-sizes", "1,2",
        "--choice-sizes", "100",
        "--workloads", "choice,regex",
        "--engines", ",".join(engines),
        "--quick",
        "--out", str(out),
    ]  # fmt: skip
    monkeypatch.setattr(
        cli,
        "QUICK",
        Plan(**{**QUICK.__dict__, "min_steps": 3, "max_steps": 3, "compile_catalog": 300}),
    )
    assert cli.main(argv) == 0
    text = out.with_suffix(".md").read_text()
    assert "## Slope" in text and "## Mask agreement" in text
    assert "python -m bench.constraints" in text


def test_peers_are_optional():
    # The benchmark runs without xgrammar/llguidance; it records why they were skipped.
    for name in ("xgrammar", "llguidance"):
        if importlib.util.find_spec(name) is None:
            assert engine_available(name) is not None
