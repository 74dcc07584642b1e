"""The CPU engine: a Hugging Face causal LM behind a batching decode loop.

One scheduler thread owns the model. Requests wait in a queue; at every iteration the loop
admits waiting requests as a new *cohort* (one batch with its own KV cache, prefilled
together) and then advances every cohort by one token. A request therefore starts within one
iteration of arriving instead of waiting for the batch in flight to finish, and rows leave
their cohort's cache as soon as they finish. That is iteration-level batching without merging
caches of different lengths, which a small in-process engine does not need.

Every iteration is one step of the whole running batch, as on vLLM: the new cohort's prefill
and one decode of each other cohort, then the step's logits are masked (the requests'
constraints), handed to the model's vLLM V1 logits processors (``model.json``'s
``logits_processors``; :mod:`serving.engine.logits_processors` drives them through a persistent
batch of all running sequences, exactly as vLLM's model runner does) and sampled.

Callers use :meth:`Engine.generate` from asyncio; the loop hands each step's :class:`Delta` to
the caller's event loop thread-safely.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from serving.constraints import LOGITS_PROCESSOR
from serving.engine.constraints import CohortMasks, CompiledConstraints, ConstraintCompiler
from serving.engine.logits_processors import (
    PluginLoadError,
    ProcessorBatch,
    cpu_vllm_config,
    load_processor_class,
    sampling_params,
)
from serving.engine.model import LoadedModel, ModelLoadError, load_model, read_engine_config
from serving.engine.sampling import adjust_logits, choose
from serving.engine.stats import EngineStats, FinishedRequest, NullStats
from serving.request_limits import max_prompt_chars
from serving.sampling.types import (
    Delta,
    EngineUnavailableError,
    GenerateRequest,
    InvalidRequestError,
    TokenLogprob,
)

logger = logging.getLogger("serving.engine")

MAX_COHORTS = 4
# vLLM's ``seed`` engine argument when model.json gives none (ModelConfig.seed, 0.24).
DEFAULT_SEED = 0
_DONE = object()


class _Parent:
    """The ``n`` completions of one request: which finished, and the most tokens one of them
    generated (vLLM records ``n`` and that maximum once per request, when its last completion
    finishes)."""

    def __init__(self, n: int) -> None:
        self.unfinished = n
        self.max_generation_tokens = 0
        self._lock = threading.Lock()

    def finished(self, generation_tokens: int) -> tuple[bool, int]:
        """One completion finished: (was it the last one, the maximum so far)."""
        with self._lock:
            self.unfinished -= 1
            self.max_generation_tokens = max(self.max_generation_tokens, generation_tokens)
            return self.unfinished == 0, self.max_generation_tokens


@dataclass(eq=False)
class _Sequence:
    """One request's decode state, owned by the scheduler thread once admitted."""

    request: GenerateRequest
    prompt_ids: list[int]
    constraints: CompiledConstraints | None
    emit: Any  # callable(Delta | Exception | _DONE), thread-safe
    arrived: float
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    emitted_text: str = ""
    cumulative_logprob: float = 0.0
    scheduled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    aborted: bool = False
    index: int = 0  # which of the parent request's n completions
    n: int = 1  # the parent request's n
    parent: _Parent | None = None
    params: Any = None  # vLLM's SamplingParams, when the model has logits processors


class _Cohort:
    """Rows prefilled together, sharing one KV cache; finished rows are dropped from it."""

    def __init__(self, engine: Engine, sequences: list[_Sequence]) -> None:
        self.engine = engine
        self.sequences = sequences
        self.slots = list(range(len(sequences)))  # slot of each live row, in cache order
        assert engine.compiler is not None  # cohorts exist only in generative engines
        self.masks = CohortMasks(engine.compiler, [s.constraints for s in sequences])
        self.cache: Any = None
        self.attention: torch.Tensor | None = None
        # A model that returns no KV cache (a custom architecture may not keep one) is fed each
        # row's whole sequence at every step instead: the rows' ids so far, left-padded.
        self.ids: torch.Tensor | None = None

    @property
    def live(self) -> list[_Sequence]:
        return [self.sequences[s] for s in self.slots]

    def prefill(self) -> torch.Tensor:
        prompts = [s.prompt_ids for s in self.sequences]
        width = max(map(len, prompts))
        pad = self.engine.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
        self.attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long
        )
        positions = (self.attention.cumsum(-1) - 1).clamp(min=0)
        out = self.engine.model(
            input_ids=ids,
            attention_mask=self.attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.cache
        if self.cache is None:
            self.ids = ids
        return out.logits[:, -1, :].float()

    def decode(self, tokens: list[int]) -> torch.Tensor:
        assert self.attention is not None
        ids = torch.tensor(tokens, dtype=torch.long)[:, None]
        ones = torch.ones((len(tokens), 1), dtype=torch.long)
        self.attention = torch.cat([self.attention, ones], dim=1)
        if self.ids is not None:
            self.ids = torch.cat([self.ids, ids], dim=1)
            out = self.engine.model(
                input_ids=self.ids,
                attention_mask=self.attention,
                position_ids=(self.attention.cumsum(-1) - 1).clamp(min=0),
                use_cache=False,
                logits_to_keep=1,
            )
            return out.logits[:, -1, :].float()
        positions = self.attention.sum(-1, keepdim=True) - 1
        out = self.engine.model(
            input_ids=ids,
            attention_mask=self.attention,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
        )
        self.cache = out.cache
        return out.logits[:, -1, :].float()

    def keep(self, keep: list[int]) -> None:
        """Keep only the rows at positions ``keep`` (indices into the live rows)."""
        if len(keep) == len(self.slots):
            return
        for i, slot in enumerate(self.slots):
            if i not in keep:
                self.masks.release(slot)
        self.slots = [self.slots[i] for i in keep]
        if keep:
            index = torch.tensor(keep, dtype=torch.long)
            if self.cache is not None:
                self.cache.batch_select_indices(index)
            if self.ids is not None:
                self.ids = self.ids[index]
            assert self.attention is not None
            self.attention = self.attention[index]


class Engine:
    """A loaded model and its decode loop. Build it with :func:`load_engine`."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        name: str,
        version: str = "1",
        stats: EngineStats | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.kind = loaded.config.kind
        self.max_model_len = loaded.max_model_len
        self.max_prompt_chars = max_prompt_chars(self.tokenizer, self.max_model_len)
        self.max_num_seqs = loaded.config.max_num_seqs
        self.max_logprobs = loaded.config.max_logprobs
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        # Unseeded requests draw their seeds from the engine's ``seed`` argument (vLLM's default
        # is 0), so, as on vLLM, an engine answers the same unseeded requests, sent in the same
        # order, the same way after every start.
        self._unseeded = random.Random(
            DEFAULT_SEED if loaded.config.seed is None else loaded.config.seed
        )
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.stats: EngineStats = stats or NullStats()
        self.compiler = (
            ConstraintCompiler(self.tokenizer, loaded.vocab_size, loaded.eos_token_ids)
            if self.kind == "generate"
            else None
        )
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._cohorts: list[_Cohort] = []
        self._cond = threading.Condition()
        self._in_flight = 0
        self._draining = False
        self._stopped = False
        self._embed_lock = threading.Lock()
        self.processors = self._build_processors(loaded)
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)
        self._thread.start()

    def _build_processors(self, loaded: LoadedModel) -> ProcessorBatch | None:
        """The model's vLLM V1 logits processors, built as vLLM builds them. The platform's
        own constraint processor is left out: the native constraint path applies the same
        ``constraint`` and ``logit_bias`` (a test checks both give the same masks)."""
        names = [n for n in loaded.config.logits_processors if n != LOGITS_PROCESSOR]
        if not names or self.kind != "generate":
            return None
        try:
            classes = [load_processor_class(name) for name in names]
            return ProcessorBatch(
                classes,
                max_num_reqs=self.max_num_seqs,
                vllm_config=cpu_vllm_config(self.max_num_seqs, self.max_model_len),
            )
        except PluginLoadError as exc:
            raise ModelLoadError(str(exc)) from exc
        except Exception as exc:
            raise ModelLoadError(f"logits processors {names} cannot be built: {exc}") from exc

    # --- public API -----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._thread.is_alive() and not self._draining and not self._stopped

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def begin_drain(self) -> None:
        """Refuse new requests; those already admitted run to completion."""
        self._draining = True

    async def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self._in_flight == 0

    def shutdown(self) -> None:
        """Stop the loop; requests still running end with ``finish_reason="abort"``."""
        self._draining = True
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        """Stream the request's deltas; the last has ``finish_reason`` set.

        Raises :class:`InvalidRequestError` before the first delta when the request cannot be
        served; closing the iterator early aborts the request."""
        self._check_accepting()
        if self.kind != "generate":
            raise InvalidRequestError(
                f"model {self.name} is an embedding model; it does not generate"
            )
        arrived = time.monotonic()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        n = request.options.n
        sequences: list[_Sequence] = []
        parent = _Parent(n)
        for index in range(n):
            sequence = await asyncio.to_thread(self._admit, _child(request, index), arrived)
            sequence.index, sequence.n, sequence.parent = index, n, parent
            sequences.append(sequence)

        def emit(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is gone: nobody is listening any more
                for sequence in sequences:
                    sequence.aborted = True

        finished = False
        running = 0
        try:
            for sequence in sequences:
                sequence.emit = emit
                self._enqueue(sequence)
                running += 1
            while True:
                item = await queue.get()
                if item is _DONE:
                    running -= 1
                    if running == 0:
                        finished = True
                        return
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not finished:
                for sequence in sequences:
                    sequence.aborted = True  # read by the loop at its next step

    async def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """L2-normalized embeddings of ``texts`` and the number of prompt tokens."""
        self._check_accepting()
        if self.kind != "embed":
            raise InvalidRequestError(f"model {self.name} generates text; it has no embeddings")
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise InvalidRequestError("input must be one or more non-empty strings")
        self._in_flight += 1
        try:
            return await asyncio.to_thread(self._embed, texts)
        finally:
            self._in_flight -= 1

    # --- admission (caller's thread) --------------------------------------------------------

    def _check_accepting(self) -> None:
        if self._draining or self._stopped:
            raise EngineUnavailableError(f"model {self.name} is shutting down; retry elsewhere")
        if not self._thread.is_alive():
            raise EngineUnavailableError(f"model {self.name}'s engine loop has stopped")

    def _admit(self, request: GenerateRequest, arrived: float) -> _Sequence:
        options = request.options
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            if len(request.prompt) > self.max_prompt_chars:
                # Refused before the tokenizer sees it: tokenizing megabytes of text costs
                # seconds and gigabytes only to learn what its length already says.
                raise InvalidRequestError(
                    f"the prompt is {len(request.prompt)} characters, more than "
                    f"{self.max_model_len} tokens can spell; this model's context is "
                    f"{self.max_model_len} tokens"
                )
            prompt_ids = self.tokenizer.encode(request.prompt, add_special_tokens=True)
        if not prompt_ids:
            raise InvalidRequestError("text_input is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                f"{self.max_model_len} tokens"
            )
        if options.logprobs is not None and options.logprobs > self.max_logprobs:
            raise InvalidRequestError(
                f"sampling_parameters.logprobs must be at most {self.max_logprobs} for this "
                "model (its max_logprobs)"
            )
        vocab = self.loaded.vocab_size
        if any(t >= vocab for t in options.stop_token_ids):
            raise InvalidRequestError(f"stop_token_ids must be below the vocabulary size {vocab}")
        outside = [t for t, _ in options.logit_bias if t >= vocab]
        if outside:
            # vLLM's SamplingParams._validate_logit_bias refuses them too.
            raise InvalidRequestError(
                f"sampling_parameters.logit_bias: token id(s) {outside} are outside the "
                f"vocabulary (size {vocab})"
            )
        assert self.compiler is not None
        constraints = self.compiler.compile(options)
        generator = torch.Generator()
        seed = options.seed if options.seed is not None else self._unseeded.getrandbits(64)
        generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
        sequence = _Sequence(request, prompt_ids, constraints, None, arrived, generator)
        if self.processors is not None:
            try:
                sequence.params = sampling_params(options)
            except (ValueError, TypeError) as exc:
                raise InvalidRequestError(str(exc)) from None
            self.processors.validate(sequence.params)
        return sequence

    def _enqueue(self, sequence: _Sequence) -> None:
        with self._cond:
            self._check_accepting()
            self._waiting.append(sequence)
            self._in_flight += 1
            self._cond.notify()

    # --- the loop (scheduler thread) --------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not self._stopped and not self._waiting and not self._cohorts:
                    self._cond.wait()
                if self._stopped:
                    break
                admitted = self._take_waiting()
            try:
                with torch.inference_mode():
                    self._iterate(admitted)
            except Exception as exc:  # a model failure must not hang every caller
                logger.exception("engine %s: decode step failed", self.name)
                if self.processors is not None:
                    try:  # take the step's additions, so that the removals below may follow
                        self.processors.step()
                    except Exception:
                        logger.exception("engine %s: logits processors failed", self.name)
                for cohort in self._cohorts:
                    for seq in cohort.live:
                        self._fail(seq, exc)
                self._cohorts.clear()
            running = sum(len(c.slots) for c in self._cohorts)
            self.stats.on_scheduler_step(running, len(self._waiting), running / self.max_num_seqs)
        for cohort in self._cohorts:
            for seq in cohort.live:
                self._finish(seq, "abort")
        for seq in self._waiting:
            self._finish(seq, "abort")

    def _take_waiting(self) -> list[_Sequence]:
        running = sum(len(c.slots) for c in self._cohorts)
        free = self.max_num_seqs - running
        if free <= 0 or len(self._cohorts) >= MAX_COHORTS:
            return []
        taken: list[_Sequence] = []
        while self._waiting and len(taken) < free:
            seq = self._waiting.popleft()
            if seq.aborted:
                self._finish(seq, "abort")
                continue
            taken.append(seq)
        return taken

    def _iterate(self, admitted: list[_Sequence]) -> None:
        """One step: the admitted sequences' prefill and one decode of every other cohort,
        then the logits processors over the whole batch, then sampling."""
        new = self._new_cohort(admitted) if admitted else None
        if self.processors is not None:
            self.processors.step()  # vLLM: condense(), then refresh_metadata()
        work: list[tuple[_Cohort, torch.Tensor]] = []
        if new is not None:
            self._cohorts.append(new)
            work.append((new, new.prefill()))
        for cohort in list(self._cohorts):
            if cohort is new:
                continue
            if not cohort.slots:
                self._cohorts.remove(cohort)
                continue
            work.append((cohort, cohort.decode([seq.output_ids[-1] for seq in cohort.live])))
        masked = []
        for cohort, raw in work:
            logits = raw.clone()
            cohort.masks.apply_(logits, cohort.slots)
            masked.append(logits)
        if self.processors is not None and work:
            masked = self._apply_processors(work, masked)
        for (cohort, raw), logits in zip(work, masked, strict=True):
            self._sample_and_emit(cohort, raw, logits)

    def _new_cohort(self, sequences: list[_Sequence]) -> _Cohort:
        now = time.monotonic()
        for seq in sequences:
            seq.scheduled = now
            self.stats.on_prefill(len(seq.prompt_ids), len(seq.prompt_ids), 0)
        cohort = _Cohort(self, sequences)
        if self.processors is not None:
            for seq in sequences:
                # The output list is the one _sample_and_emit appends to: processors see it grow.
                self.processors.add(seq, seq.params, seq.prompt_ids, seq.output_ids)
        return cohort

    def _apply_processors(
        self, work: list[tuple[_Cohort, torch.Tensor]], masked: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """The step's logits in the persistent batch's row order through the processors, and
        back into each cohort's (cache) order."""
        assert self.processors is not None
        position: dict[Hashable, int] = {}
        for cohort, _ in work:
            for seq in cohort.live:
                position[seq] = len(position)
        stacked = torch.cat(masked)
        order = torch.tensor(
            [position[key] for key in self.processors.row_keys()], dtype=torch.long
        )
        stacked[order] = self.processors.apply(stacked[order])
        return list(torch.split(stacked, [len(cohort.slots) for cohort, _ in work]))

    def _sample_and_emit(self, cohort: _Cohort, raw: torch.Tensor, logits: torch.Tensor) -> None:
        """``raw``: the model's logits; ``logits``: masked and through the processors."""
        live = cohort.live
        # vLLM's default logprobs_mode (raw_logprobs): from the model's logits, before
        # min_tokens, logit_bias, penalties and temperature.
        logprobs = torch.log_softmax(raw, dim=-1)
        now = time.monotonic()
        keep, latencies = [], []
        sampled = 0
        for i, seq in enumerate(live):
            if seq.aborted:
                self._finish(seq, "abort")
                continue
            token = self._sample(seq, logits[i])
            sampled += 1
            cohort.masks.accept(cohort.slots[i], token)
            if seq.first_token:
                latencies.append(now - seq.last_token)
            else:
                seq.first_token = now
                self.stats.on_first_token(now - seq.arrived)
            seq.last_token = now
            seq.output_ids.append(token)
            token_logprob = float(logprobs[i, token])
            seq.cumulative_logprob += token_logprob
            top = (
                self._top_logprobs(seq, logprobs[i], token)
                if seq.request.options.logprobs is not None
                else None
            )
            self._check_finished(seq, token)
            self._emit_delta(seq, token, top)
            if seq.finish_reason is None:
                keep.append(i)
            else:
                self._finish(seq, seq.finish_reason)
        self.stats.on_tokens(sampled, latencies)
        cohort.keep(keep)
        if not cohort.slots and cohort in self._cohorts:
            self._cohorts.remove(cohort)

    def _sample(self, seq: _Sequence, logits: torch.Tensor) -> int:
        """``logits``: the row with the constraint masks applied; the rest is
        :mod:`serving.engine.sampling`, in vLLM's order."""
        options = seq.request.options
        stop_ids = self.eos_token_ids | set(options.stop_token_ids)
        logits = adjust_logits(logits, options, seq.prompt_ids, seq.output_ids, stop_ids)
        if not torch.isfinite(logits).any():
            # Nothing is allowed (a dead constraint): end the request rather than emit noise.
            return min(self.eos_token_ids) if self.eos_token_ids else int(raw_argmax(logits))
        return choose(logits, options, seq.generator)

    def _top_logprobs(
        self, seq: _Sequence, logprobs: torch.Tensor, token: int
    ) -> tuple[TokenLogprob, ...]:
        k = seq.request.options.logprobs or 0
        chosen = float(logprobs[token])
        rank = int((logprobs > chosen).sum()) + 1
        entries = [TokenLogprob(token, chosen, rank, self._piece(token))]
        if k:
            values, ids = torch.topk(logprobs, k)
            for r, (value, tid) in enumerate(zip(values.tolist(), ids.tolist(), strict=True), 1):
                if tid != token:
                    entries.append(TokenLogprob(tid, value, r, self._piece(tid)))
        return tuple(entries)

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _check_finished(self, seq: _Sequence, token: int) -> None:
        options = seq.request.options
        if token in self.eos_token_ids and not options.ignore_eos:
            seq.finish_reason = "stop"
        elif token in options.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token
        elif (
            len(seq.output_ids) >= options.max_tokens
            or len(seq.prompt_ids) + len(seq.output_ids) >= self.max_model_len
        ):
            seq.finish_reason = "length"

    def _emit_delta(self, seq: _Sequence, token: int, top: tuple[TokenLogprob, ...] | None) -> None:
        options = seq.request.options
        ids = seq.output_ids
        if seq.finish_reason == "stop" and seq.stop_reason is None and not options.ignore_eos:
            ids = ids[:-1]  # EOS is not text
        elif seq.stop_reason is not None and not options.include_stop_str_in_output:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=options.skip_special_tokens)
        if options.stop:
            start = max(0, len(seq.emitted_text) - max(map(len, options.stop)))
            hits = [(text.find(s, start), s) for s in options.stop if text.find(s, start) >= 0]
            if hits:
                at, stop = min(hits)
                text = text[: at + len(stop)] if options.include_stop_str_in_output else text[:at]
                seq.finish_reason, seq.stop_reason = "stop", stop
        if seq.finish_reason is None:
            if text.endswith("\ufffd"):
                text = text[: len(seq.emitted_text)]  # an incomplete UTF-8 sequence: wait
            elif options.stop:
                hold = max(map(len, options.stop)) - 1  # could be the start of a stop string
                text = text[: max(len(seq.emitted_text), len(text) - hold)]
        new_text = text[len(seq.emitted_text) :] if text.startswith(seq.emitted_text) else text
        seq.emitted_text = text
        seq.emit(
            Delta(
                text=new_text,
                token_ids=(token,),
                num_input_tokens=len(seq.prompt_ids),
                num_output_tokens=len(seq.output_ids),
                cumulative_logprob=seq.cumulative_logprob,
                logprobs=(top,) if top is not None else None,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                index=seq.index,
            )
        )

    def _finish(self, seq: _Sequence, reason: str) -> None:
        if reason == "abort" and seq.finish_reason is None:
            seq.finish_reason = "abort"
            seq.emit(
                Delta(
                    text="",
                    token_ids=(),
                    num_input_tokens=len(seq.prompt_ids),
                    num_output_tokens=len(seq.output_ids),
                    cumulative_logprob=seq.cumulative_logprob,
                    finish_reason="abort",
                    index=seq.index,
                )
            )
        seq.emit(_DONE)
        now = time.monotonic()
        scheduled = seq.scheduled or now
        first = seq.first_token or now
        last = seq.last_token or now
        generated = len(seq.output_ids)
        last_of_parent, most = (
            seq.parent.finished(generated) if seq.parent is not None else (True, generated)
        )
        self.stats.on_finished(
            FinishedRequest(
                finish_reason=reason,
                prompt_tokens=len(seq.prompt_ids),
                generation_tokens=len(seq.output_ids),
                max_tokens=seq.request.options.max_tokens,
                n=seq.n,
                queue_time=scheduled - seq.arrived,
                prefill_time=first - scheduled,
                decode_time=last - first,
                inference_time=last - scheduled,
                e2e_latency=now - seq.arrived,
                last_of_parent=last_of_parent,
                max_generation_tokens=most,
            )
        )
        if self.processors is not None:
            self.processors.remove(seq)  # vLLM: remove_request (condensed at the next step)
        with self._cond:
            self._in_flight -= 1

    def _fail(self, seq: _Sequence, exc: Exception) -> None:
        seq.finish_reason = "abort"
        seq.emit(EngineUnavailableError(f"model {self.name} failed while decoding: {exc}"))
        self._finish(seq, "abort")

    # --- embeddings -----------------------------------------------------------------------

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        with self._embed_lock, torch.inference_mode():
            batch = self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_model_len,
                return_tensors="pt",
            )
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            if self.loaded.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
            return pooled.numpy(), int(batch["attention_mask"].sum())


def _child(request: GenerateRequest, index: int) -> GenerateRequest:
    """Completion ``index`` of a request with ``n`` > 1, as vLLM's ``ParentRequest`` makes it:
    the same parameters with ``n`` = 1 and, when a seed was given, seed + index (so the
    completions differ but the whole request is reproducible)."""
    options = request.options
    if options.n == 1:
        return request
    seed = options.seed + index if options.seed is not None else None
    return replace(request, options=replace(options, n=1, seed=seed))


def raw_argmax(logits: torch.Tensor) -> int:
    return int(torch.argmax(torch.nan_to_num(logits, neginf=-1e30)))


def load_engine(model_dir: Path, *, name: str, stats: EngineStats | None = None) -> Engine:
    """Load ``model_dir`` (a repository's ``<name>/<version>/`` holding ``model.json``) and start
    its decode loop. Slow: it reads the weights. Raises :class:`ModelLoadError`."""
    model_dir = Path(model_dir)
    config = read_engine_config(model_dir)
    started = time.monotonic()
    loaded = load_model(config)
    if config.seed is not None:
        torch.manual_seed(config.seed)
    engine = Engine(loaded, name=name, version=model_dir.name, stats=stats)
    logger.info(
        "engine %s loaded %s (%s) in %.1fs",
        name,
        config.weights,
        config.kind,
        time.monotonic() - started,
    )
    return engine
