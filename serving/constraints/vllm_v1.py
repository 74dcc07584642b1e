"""vLLM V1 logits processor (the ``BatchUpdate`` interface, vLLM 0.10.2 to 0.33) over a
constraint engine.

vLLM keeps a persistent batch whose rows are request slots; before every forward pass it tells
each logits processor how the slots changed (``update_state``), then hands it the logits of the
whole batch (``apply``). A constraint engine's ``Batch`` mirrors those slots one to one, so this
adapter only translates the update and applies the mask; all per-request state (including the
live output-token lists that vLLM extends in place) lives in the engine.

Facts from vLLM's own source this follows (0.24.0, ``vllm/v1/sample/logits_processor/`` and
``vllm/v1/worker/gpu_input_batch.py``):

- Updates are applied removed, then added, then moved (the order ``BatchUpdate`` documents).
  The builder gives a freed slot to the next added request by popping it from ``removed``, and
  ``condense()`` pops the slots it fills, so an index never appears in both ``removed`` and
  ``added``; an added or moved request simply replaces whatever occupied its slot.
- ``moved`` is a sequence applied in order: ``SWAP`` exchanges two slots, ``UNIDIRECTIONAL``
  (``condense()``) moves a request into an emptied slot and leaves its old slot empty.
- ``output_tok_ids`` in ``added`` is the request's running output list, extended in place
  every step, so it is handed to the engine uncopied and read at every ``fill``.

The processor also applies ``extra_args["logit_bias"]`` (token id -> bias added to the logit),
the way vLLM's built-in ``LogitBiasLogitsProcessor`` applies ``SamplingParams.logit_bias``: it
is the only way a bias reaches vLLM through Triton's vLLM backend, which hands the top-level
field over with JSON's string keys and makes vLLM fail the request (``docs/compatibility.md``).
Both run among vLLM's non-argmax-invariant processors, before the penalties, so the sampled
token is the same either way; a masked token stays ``-inf`` whatever its bias.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from serving.constraints import LOGITS_PROCESSOR, validate_spec
from serving.constraints.apply import apply_bitmask_, apply_bitmask_async_
from serving.constraints.engine import Batch, Engine, bitmask_words, log_dead_rows
from serving.sampling.constraint_spec import (
    EXTRA_ARGS_KEY,
    LOGIT_BIAS_KEY,
    ConstraintError,
    ConstraintSpec,
    parse_constraint,
)
from serving.sampling.params import BOTH_LOGIT_BIASES, parse_logit_bias
from serving.sampling.types import InvalidRequestError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("serving.constraints")

FQCN = LOGITS_PROCESSOR


def constraint_of(params: SamplingParams) -> ConstraintSpec | None:
    """The request's parsed constraint from ``extra_args["constraint"]`` (a mapping, or a JSON
    string as ``vllm_xargs`` carries it), or None when the request has none."""
    extra = params.extra_args
    if not extra or extra.get(EXTRA_ARGS_KEY) is None:
        return None
    try:
        return parse_constraint(extra[EXTRA_ARGS_KEY])
    except ConstraintError as exc:
        raise ConstraintError(f"invalid constraint: {exc}") from None


def logit_bias_of(params: SamplingParams) -> dict[int, float] | None:
    """The request's ``extra_args["logit_bias"]`` with integer token ids, or None when it has
    none (or an empty one). Raises ``ValueError`` naming ``logit_bias`` when it is malformed;
    the CPU engine's parser gives the same messages."""
    extra = params.extra_args
    if not extra or extra.get(LOGIT_BIAS_KEY) is None:
        return None
    pairs = parse_logit_bias(
        extra[LOGIT_BIAS_KEY], f"sampling_parameters.extra_args.{LOGIT_BIAS_KEY}"
    )
    return dict(pairs) or None


class ConstraintLogitsProcessor(LogitsProcessor):
    """Masks each constrained request's logits to the tokens its constraint allows, and adds
    each biased request's ``extra_args["logit_bias"]`` to its logits."""

    engine: Engine
    dead_rows_total: int
    """How many requests have gone dead (their constraint allowed nothing, or they were fed a
    token it did not allow) and were forced to end with EOS. Each request counts once."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        from transformers import AutoTokenizer

        from serving.constraints.native import NativeEngine
        from serving.constraints.vocab import Vocabulary

        model_config = vllm_config.model_config
        _refuse_unrepaired_placeholders(vllm_config)
        tokenizer = AutoTokenizer.from_pretrained(
            model_config.tokenizer,
            revision=getattr(model_config, "tokenizer_revision", None),
            trust_remote_code=model_config.trust_remote_code,
        )
        vocab = Vocabulary.from_hf_tokenizer(
            tokenizer,
            size=model_config.get_vocab_size(),
            eos_token_ids=_eos_token_ids(tokenizer, model_config),
        )
        engine: Engine = NativeEngine(vocab)
        self._setup(
            engine,
            vllm_config.scheduler_config.max_num_seqs,
            device,
            is_pin_memory,
        )

    @classmethod
    def for_engine(
        cls,
        engine: Engine,
        max_num_reqs: int,
        device: torch.device | str = "cpu",
        is_pin_memory: bool = False,
    ) -> ConstraintLogitsProcessor:
        """Build the processor over any engine, without a ``VllmConfig`` (tests, benchmarks)."""
        self = cls.__new__(cls)
        self._setup(engine, max_num_reqs, torch.device(device), is_pin_memory)
        return self

    def _setup(
        self, engine: Engine, max_num_reqs: int, device: torch.device, is_pin_memory: bool
    ) -> None:
        self.engine = engine
        self.batch: Batch = engine.new_batch(max_num_reqs)
        # The engine writes the mask through a numpy view of a host buffer, pinned like vLLM's
        # own host buffers. For device logits the rows are copied to the device straight from
        # it (no host-side gather), and that copy may still be running when the next step's
        # fill starts (async scheduling), so there are two buffers used in turn, and a buffer
        # is refilled only once the copy that last read it has completed.
        pin = is_pin_memory and torch.device(device).type == "cuda"
        shape = (max_num_reqs, bitmask_words(engine.vocab.size))
        self._buffers = [torch.full(shape, -1, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._copied: list[Any] = [None, None]  # per buffer, the event its last copy records
        self._turn = 0
        self.bitmask = self._buffers[0]
        self.bitmask_np: np.ndarray = self.bitmask.numpy()
        self.dead_rows_total = 0
        self._dead: set[int] = set()
        self._device, self._pin = torch.device(device), pin
        # Row -> its logit bias, followed through the batch updates like vLLM's built-in
        # processor; flattened into (rows, token ids) and biases whenever it changes.
        self._bias: dict[int, dict[int, float]] = {}
        self._bias_changed = False
        self._bias_index: tuple[torch.Tensor, torch.Tensor] | None = None
        self._bias_values = torch.empty(0)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refuse a bad constraint or logit bias when the request is admitted (vLLM calls this
        in the front end), so it never reaches the decode loop."""
        spec = constraint_of(sampling_params)
        if spec is not None:
            try:
                validate_spec(spec)
            except ConstraintError as exc:
                raise ConstraintError(f"invalid constraint: {exc}") from None
        # A malformed extra_args["logit_bias"], or one sent beside SamplingParams.logit_bias, is
        # refused with the CPU engine's message (set means not null there too, even if empty).
        logit_bias_of(sampling_params)
        extra = sampling_params.extra_args or {}
        if extra.get(LOGIT_BIAS_KEY) is not None and sampling_params.logit_bias is not None:
            raise InvalidRequestError(BOTH_LOGIT_BIASES)

    def is_argmax_invariant(self) -> bool:
        """Masking changes which token is greedy-best, so vLLM must run this even for greedy."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Mirror the step's batch changes, then start the mask fill in the background.

        vLLM calls this every step (``batch_update`` None when the batch is unchanged) before
        the forward pass, and ``apply`` after it, so the fill runs beside the forward pass and
        ``apply`` only waits for it. Rows whose output list ends in a placeholder (async
        scheduling: the previous step's token is still on its way back from the device) are
        filled in ``apply``, once vLLM has written the token in."""
        if batch_update is not None:
            self._update(batch_update)
        if self._bias_changed:
            self._flatten_bias()
        if self.batch.occupied_rows():
            self._next_buffer()
            self.batch.start_fill(self.bitmask_np)

    def _next_buffer(self) -> None:
        """Switch to the other host buffer, once the device copy that last read it is done
        (two steps ago, so in practice this never waits)."""
        self._turn ^= 1
        copied = self._copied[self._turn]
        if copied is not None:
            copied.synchronize()
            self._copied[self._turn] = None
        self.bitmask = self._buffers[self._turn]
        self.bitmask_np = self.bitmask.numpy()

    def _update(self, batch_update: BatchUpdate) -> None:
        batch, bias = self.batch, self._bias
        for index in batch_update.removed:
            batch.remove(index)
            self._dead.discard(index)
            if bias.pop(index, None) is not None:
                self._bias_changed = True
        for index, params, prompt_tok_ids, output_tok_ids in batch_update.added:
            self._add(index, params, prompt_tok_ids, output_tok_ids)
        for a, b, direction in batch_update.moved:
            dead_a, dead_b = a in self._dead, b in self._dead
            self._dead.difference_update((a, b))
            bias_a, bias_b = bias.pop(a, None), bias.pop(b, None)
            if direction == MoveDirectionality.SWAP:
                batch.swap(a, b)
                if dead_b:
                    self._dead.add(a)
                if bias_b is not None:
                    bias[a] = bias_b
            else:
                batch.move(a, b)
            if dead_a:
                self._dead.add(b)
            if bias_a is not None:
                bias[b] = bias_a
            if bias_a is not None or bias_b is not None:
                self._bias_changed = True

    def _add(
        self,
        index: int,
        params: SamplingParams,
        prompt_tok_ids: list[int] | None,
        output_tok_ids: list[int],
    ) -> None:
        self._dead.discard(index)
        try:
            spec = constraint_of(params)
            compiled = None if spec is None else self.engine.compile(spec)
        except ConstraintError as exc:
            # validate_params should have refused it; never take the engine down for one request.
            logger.error("constraint refused in row %d, left unconstrained: %s", index, exc)
            compiled = None
        except Exception:
            logger.exception("constraint failed to compile in row %d, left unconstrained", index)
            compiled = None
        if compiled is None:
            # Also clears a constrained request this one replaces.
            self.batch.remove(index)
        else:
            self.batch.add(index, compiled, output_tok_ids, prompt_tok_ids)
        bias = self._request_bias(index, params)
        if bias is not None:
            self._bias[index] = bias
            self._bias_changed = True
        elif self._bias.pop(index, None) is not None:  # the request it replaces had one
            self._bias_changed = True

    def _request_bias(self, index: int, params: SamplingParams) -> dict[int, float] | None:
        """The row's bias, without the token ids outside the vocabulary.

        vLLM refuses such ids for its own ``logit_bias`` when the request is admitted; this
        processor cannot (``validate_params`` sees no vocabulary), so it drops them with an
        error in the log rather than index past the logits."""
        try:
            bias = logit_bias_of(params)
        except ValueError as exc:  # validate_params should have refused it
            logger.error("logit_bias refused in row %d, left unbiased: %s", index, exc)
            return None
        if bias is None:
            return None
        size = self.engine.vocab.size
        outside = sorted(t for t in bias if t >= size)
        if outside:
            logger.error(
                "logit_bias token id(s) %s in row %d are outside the vocabulary (size %d); "
                "they are ignored",
                outside,
                index,
                size,
            )
            bias = {t: b for t, b in bias.items() if t < size}
        return bias or None

    def _flatten_bias(self) -> None:
        """The biases as one index and one value tensor on the device, as vLLM's built-in
        processor keeps them, rebuilt in ``update_state`` (before the forward pass)."""
        self._bias_changed = False
        if not self._bias:
            self._bias_index = None
            return
        rows: list[int] = []
        tokens: list[int] = []
        values: list[float] = []
        for row, bias in self._bias.items():
            rows.extend([row] * len(bias))
            tokens.extend(bias)
            values.extend(bias.values())
        device, pin = self._device, self._pin
        self._bias_index = (
            _to_device(rows, torch.long, device, pin),
            _to_device(tokens, torch.long, device, pin),
        )
        self._bias_values = _to_device(values, torch.float32, device, pin)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._bias_changed:  # apply without update_state after the last change (tests)
            self._flatten_bias()
        self._apply_mask(logits)
        if self._bias_index is not None:
            # What vLLM's built-in LogitBiasLogitsProcessor.apply does (float32 biases added to
            # the rows' logits); a masked token stays -inf.
            logits[self._bias_index] += self._bias_values
        return logits

    def _apply_mask(self, logits: torch.Tensor) -> None:
        rows = self.batch.occupied_rows()
        if not rows:
            return
        if logits.shape[-1] > self.engine.vocab.size:
            raise ValueError(
                f"logits are {logits.shape[-1]} wide but the constraint vocabulary has "
                f"{self.engine.vocab.size} tokens"
            )
        if self._copied[self._turn] is not None:
            # apply twice without update_state between: this buffer's copy may be in flight.
            self._next_buffer()
        dead = self.batch.fill(self.bitmask_np)
        if dead:
            self._report_dead(dead)
        if logits.device.type == "cpu":
            apply_bitmask_(logits, self.bitmask_np, rows=rows)
        else:
            # The fused kernel on CUDA (torch without triton); the copy reads self.bitmask
            # after this returns, so the buffer is left alone until its event completes.
            self._copied[self._turn] = apply_bitmask_async_(logits, self.bitmask, rows)

    def _report_dead(self, dead: list[int]) -> None:
        new = [row for row in dead if row not in self._dead]
        if new:
            self._dead.update(new)
            self.dead_rows_total += len(new)
            log_dead_rows(new)


def _to_device(
    data: list[Any], dtype: torch.dtype, device: torch.device, pin: bool
) -> torch.Tensor:
    """A small host list as a tensor on ``device``, copied without blocking from pinned memory
    when the device is a GPU (what vLLM's ``async_tensor_h2d`` does)."""
    host = torch.tensor(data, dtype=dtype, pin_memory=pin)
    return host.to(device, non_blocking=pin)


def _eos_token_ids(tokenizer: Any, model_config: Any) -> list[int]:
    """The IDs vLLM stops on: the tokenizer's EOS plus the generation config's
    ``eos_token_id`` (``SamplingParams.update_from_generation_config``), e.g. Llama 3's
    ``<|eot_id|>``. A constraint must allow all of them when it accepts."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    try:
        extra = model_config.try_get_generation_config().get("eos_token_id")
    except Exception:  # no generation config to read is not an error
        extra = None
    for token_id in [extra] if isinstance(extra, int) else extra or []:
        if token_id not in ids and 0 <= token_id < len(tokenizer):
            ids.append(token_id)
    return ids


def _refuse_unrepaired_placeholders(vllm_config: VllmConfig) -> None:
    """With async scheduling, vLLM appends -1 placeholders to every request's output list and
    replaces them with the sampled IDs before the logits processors run only when the processor
    was named in ``logits_processors`` (``logitsprocs_need_output_token_ids`` is set from that
    list in ``gpu_model_runner.py``, vLLM 0.24.0). A processor vLLM builds without the name,
    from a ``vllm.logits_processors`` entry point (this project registers none; an install of
    an older version of it left one), would never see a real token and every constrained
    request would stay in its initial state, so it refuses to start instead."""
    scheduler = vllm_config.scheduler_config
    if not getattr(scheduler, "async_scheduling", False):
        return
    named = vllm_config.model_config.logits_processors or ()
    for entry in named:
        if isinstance(entry, type) and issubclass(entry, ConstraintLogitsProcessor):
            return
        if isinstance(entry, str) and entry.replace(":", ".") == FQCN.replace(":", "."):
            return
    raise ValueError(
        "the constraint logits processor needs vLLM to fill in the output token IDs it reads: "
        f'with async scheduling, list it in logits_processors (["{FQCN}"]) '
        "or turn async scheduling off (async_scheduling=False)"
    )
