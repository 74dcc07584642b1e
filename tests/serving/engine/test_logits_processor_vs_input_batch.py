"""The CPU engine's logits-processor driver (serving.engine.logits_processors.ProcessorBatch)
against vLLM 0.24's real persistent batch (``vllm.v1.worker.gpu_input_batch.InputBatch``) on the
CPU: one scripted schedule of requests arriving and finishing, run through both, with the
example NoRepeatWindow processor on each side. At every step the two must give the same
``BatchUpdate`` (added / removed / moved, batch size), the same row for every request, and the
same logits for every request after their processors ran.

InputBatch is driven as ``GPUModelRunner._update_states`` drives it: finished requests
``remove_request``-ed first, new ones ``add_request``-ed as ``CachedRequestState``s, then
``condense()`` and ``refresh_metadata()`` (its ``_may_reorder_batch`` in between is a no-op
without an attention backend that reorders); the processors run as
``Sampler.apply_logits_processors`` runs those that can change the greedy choice (its loop over
``sampling_metadata.logitsprocs.non_argmax_invariant``); each sampled token is written back as
``_bookkeeping_sync`` writes it (``token_ids_cpu``, ``num_tokens_no_spec`` and, in place,
``CachedRequestState.output_token_ids``, the very list ``add_request`` put in ``added``).
InputBatch holds a vLLM ``LogitsProcessors`` with NoRepeatWindow and a recorder of what
``update_state`` receives, each built as vLLM builds them."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

pytest.importorskip("vllm.v1.worker.gpu_input_batch")

from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, LogitsProcessors
from vllm.v1.worker import gpu_input_batch
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from serving.engine.logits_processors import ProcessorBatch, cpu_vllm_config
from tests.plugin_examples import installed_examples

VOCAB = 32
MAX_REQS = 6
MAX_LEN = 64
BLOCK = 16
PROMPT = [3, 4, 5]

# Request -> its no_repeat_window (None: no extra_args at all; 0: present but off).
WINDOWS: dict[str, int | None] = {
    "a": 2, "b": None, "c": 3, "d": 1, "e": 4, "f": 0, "g": 5,
    "h": 2, "i": None, "j": 3, "k": 1, "l": 2, "m": 6,
}  # fmt: skip

# (finishing before the step, arriving at it): the runner removes finished requests first.
SCHEDULE: list[tuple[list[str], list[str]]] = [
    ([], ["a", "b", "c", "d"]),  # four arrive together: rows 0-3
    ([], []),  # nothing changes: update_state(None)
    (["b"], []),  # hole at 1: d moves 3 -> 1
    (["a", "c"], ["e"]),  # e reuses row 0; row 2 is past the end and stays in removed
    ([], ["f", "g", "h"]),  # f at 2, g at 3, h at 4
    ([], []),
    (["e", "g"], []),  # h moves 4 -> 0; row 3 is past the end
    (["d"], ["i", "j"]),  # i reuses row 1, j appends at 3
    (["h", "f", "i"], ["k"]),  # k reuses row 0, j moves 3 -> 1
    (["j", "k"], []),  # the batch empties
    ([], ["l", "m"]),
    ([], []),
]


class Recorder(LogitsProcessor):
    """Records a copy of every ``update_state`` argument (vLLM hands over its builder's lists)."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.updates: list[tuple | None] = []

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.updates.append(snapshot(batch_update))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def snapshot(update: BatchUpdate | None) -> tuple | None:
    if update is None:
        return None
    return (
        update.batch_size,
        list(update.removed),
        list(update.moved),
        [(row, params, prompt, output) for row, params, prompt, output in update.added],
    )


@pytest.fixture
def no_repeat(monkeypatch) -> type:
    monkeypatch.syspath_prepend(str(installed_examples()))
    from no_repeat_window import NoRepeatWindow

    return NoRepeatWindow


def input_batch(monkeypatch, no_repeat: type, config: Any) -> InputBatch:
    # The installed vLLM is a CUDA build, so with no GPU its platform is "unspecified", whose
    # is_pin_memory_available() is True, and InputBatch allocates its CPU staging tensors with
    # pin_memory=PIN_MEMORY (a module constant from that call), which a CPU-only torch refuses.
    # vLLM's own CPU platform answers False; only that flag is set here, no logic is touched.
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    cpu = torch.device("cpu")
    # vLLM's container, holding the processors as build_logitsprocs builds them,
    # cls(vllm_config, device, is_pin_memory); its built-ins (min_p, logit_bias, min_tokens)
    # are left out: they stage through the same pinned-memory helper and are inert here.
    logitsprocs = LogitsProcessors(cls(config, cpu, False) for cls in (no_repeat, Recorder))
    return InputBatch(
        max_num_reqs=MAX_REQS,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=MAX_LEN,
        device=cpu,
        vocab_size=VOCAB,
        block_sizes=[BLOCK],
        kernel_block_sizes=[BLOCK],
        logitsprocs=logitsprocs,
    )


def banned(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(row == float("-inf")).flatten().tolist())


def test_the_adapter_and_vllm_input_batch_agree_step_by_step(monkeypatch, no_repeat) -> None:
    config = cpu_vllm_config(MAX_REQS, MAX_LEN)
    vllm_batch = input_batch(monkeypatch, no_repeat, config)
    procs = list(vllm_batch.logitsprocs.all)
    assert sum(isinstance(p, no_repeat) for p in procs) == 1
    recorder = next(p for p in procs if isinstance(p, Recorder))
    ours = ProcessorBatch([no_repeat], max_num_reqs=MAX_REQS, vllm_config=config)

    params = {
        name: SamplingParams(extra_args=None if w is None else {"no_repeat_window": w})
        for name, w in WINDOWS.items()
    }
    states: dict[str, CachedRequestState] = {}  # vLLM's side: the runner's request states
    outputs: dict[str, list[int]] = {}  # our side: the engine's own output lists
    rng = random.Random(0)
    torch.manual_seed(0)
    seen_moves = seen_left_removed = 0

    for step, (finishing, arriving) in enumerate(SCHEDULE):
        # vLLM: GPUModelRunner._update_states order.
        for name in finishing:
            assert vllm_batch.remove_request(name) is not None, (step, name)
        for name in arriving:
            states[name] = CachedRequestState(
                req_id=name,
                prompt_token_ids=list(PROMPT),
                mm_features=[],
                sampling_params=params[name],
                generator=None,
                block_ids=([len(states)],),
                num_computed_tokens=0,
                output_token_ids=[],
            )
            vllm_batch.add_request(states[name])
        vllm_batch.condense()
        vllm_batch.refresh_metadata()
        theirs_update = recorder.updates[-1]

        # The adapter, the same schedule.
        for name in finishing:
            assert ours.remove(name) is not None, (step, name)
        for name in arriving:
            outputs[name] = []
            ours.add(name, params[name], list(PROMPT), outputs[name])
        ours_update = snapshot(ours.step())

        # Row numbering: identical, so the updates must be identical too.
        assert ours.row_of == vllm_batch.req_id_to_index, step
        assert ours.row_keys() == vllm_batch.req_ids, step
        if theirs_update is None:
            assert ours_update is None, step
        else:
            assert ours_update is not None, step
            size, removed, moved, added = theirs_update
            assert ours_update[:3] == (size, removed, moved), (step, ours_update, theirs_update)
            assert [(r, s, p) for r, s, p, _ in ours_update[3]] == [
                (r, s, p) for r, s, p, _ in added
            ], step
            # Each side hands over the list its engine appends to, not a copy.
            keys = vllm_batch.req_ids
            for (r, _, _, out), (_, _, _, theirs_out) in zip(ours_update[3], added, strict=True):
                assert out is outputs[keys[r]] and theirs_out is states[keys[r]].output_token_ids
            seen_moves += bool(moved)
            seen_left_removed += bool(removed)

        # The same logits per request, in each batch's row order.
        keys = vllm_batch.req_ids
        logits = {name: torch.randn(VOCAB) for name in keys}
        rows = torch.stack([logits[k] for k in keys]) if keys else torch.zeros(0, VOCAB)
        theirs = rows.clone()
        for processor in vllm_batch.sampling_metadata.logitsprocs.non_argmax_invariant:
            theirs = processor.apply(theirs)
        mine = ours.apply(rows.clone())
        for row, name in enumerate(keys):
            assert torch.equal(mine[row], theirs[row]), (step, name)
            window = WINDOWS[name]
            expected = set(outputs[name][-window:]) if window else set()
            assert banned(mine[row]) == expected, (step, name)
            # "Sample" an allowed token, repeating recent ones where allowed, and write it back
            # as each engine does: in place into the request's output list.
            allowed = [t for t in range(VOCAB) if t not in expected]
            token = rng.choice(allowed[:4])
            outputs[name].append(token)
            state = states[name]
            index = vllm_batch.req_id_to_index[name]  # GPUModelRunner._bookkeeping_sync
            end = state.num_tokens + 1
            vllm_batch.token_ids_cpu[index, state.num_tokens : end] = [token]
            vllm_batch.is_token_ids[index, state.num_tokens : end] = True
            vllm_batch.num_tokens_no_spec[index] = end
            state.output_token_ids.extend([token])

    assert len(recorder.updates) == len(SCHEDULE)
    assert seen_moves >= 3 and seen_left_removed >= 3
