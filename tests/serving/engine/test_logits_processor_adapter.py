"""The CPU engine's driver of vLLM V1 logits processors (serving.engine.logits_processors)
against vLLM's own behaviour: the example NoRepeatWindow (built from examples/plugins as a
wheel) over a scripted sequence of steps, compared with an independent computation and with the
``BatchUpdate`` sequence vLLM's ``InputBatch`` gives for the same steps; and the platform's own
constraint processor driven the same way gives the native path's masks."""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm.v1.sample.logits_processor")

from vllm import SamplingParams
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)

from serving.engine.logits_processors import ProcessorBatch, cpu_vllm_config
from serving.sampling.types import InvalidRequestError
from tests.plugin_wheels import build_example_wheels

VOCAB = 40
UNI = MoveDirectionality.UNIDIRECTIONAL


@pytest.fixture(scope="module")
def no_repeat(tmp_path_factory) -> Iterator[type]:
    root = tmp_path_factory.mktemp("no-repeat-window")
    wheels = build_example_wheels(root / "wheels")
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(target), str(wheels["no_repeat_window"])],
        check=True,
    )  # fmt: skip
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    module = importlib.import_module("no_repeat_window")
    yield module.NoRepeatWindow
    sys.path.remove(str(target))


def params(window: int | None) -> SamplingParams:
    return SamplingParams(extra_args=None if window is None else {"no_repeat_window": window})


def banned(logits: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row == float("-inf")).flatten().tolist()) for row in logits]


def expected(window: int | None, output: list[int]) -> set[int]:
    """The independent computation: the last ``window`` tokens of the request's output."""
    return set(output[-window:]) if window else set()


# A script of steps: (requests finishing before the step, requests starting at it). Names map to
# windows; every live request samples one token per step.
WINDOWS = {"a": 2, "b": None, "c": 3, "d": 1, "e": 4, "f": 0, "g": 2}
SCRIPT: list[tuple[list[str], list[str]]] = [
    ([], ["a", "b", "c"]),
    ([], []),  # nothing changed: update_state(None)
    (["a"], []),  # row 0 freed: c moves 2 -> 0
    (["b"], ["d", "e"]),  # d reuses row 1, e appends at row 2
    ([], []),
    (["c", "d"], ["f"]),  # f reuses row 0, row 1 is filled by e from row 2
    (["e", "f"], ["g"]),
    ([], []),
]


def run_script(batch: ProcessorBatch, rng: random.Random) -> list[Any]:
    """Drive ``batch`` through SCRIPT, checking every step's masks; returns the updates."""
    outputs: dict[str, list[int]] = {}
    updates = []
    for finishing, starting in SCRIPT:
        for name in finishing:
            batch.remove(name)
        for name in starting:
            outputs[name] = []
            batch.add(name, params(WINDOWS[name]), [1, 2], outputs[name])
        updates.append(batch.step())
        keys = batch.row_keys()
        masks = banned(batch.apply(torch.zeros(len(keys), VOCAB)))
        assert masks == [expected(WINDOWS[k], outputs[k]) for k in keys]  # type: ignore[index]
        for key in keys:  # "sample": the engine appends to the same list, in place
            allowed = [t for t in range(VOCAB) if t not in masks[keys.index(key)]]
            outputs[key].append(rng.choice(allowed[:3]))  # type: ignore[index]
    return updates


def test_the_window_under_the_adapter_matches_an_independent_computation(no_repeat) -> None:
    batch = ProcessorBatch([no_repeat], max_num_reqs=4, vllm_config=cpu_vllm_config(4, 64))
    updates = run_script(batch, random.Random(0))
    assert updates[1] is None and updates[4] is None and updates[7] is None
    # condense() moved the last rows into the holes, as vLLM's InputBatch does.
    assert [tuple(u.moved) for u in updates if u is not None and u.moved] == [
        ((2, 0, UNI),),
        ((2, 1, UNI),),
    ]


def test_the_adapter_gives_the_batch_updates_vllm_input_batch_gives(no_repeat) -> None:
    """The same steps written out as vLLM 0.24's InputBatch produces them (removals whose rows
    are reused or condensed are popped from ``removed``; condense moves last -> hole), fed to a
    second instance directly: identical updates and identical masks at every step."""
    direct = no_repeat(None, torch.device("cpu"), False)
    batch = ProcessorBatch([no_repeat], max_num_reqs=4)
    out: dict[str, list[int]] = {name: [] for name in WINDOWS}
    p = {name: params(w) for name, w in WINDOWS.items()}

    def added(*rows: tuple[int, str]) -> list:
        return [(row, p[name], [1, 2], out[name]) for row, name in rows]

    by_hand: list[BatchUpdate | None] = [
        BatchUpdate(3, removed=[], added=added((0, "a"), (1, "b"), (2, "c")), moved=[]),
        None,
        BatchUpdate(2, removed=[], added=[], moved=[(2, 0, UNI)]),
        BatchUpdate(3, removed=[], added=added((1, "d"), (2, "e")), moved=[]),
        None,
        BatchUpdate(2, removed=[], added=added((0, "f")), moved=[(2, 1, UNI)]),
        # g takes the lowest freed row (0); row 1 is past the end, so nothing moves and it
        # stays in removed.
        BatchUpdate(1, removed=[1], added=added((0, "g")), moved=[]),
        None,
    ]
    for step, ((finishing, starting), hand) in enumerate(zip(SCRIPT, by_hand, strict=True)):
        for name in finishing:
            batch.remove(name)
        for name in starting:
            batch.add(name, p[name], [1, 2], out[name])
        update = batch.step()
        if hand is None:
            assert update is None, step
        else:
            assert update is not None, step
            assert (update.batch_size, list(update.removed), list(update.moved)) == (
                hand.batch_size,
                list(hand.removed),
                list(hand.moved),
            ), step
            assert [(i, s, pr, o) for i, s, pr, o in update.added] == list(hand.added), step
            assert all(a[3] is out[n] for a, n in zip(update.added, starting, strict=True))
        direct.update_state(hand)
        keys = batch.row_keys()
        ours = batch.apply(torch.zeros(len(keys), VOCAB))
        theirs = direct.apply(torch.zeros(len(keys), VOCAB))
        assert torch.equal(ours, theirs), step
        for i, key in enumerate(keys):
            out[key].append((7 * step + 3 * i) % VOCAB)  # type: ignore[index]


def test_a_removal_with_no_rows_left_still_reaches_the_processors(no_repeat) -> None:
    batch = ProcessorBatch([no_repeat], max_num_reqs=2)
    batch.add("x", params(2), None, [5])
    batch.step()
    batch.remove("x")
    update = batch.step()
    assert update is not None and list(update.removed) == [0] and update.batch_size == 0
    assert batch.processors[0].rows == {}


def test_validate_params_errors_are_the_requests_400(no_repeat) -> None:
    batch = ProcessorBatch([no_repeat], max_num_reqs=2)
    batch.validate(params(3))
    batch.validate(params(None))
    for bad in (-1, "3", True, 2.5):
        with pytest.raises(InvalidRequestError, match="no_repeat_window must be a non-negative"):
            batch.validate(SamplingParams(extra_args={"no_repeat_window": bad}))


class Recording(LogitsProcessor):
    """Records what the driver calls, in order."""

    calls: list[Any] = []

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.config = vllm_config
        Recording.calls = []

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update) -> None:
        Recording.calls.append(("update", batch_update))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        Recording.calls.append(("apply", logits.shape[0]))
        return logits


def test_update_state_once_per_step_then_apply_and_none_when_unchanged() -> None:
    config = cpu_vllm_config(3, 32)
    batch = ProcessorBatch([Recording], max_num_reqs=3, vllm_config=config)
    processor = batch.processors[0]
    assert processor.config.scheduler_config.max_num_seqs == 3
    assert processor.config.device_config.device_type == "cpu"
    assert processor.config.model_config is None
    batch.add("a", params(None), [1], [])
    batch.step()
    batch.apply(torch.zeros(1, 4))
    batch.step()
    batch.apply(torch.zeros(1, 4))
    kinds = [(kind, value if kind == "apply" else value is None) for kind, value in Recording.calls]
    assert kinds == [("update", False), ("apply", 1), ("update", True), ("apply", 1)]
    with pytest.raises(ValueError, match="rows of logits"):
        batch.apply(torch.zeros(2, 4))


def test_the_platform_constraint_processor_under_the_adapter_masks_as_the_native_path(
    demo_model_dir: Path,
) -> None:
    """ "The platform's constraint processor is just one such plugin": serving.constraints'
    vLLM V1 processor, driven through the adapter over two cohorts' rows, gives each row the
    mask the CPU engine's native path (CohortMasks) gives it."""
    from transformers import AutoTokenizer

    from serving.constraints.vllm_v1 import ConstraintLogitsProcessor
    from serving.engine.constraints import CohortMasks, ConstraintCompiler
    from serving.sampling.constraint_spec import parse_constraint
    from serving.sampling.types import SamplingOptions

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    vocab = len(tokenizer)
    compiler = ConstraintCompiler(tokenizer, vocab, (tokenizer.eos_token_id,))
    platform = ConstraintLogitsProcessor.for_engine(compiler.native, 4)
    batch = ProcessorBatch([], max_num_reqs=4, processors=[platform])
    specs: dict[str, Any] = {
        "p": {"choice": ["yes", "no", "maybe"]},
        "q": None,
        "r": {"regex": "[a-c]{2,5}"},
        "s": {"choice": ["red", "green", "blue"]},
        "t": {"regex": "[0-9]+"},
    }
    cohorts = [["p", "q", "r"], ["s", "t"]]
    out: dict[str, list[int]] = {name: [] for name in specs}
    masks: list[tuple[CohortMasks, list[str]]] = []
    live: list[str] = []
    for step in range(8):
        if step == 3:  # p finishes, the second cohort arrives (as in the engine's loop)
            batch.remove("p")
            live.remove("p")
        if step in (0, 3):
            names = cohorts[0 if step == 0 else 1]
            compiled = [
                compiler.compile(SamplingOptions(constraint=parse_constraint(specs[n])))
                if specs[n]
                else None
                for n in names
            ]
            masks.append((CohortMasks(compiler, compiled), names))
            for n in names:
                extra = {"constraint": specs[n]} if specs[n] else None
                batch.add(n, SamplingParams(extra_args=extra), None, out[n])
                live.append(n)
        batch.step()
        keys = batch.row_keys()
        ours = batch.apply(torch.zeros(len(keys), vocab))
        for cohort, names in masks:
            slots = [i for i, n in enumerate(names) if n in live]
            if not slots:
                continue
            native = torch.zeros(len(slots), vocab)
            cohort.apply_(native, slots)
            for row, slot in enumerate(slots):
                name = names[slot]
                assert torch.equal(native[row], ours[keys.index(name)]), (step, name)
                allowed = torch.nonzero(native[row] == 0).flatten().tolist()
                token = allowed[(step * 5 + slot) % len(allowed)]
                cohort.accept(slot, token)
                out[name].append(token)
