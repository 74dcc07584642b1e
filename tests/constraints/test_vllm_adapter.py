"""The vLLM V1 adapter driven the way vLLM 0.24.0 drives it, with vLLM's own classes.

A small simulator plays vLLM's persistent batch (``gpu_input_batch.InputBatch``): finished and
preempted requests free their slots through ``BatchUpdateBuilder.removed_append``, new and
resumed requests take the lowest freed slot (``pop_removed``) or the next one at the end,
``condense`` moves the last requests down into the holes that are left (UNIDIRECTIONAL), and a
reorder swaps slots (SWAP). Output lists are live: tokens are appended after each step, async
placeholders (-1) appear and are filled in, histories shrink or are rewritten, prompts absorb
earlier outputs, and chunked prefills keep a request's output list empty for several steps.
Placeholders are filled in either before ``update_state`` or, as vLLM 0.24's async scheduling
does (``_sample``), between ``update_state`` and ``apply``: after the processor has started its
background fill. After every ``apply`` each row's -inf pattern must equal a fresh reference constraint fed the
row's true generated tokens, and every logit that is not masked must equal what vLLM's built-in
``LogitBiasLogitsProcessor``, fed the same updates with the bias as ``SamplingParams.logit_bias``,
makes of it (unbiased, unconstrained rows are untouched).
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    BatchUpdateBuilder,
    MoveDirectionality,
)
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor

from serving.constraints.reference import ReferenceEngine
from serving.constraints.vllm_v1 import FQCN, ConstraintLogitsProcessor
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import ConstraintError, ConstraintSpec, parse_constraint
from serving.sampling.params import parse_sampling_parameters
from serving.sampling.types import InvalidRequestError
from tests.constraints.helpers import ENGINE_CLASSES

TOKENS = [
    *(bytes([c]) for c in b"abcdegilnrtu0123-"),
    b"ab",
    b"abc",
    b"re",
    b"red",
    b"gr",
    b"een",
    b"blu",
    b"e-",
    b"12",
    b"",  # a special token that spells nothing
    b"",  # EOS
]
EOS = len(TOKENS) - 1
SPECIAL = len(TOKENS) - 2
# Logits are wider than the tokenizer (padding IDs are never allowed).
VOCAB = Vocabulary.of(TOKENS, [EOS], size=len(TOKENS) + 7)
IDS = {token: i for i, token in enumerate(TOKENS) if token}

CONSTRAINTS: list[Any] = [
    {"choice": ["red", "green", "blue"]},
    {"choice": ["a", "ab", "abc-1"]},
    {"regex": "[a-c]{1,3}-[0-9]+"},
    {"regex": "(ab)+c?"},
    {"regex": "(red|green|blue)-[0-3]{2}"},
    {"allowed_tokens": [IDS[b"a"], IDS[b"b"], IDS[b"ab"]]},
    {"banned_tokens": [IDS[b"e"], IDS[b"een"]]},
    {"max_tokens": 3},
    {"all": [{"regex": "[a-e]+"}, {"max_tokens": 4}]},
    # Dead from the start: the only choice's first tokens are all banned.
    {"all": [{"choice": ["red"]}, {"banned_tokens": [IDS[b"r"], IDS[b"re"], IDS[b"red"]]}]},
    '{"choice": ["blue", "bluee"]}',  # the JSON-string form vllm_xargs carries
]


@pytest.fixture
def builtin_bias(monkeypatch: pytest.MonkeyPatch) -> LogitBiasLogitsProcessor:
    """vLLM's own logit-bias processor on CPU. vLLM decides at import to pin host memory (it
    assumes an accelerator); CPU torch has no pinned allocator, so that switch is turned off."""
    import vllm.utils.torch_utils as torch_utils

    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
    return LogitBiasLogitsProcessor(None, torch.device("cpu"), False)


def twin_update(update: BatchUpdate | None, twins: dict[int, SamplingParams]) -> Any:
    """The same update for vLLM's built-in processor, each request's params replaced by its
    twin: the bias as ``SamplingParams.logit_bias`` (integer keys) instead of in extra_args."""
    if update is None:
        return None
    added = [(i, twins[id(params)], prompt, out) for i, params, prompt, out in update.added]
    return BatchUpdate(update.batch_size, update.removed, added, update.moved)


def biased(bias: dict[int, float] | None, **extra: Any) -> tuple[SamplingParams, SamplingParams]:
    """A request's params as the front end sends them (bias in extra_args, string keys, as JSON
    makes them) and its twin for vLLM's built-in processor."""
    if bias is not None:
        extra["logit_bias"] = {str(t): b for t, b in bias.items()}
    return SamplingParams(extra_args=extra or None), SamplingParams(logit_bias=bias)


class Oracle:
    """What a row may sample: a fresh reference constraint fed the true tokens (docs rule for
    dead rows: nothing allowed, or a dead state, means only EOS)."""

    def __init__(self) -> None:
        self.engine = ReferenceEngine(VOCAB)
        self.compiled: dict[str, Any] = {}

    def allowed(self, spec: ConstraintSpec, generated: list[int]) -> set[int]:
        key = repr(spec)
        if key not in self.compiled:
            self.compiled[key] = self.engine.compile(spec)
        compiled = self.compiled[key]
        state = compiled.initial_state()
        for token in generated:
            state = compiled.advance(state, token)
        allowed = set(compiled.allowed(state))
        assert all(t < len(TOKENS) for t in allowed)
        return allowed or set(VOCAB.eos_token_ids)


@dataclass
class Request:
    params: SamplingParams
    spec: ConstraintSpec | None
    prompt: list[int]
    output: list[int] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)  # outputs moved into the prompt in place
    prefill_left: int = 0
    placeholder: bool = False  # output[-1] is an async -1 to fill in before the next step
    fed: int = -1  # len(output) at the last apply, -1 before the first
    finished: bool = False
    twin: SamplingParams = field(default_factory=SamplingParams)  # for vLLM's built-in bias

    @property
    def truth(self) -> list[int]:
        tokens = self.prefix + self.output
        return tokens[:-1] if self.placeholder else tokens


class Simulator:
    """vLLM's persistent batch, reduced to what logits processors observe."""

    def __init__(
        self,
        proc: ConstraintLogitsProcessor,
        rng: random.Random,
        max_rows: int,
        builtin: LogitBiasLogitsProcessor,
    ):
        self.proc = proc
        self.builtin = builtin
        self.twins: dict[int, SamplingParams] = {}
        self.rng = rng
        self.late_placeholders = rng.random() < 0.5
        self.max_rows = max_rows
        self.slots: list[Request | None] = []
        self.builder = BatchUpdateBuilder()
        self.oracle = Oracle()
        self.waiting: list[Request] = []  # preempted, to be resumed
        self.checked_rows = 0
        self.checked_biased_rows = 0

    def new_request(self) -> Request:
        choice = self.rng.choice([*CONSTRAINTS, None, None, None])
        extra: dict[str, Any] = {} if choice is None else {"constraint": choice}
        if choice is None and self.rng.random() < 0.5:
            extra = {"other": 1}
        bias = None
        if self.rng.random() < 0.4:  # any token, padding ids and masked ones included
            tokens = self.rng.sample(range(VOCAB.size), self.rng.randint(1, 4))
            bias = {t: self.rng.choice([-100.0, -2.5, 0.0, 1.25, 100.0]) for t in tokens}
        params, twin = biased(bias, **extra)
        self.twins[id(params)] = twin
        spec = None if choice is None else parse_constraint(choice)
        prompt = [self.rng.randrange(len(TOKENS)) for _ in range(self.rng.randint(1, 4))]
        return Request(params, spec, prompt, prefill_left=self.rng.choice([0, 0, 1, 3]), twin=twin)

    def step(self) -> None:
        rng = self.rng
        if not self.late_placeholders:
            self.fill_placeholders()
        # 1. Removals: finished requests, aborts, preemptions.
        for index, req in enumerate(self.slots):
            if req is None:
                continue
            if req.finished or rng.random() < 0.08:
                self.remove(index)
            elif rng.random() < 0.06:
                self.remove(index)
                self.preempt(req)
        # 2. Adds take the lowest freed slot, else the next one at the end.
        for _ in range(rng.randint(0, 3)):
            if self.num_reqs() >= self.max_rows:
                break
            if self.waiting and rng.random() < 0.5:
                req = self.waiting.pop(rng.randrange(len(self.waiting)))
            else:
                req = self.new_request()
            self.add(req)
        # 3. condense() then a reorder.
        self.condense()
        n = self.num_reqs()
        for _ in range(rng.choice([0, 0, 1, 2])):
            if n >= 2:
                a, b = rng.sample(range(n), 2)
                self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
                self.builder.moved.append((a, b, MoveDirectionality.SWAP))
        # 4. In-place history changes vLLM (or async scheduling) makes to live lists.
        for req in self.slots:
            if req is not None:
                self.mutate(req)
        update = self.builder.get_and_reset(n)
        assert update is None or isinstance(update, BatchUpdate)
        self.proc.update_state(update)
        self.builtin.update_state(twin_update(update, self.twins))
        if self.late_placeholders:
            self.fill_placeholders()
        self.apply_and_check()

    def num_reqs(self) -> int:
        return sum(req is not None for req in self.slots)

    def remove(self, index: int) -> None:
        self.builder.removed_append(index)
        self.slots[index] = None

    def add(self, req: Request) -> None:
        index = self.builder.pop_removed()
        if index is None:
            index = len(self.slots)
            self.slots.append(None)
        self.slots[index] = req
        req.fed = -1
        self.builder.added.append((index, req.params, req.prompt, req.output))

    def preempt(self, req: Request) -> None:
        """Resumed later: with the same lists (recompute), with a copy of the outputs (async
        resume), or as a streaming continuation whose prompt holds the outputs."""
        if req.placeholder:  # the token in flight lands before the request is resumed
            req.output[-1] = self.sample(req, self.oracle_allowed(req))
            req.placeholder = False
        how = self.rng.choice(["same", "copy", "stream"])
        if how == "copy":
            req.output = list(req.output)
        elif how == "stream":
            req.prompt = req.prompt + req.prefix + req.output
            req.output.clear()
        # Re-admitted requests restart from their output list (docs: live token lists).
        req.prefix = []
        req.prefill_left = self.rng.choice([0, 1, 2])
        self.waiting.append(req)

    def condense(self) -> None:
        removed = self.builder.removed
        if not removed:
            return
        last = len(self.slots) - 1
        while removed:
            while last >= 0 and self.slots[last] is None:
                last -= 1
            empty = self.builder.peek_removed()
            assert empty is not None
            if empty >= last:
                break
            self.builder.pop_removed()
            self.slots[empty], self.slots[last] = self.slots[last], None
            self.builder.moved.append((last, empty, MoveDirectionality.UNIDIRECTIONAL))
            last -= 1
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        # The builder's sorted removal list is consumed; what is left is the empty tail.
        assert all(index >= self.num_reqs() for index in removed)

    def fill_placeholders(self) -> None:
        for req in self.slots:
            if req is not None and req.placeholder:
                req.output[-1] = self.sample(req, self.oracle_allowed(req))
                req.placeholder = False

    def mutate(self, req: Request) -> None:
        rng = self.rng
        if req.fed < 1 or req.prefill_left or req.placeholder:
            return
        roll = rng.random()
        if roll < 0.05:  # tokens discarded (KV-load failure, optimistic spec tokens)
            del req.output[rng.randrange(len(req.output)) :]
        elif roll < 0.10:  # rewritten: a different, shorter history
            keep = rng.randrange(req.fed)
            req.output[:] = self.walk(req, keep)
        elif roll < 0.15:  # the prompt absorbs earlier outputs
            k = rng.randint(1, len(req.output))
            rest = req.output[k:]
            if len(rest) >= req.fed and rest[req.fed - 1] == req.output[req.fed - 1]:
                # The docs' sync sees a rewrite only when the list got shorter than what was
                # fed or its last fed position changed; vLLM itself never absorbs outputs into
                # the prompt of a live row (it re-adds the request), so stay inside that rule.
                return
            req.prompt.extend(req.output[:k])
            req.prefix.extend(req.output[:k])
            del req.output[:k]

    def walk(self, req: Request, length: int) -> list[int]:
        """A history of ``length`` tokens the constraint allows (stopping before EOS)."""
        saved, saved_prefix = req.output, req.prefix
        req.output, req.prefix = [], list(saved_prefix)
        while len(req.output) < length:
            options = self.oracle_allowed(req) - set(VOCAB.eos_token_ids)
            if not options:
                break
            req.output.append(self.rng.choice(sorted(options)))
        walked = req.output
        req.output, req.prefix = saved, saved_prefix
        return walked

    def oracle_allowed(self, req: Request) -> set[int]:
        if req.spec is None:
            return set(range(len(TOKENS)))
        return self.oracle.allowed(req.spec, req.truth)

    def sample(self, req: Request, allowed: set[int]) -> int:
        allowed = allowed - {SPECIAL}
        eos = allowed & set(VOCAB.eos_token_ids)
        if eos and (self.rng.random() < 0.15 or allowed == eos):
            return EOS
        return self.rng.choice(sorted(allowed - eos))

    def apply_and_check(self) -> None:
        n = self.num_reqs()
        logits = torch.randn(n, VOCAB.size)
        before = logits.clone()
        expected = self.builtin.apply(logits.clone())  # vLLM's own bias, no mask
        out = self.proc.apply(logits)
        assert out is logits
        for row, req in enumerate(self.slots):
            assert req is not None
            if req.twin.logit_bias is None:
                assert torch.equal(expected[row], before[row])
            if req.spec is None:
                assert torch.equal(logits[row], expected[row]), f"unconstrained row {row}"
                allowed = set(range(len(TOKENS)))
            else:
                allowed = self.oracle.allowed(req.spec, req.truth)
                finite = torch.isfinite(logits[row])
                got = {int(t) for t in finite.nonzero().flatten()}
                assert got == allowed, (row, req.spec, req.truth, req.output, req.prompt)
                assert torch.equal(logits[row][finite], expected[row][finite])
            self.checked_rows += 1
            self.checked_biased_rows += req.twin.logit_bias is not None
            req.fed = len(req.output) - int(req.placeholder)
            if req.prefill_left:  # chunked prefill: the sampled token is thrown away
                req.prefill_left -= 1
                continue
            token = self.sample(req, allowed)
            if token in VOCAB.eos_token_ids:
                req.output.append(token)
                req.finished = True
            elif self.rng.random() < (0.5 if self.late_placeholders else 0.1):
                req.output.append(-1)  # async scheduling: filled in before the next step
                req.placeholder = True
            else:
                req.output.append(token)


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
@pytest.mark.parametrize("seed", range(int(os.environ.get("ADAPTER_SEEDS", 12))))
def test_masks_follow_vllm_batch_updates_and_live_lists(engine_cls, seed, builtin_bias):
    rng = random.Random(seed)
    max_rows = rng.choice([1, 3, 8])
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), max_rows)
    sim = Simulator(proc, rng, max_rows, builtin_bias)
    for _ in range(60):
        sim.step()
    assert sim.checked_biased_rows > 0
    assert sim.checked_rows > sim.checked_biased_rows


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_partial_prefill_keeps_the_initial_state_until_the_first_token(engine_cls):
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 2)
    output: list[int] = []
    params = SamplingParams(extra_args={"constraint": {"choice": ["red", "blue"]}})
    builder = BatchUpdateBuilder()
    builder.added.append((0, params, [1, 2, 3], output))
    proc.update_state(builder.get_and_reset(1))
    first = {IDS[b"r"], IDS[b"re"], IDS[b"red"], IDS[b"b"], IDS[b"blu"]}
    for _ in range(4):  # prefill chunks: apply runs, nothing is appended
        proc.update_state(builder.get_and_reset(1))
        logits = torch.zeros(1, VOCAB.size)
        proc.apply(logits)
        assert {int(t) for t in torch.isfinite(logits[0]).nonzero().flatten()} == first
    output.append(IDS[b"blu"])
    logits = torch.zeros(1, VOCAB.size)
    proc.apply(logits)
    assert {int(t) for t in torch.isfinite(logits[0]).nonzero().flatten()} == {IDS[b"e"]}


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_unconstrained_request_replacing_a_constrained_one_is_left_alone(engine_cls):
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 2)
    builder = BatchUpdateBuilder()
    constrained = SamplingParams(extra_args={"constraint": {"max_tokens": 0}})
    builder.added.append((0, constrained, None, []))
    proc.update_state(builder.get_and_reset(1))
    builder.removed_append(0)
    assert builder.pop_removed() == 0
    builder.added.append((0, SamplingParams(), [5], []))
    proc.update_state(builder.get_and_reset(1))
    logits = torch.randn(1, VOCAB.size)
    before = logits.clone()
    assert proc.apply(logits) is logits
    assert torch.equal(logits, before)


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_removed_then_added_then_moved(engine_cls):
    """BatchUpdate's documented order: a slot both freed and refilled ends up with the new
    request, and a move into an occupied slot replaces the request there."""
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 4)
    only_a = SamplingParams(extra_args={"constraint": {"allowed_tokens": [IDS[b"a"]]}})
    only_b = SamplingParams(extra_args={"constraint": {"allowed_tokens": [IDS[b"b"]]}})
    only_c = SamplingParams(extra_args={"constraint": {"allowed_tokens": [IDS[b"c"]]}})
    proc.update_state(BatchUpdate(3, [], [(0, only_a, None, []), (2, only_b, None, [])], []))
    update = BatchUpdate(
        batch_size=2,
        removed=[1],
        added=[(1, only_c, None, [])],
        moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL), (0, 1, MoveDirectionality.SWAP)],
    )
    proc.update_state(update)
    logits = torch.zeros(3, VOCAB.size)
    proc.apply(logits)
    allowed = [
        {int(t) for t in torch.isfinite(logits[row]).nonzero().flatten()} for row in range(3)
    ]
    assert allowed == [{IDS[b"c"], EOS}, {IDS[b"b"], EOS}, set(range(VOCAB.size))]


def bias_of(logits: torch.Tensor) -> list[dict[int, float]]:
    """Each row's non-zero logits (inputs are zeros, so what was added)."""
    return [{int(t): float(row[t]) for t in row.nonzero().flatten()} for row in logits]


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_bias_follows_its_request_through_adds_moves_swaps_and_removals(engine_cls, builtin_bias):
    """Each step's update goes to this processor (bias in extra_args) and to vLLM's built-in
    one (the same bias as SamplingParams.logit_bias); both must bias the same rows."""
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 4)
    twins: dict[int, SamplingParams] = {}

    def request(bias: dict[int, float] | None) -> SamplingParams:
        params, twin = biased(bias)
        twins[id(params)] = twin
        return params

    b1, b2, b3, b4 = {1: 5.0}, {2: -3.0, 4: 0.5}, {3: 7.0}, {5: -100.0}
    steps = [
        # Four requests, one unbiased.
        (
            BatchUpdate(
                4, [], [(i, request(b), None, []) for i, b in enumerate([b1, None, b2, b3])], []
            ),
            [b1, {}, b2, b3],
        ),
        # Row 1 finishes; condense() moves row 3 down into it.
        (
            BatchUpdate(3, [1], [], [(3, 1, MoveDirectionality.UNIDIRECTIONAL)]),
            [b1, b3, b2],
        ),
        # A reorder swaps rows 0 and 2.
        (BatchUpdate(3, [], [], [(0, 2, MoveDirectionality.SWAP)]), [b2, b3, b1]),
        # Row 0 finishes and an unbiased request takes its slot; a new biased one is appended.
        (
            BatchUpdate(4, [0], [(0, request(None), None, []), (3, request(b4), None, [])], []),
            [{}, b3, b1, b4],
        ),
        # A swap between a biased and an unbiased row, then a move into the emptied slot 2.
        (
            BatchUpdate(
                3,
                [2],
                [],
                [(3, 0, MoveDirectionality.SWAP), (3, 2, MoveDirectionality.UNIDIRECTIONAL)],
            ),
            [b4, b3, {}],
        ),
        # Nothing changes: the biases stay where they are.
        (None, [b4, b3, {}]),
        # Everything finishes: nothing is biased any more.
        (BatchUpdate(0, [0, 1, 2], [], []), []),
    ]
    for update, expected in steps:
        proc.update_state(update)
        builtin_bias.update_state(twin_update(update, twins))
        logits = torch.zeros(len(expected), VOCAB.size)
        assert proc.apply(logits) is logits
        assert bias_of(logits) == [{t: b for t, b in row.items() if b} for row in expected]
        assert torch.equal(logits, builtin_bias.apply(torch.zeros_like(logits)))
    # A row added after everything left starts from scratch.
    proc.update_state(BatchUpdate(1, [], [(0, request(b1), None, [])], []))
    logits = torch.zeros(1, VOCAB.size)
    proc.apply(logits)
    assert bias_of(logits) == [b1]


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_bias_adds_to_what_the_constraint_allows_and_masked_tokens_stay_masked(engine_cls):
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 3)
    a, b, c = IDS[b"a"], IDS[b"b"], IDS[b"c"]
    both, _ = biased(
        {a: 2.0, c: 100.0, EOS: -1.5, SPECIAL: 50.0},
        constraint={"allowed_tokens": [a, b]},
    )
    # Dead from the start: only EOS is allowed, and its bias still applies.
    dead, _ = biased({EOS: 3.0, a: 100.0}, constraint=CONSTRAINTS[9])
    # Constrained, unbiased; next to it, biased rows must not leak into it.
    plain = SamplingParams(extra_args={"constraint": {"allowed_tokens": [a, c]}})
    proc.update_state(
        BatchUpdate(3, [], [(0, both, None, []), (1, dead, None, []), (2, plain, None, [])], [])
    )
    logits = torch.randn(3, VOCAB.size)
    before = logits.clone()
    proc.apply(logits)
    finite = [{int(t) for t in torch.isfinite(row).nonzero().flatten()} for row in logits]
    assert finite == [{a, b, EOS}, {EOS}, {a, c, EOS}]
    assert logits[0, a] == before[0, a] + 2.0 and logits[0, b] == before[0, b]
    assert logits[0, EOS] == before[0, EOS] - 1.5
    assert logits[0, c] == -torch.inf and logits[0, SPECIAL] == -torch.inf
    assert logits[1, EOS] == before[1, EOS] + 3.0 and logits[1, a] == -torch.inf
    assert torch.equal(logits[2, [a, c, EOS]], before[2, [a, c, EOS]])


def test_bias_ids_outside_the_vocabulary_are_dropped_and_logged(caplog):
    """vLLM refuses such ids for SamplingParams.logit_bias at admission; validate_params sees no
    vocabulary, so the processor applies the rest and says why it left some out."""
    proc = ConstraintLogitsProcessor.for_engine(ReferenceEngine(VOCAB), 2)
    params, _ = biased({3: 1.0, VOCAB.size - 1: 2.0, VOCAB.size: 5.0, 10**9: 1.0})
    only_outside, _ = biased({VOCAB.size + 1: 1.0})
    with caplog.at_level(logging.ERROR, logger="serving.constraints"):
        proc.update_state(
            BatchUpdate(2, [], [(0, params, None, []), (1, only_outside, None, [])], [])
        )
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"[{VOCAB.size}, {10**9}]" in m and "row 0" in m for m in messages)
    assert any(f"[{VOCAB.size + 1}]" in m and "row 1" in m for m in messages)
    logits = torch.zeros(2, VOCAB.size)
    proc.apply(logits)
    assert bias_of(logits) == [{3: 1.0, VOCAB.size - 1: 2.0}, {}]


def test_a_malformed_bias_that_got_past_validation_leaves_the_row_unbiased(caplog):
    proc = ConstraintLogitsProcessor.for_engine(ReferenceEngine(VOCAB), 2)
    bad = SamplingParams(extra_args={"logit_bias": {"x": 1}})
    good, _ = biased({4: 1.0})
    with caplog.at_level(logging.ERROR, logger="serving.constraints"):
        proc.update_state(BatchUpdate(2, [], [(0, bad, None, []), (1, good, None, [])], []))
    assert any("logit_bias refused in row 0" in r.getMessage() for r in caplog.records)
    logits = torch.zeros(2, VOCAB.size)
    proc.apply(logits)
    assert bias_of(logits) == [{}, {4: 1.0}]


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_dead_rows_are_forced_to_eos_logged_and_counted_once(engine_cls, caplog):
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 2)
    dead = SamplingParams(extra_args={"constraint": CONSTRAINTS[9]})
    proc.update_state(BatchUpdate(1, [], [(0, dead, None, [])], []))
    with caplog.at_level(logging.WARNING, logger="serving.constraints"):
        for _ in range(3):
            logits = torch.zeros(1, VOCAB.size)
            proc.apply(logits)
            assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]
    assert proc.dead_rows_total == 1
    assert any("dead" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_a_constraint_that_fails_to_compile_leaves_the_row_unconstrained(engine_cls, caplog):
    proc = ConstraintLogitsProcessor.for_engine(engine_cls(VOCAB), 1)
    bad = SamplingParams(extra_args={"constraint": {"allowed_tokens": [len(TOKENS) + 3]}})
    with caplog.at_level(logging.ERROR, logger="serving.constraints"):
        proc.update_state(BatchUpdate(1, [], [(0, bad, None, [])], []))
    assert caplog.records
    logits = torch.randn(1, VOCAB.size)
    before = logits.clone()
    proc.apply(logits)
    assert torch.equal(logits, before)


def test_apply_without_constrained_rows_returns_logits_untouched():
    proc = ConstraintLogitsProcessor.for_engine(ReferenceEngine(VOCAB), 2)
    proc.update_state(None)
    logits = torch.randn(2, VOCAB.size)
    before = logits.clone()
    assert proc.apply(logits) is logits
    assert torch.equal(logits, before)
    assert proc.is_argmax_invariant() is False


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"regex": "(?=a)b"}, "invalid constraint: invalid regex"),
        ({"regex": "a{2000}"}, "invalid constraint: invalid regex"),
        ({"all": [{"max_tokens": 2}, {"regex": "x\\1"}]}, "invalid constraint: invalid regex"),
        ({"choice": []}, "invalid constraint: choice must list at least one string"),
        ({"colour": "red"}, "invalid constraint: unknown constraint 'colour'"),
        ('{"choice": ["a"', "invalid constraint: constraint is not valid JSON"),
        ({"max_tokens": -1}, "invalid constraint: max_tokens must be an integer"),
    ],
)
def test_validate_params_refuses_bad_constraints(constraint, message):
    params = SamplingParams(extra_args={"constraint": constraint})
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")) as info:
        ConstraintLogitsProcessor.validate_params(params)
    assert isinstance(info.value, ConstraintError)


@pytest.mark.parametrize(
    "extra_args",
    [
        None,
        {},
        {"other": "x"},
        {"constraint": {"regex": "[A-Z]{3}-\\d{4}"}},
        {"constraint": json.dumps({"choice": ["red", "green"]})},
        {"constraint": json.dumps({"all": [{"regex": "a+"}, {"max_tokens": 3}]})},
    ],
)
def test_validate_params_accepts_good_constraints(extra_args):
    ConstraintLogitsProcessor.validate_params(SamplingParams(extra_args=extra_args))


@pytest.mark.parametrize(
    "bias",
    [
        [1, 2],
        "{}",
        {"cat": 1},
        {"-3": 1},
        {"1.5": 1},
        {"7": "5"},
        {"7": True},
        {"7": float("inf")},
    ],
)
def test_validate_params_refuses_a_malformed_bias_as_the_cpu_engine_does(bias):
    with pytest.raises(InvalidRequestError) as cpu:
        parse_sampling_parameters({"extra_args": {"logit_bias": bias}})
    with pytest.raises(ValueError) as gpu:
        ConstraintLogitsProcessor.validate_params(SamplingParams(extra_args={"logit_bias": bias}))
    assert str(gpu.value) == str(cpu.value)
    assert str(gpu.value).startswith("sampling_parameters.extra_args.logit_bias")


@pytest.mark.parametrize("top_level", [{5: 1.0}, {}])
def test_validate_params_refuses_both_logit_biases_as_the_cpu_engine_does(top_level):
    """SamplingParams.logit_bias (set by a Triton client) and extra_args.logit_bias (the front
    end's) at once: neither is dropped silently, both engines refuse with the same message."""
    params = SamplingParams(logit_bias=top_level, extra_args={"logit_bias": {"6": 2}})
    with pytest.raises(ValueError) as gpu:
        ConstraintLogitsProcessor.validate_params(params)
    with pytest.raises(InvalidRequestError) as cpu:
        parse_sampling_parameters(
            {
                "logit_bias": {str(t): b for t, b in top_level.items()},
                "extra_args": {"logit_bias": {"6": 2}},
            }
        )
    assert str(gpu.value) == str(cpu.value)
    assert "both set" in str(gpu.value)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(extra_args={"logit_bias": {"6": 2, "0": -100.0}}),
        SamplingParams(extra_args={"logit_bias": {}}),
        SamplingParams(extra_args={"logit_bias": None}),
        SamplingParams(logit_bias={6: 2.0}),
        SamplingParams(logit_bias={6: 2.0}, extra_args={"logit_bias": None}),
        SamplingParams(
            extra_args={"logit_bias": {"6": 2}, "constraint": {"choice": ["red", "green"]}}
        ),
    ],
)
def test_validate_params_accepts_one_logit_bias(params):
    ConstraintLogitsProcessor.validate_params(params)


def test_vllm_loads_the_processor_by_the_name_model_json_gives():
    """What vLLM 0.24 does with a packaged model.json's ``logits_processors``: its own loader
    resolves the name to this class, and its admission check, given that list, runs the
    class's ``validate_params``."""
    from vllm.v1.sample.logits_processor import (
        _load_logitsprocs_by_fqcns,
        validate_logits_processors_parameters,
    )

    from serving.package import ENGINE_ARGS_FILE, vllm_repository_files

    model_json = json.loads(
        vllm_repository_files("m", 1, "/weights", {})[f"m/1/{ENGINE_ARGS_FILE}"]
    )
    named = model_json["logits_processors"]
    assert named == [FQCN]
    assert _load_logitsprocs_by_fqcns(named) == [ConstraintLogitsProcessor]

    validate_logits_processors_parameters(
        named, SamplingParams(extra_args={"constraint": '{"max_tokens": 4}'})
    )
    bad = SamplingParams(extra_args={"constraint": {"regex": "(?<=a)"}})
    with pytest.raises(ValueError, match="invalid constraint"):
        validate_logits_processors_parameters(named, bad)
    validate_logits_processors_parameters(
        named, SamplingParams(extra_args={"logit_bias": {"1": 2}})
    )
    both = SamplingParams(logit_bias={1: 2.0}, extra_args={"logit_bias": {"1": 2}})
    with pytest.raises(ValueError, match="both set"):
        validate_logits_processors_parameters(named, both)


def vllm_config(tokenizer_path: str, *, async_scheduling: bool, named: list[Any]) -> Any:
    """The parts of a ``VllmConfig`` the processor reads (a real one needs a model and a GPU)."""
    model_config = SimpleNamespace(
        tokenizer=tokenizer_path,
        tokenizer_revision=None,
        trust_remote_code=False,
        logits_processors=named,
        get_vocab_size=lambda: 300,
        try_get_generation_config=lambda: {"eos_token_id": [0, 7]},
    )
    scheduler_config = SimpleNamespace(max_num_seqs=4, async_scheduling=async_scheduling)
    return SimpleNamespace(model_config=model_config, scheduler_config=scheduler_config)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> str:
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=290,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(["red green blue", "the red one", "blue sky 42"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    path = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    ("async_scheduling", "named"),
    [(False, []), (True, [FQCN]), (True, [ConstraintLogitsProcessor])],
)
def test_built_from_a_vllm_config(tokenizer_path, async_scheduling, named):
    config = vllm_config(tokenizer_path, async_scheduling=async_scheduling, named=named)
    proc = ConstraintLogitsProcessor(config, torch.device("cpu"), False)
    assert proc.engine.vocab.size == 300
    assert proc.engine.vocab.eos_token_ids == (0, 7)  # the tokenizer's, then the model's
    assert proc.batch.max_rows == 4
    params = SamplingParams(extra_args={"constraint": {"choice": ["red", "blue"]}})
    proc.update_state(BatchUpdate(1, [], [(0, params, None, [])], []))
    logits = torch.zeros(1, 300)
    proc.apply(logits)
    assert 0 < int(torch.isfinite(logits).sum()) < 300


def test_refuses_async_scheduling_when_vllm_would_not_fill_in_placeholders(tokenizer_path):
    """vLLM 0.24.0 replaces async -1 placeholders in output lists only for processors named in
    ``logits_processors``; one built without the name (from an entry point an older install
    left) would never see a token."""
    config = vllm_config(tokenizer_path, async_scheduling=True, named=[])
    with pytest.raises(ValueError, match="async_scheduling=False"):
        ConstraintLogitsProcessor(config, torch.device("cpu"), False)
