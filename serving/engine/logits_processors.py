"""Authors' vLLM V1 logits processors and general plugins on the CPU engine.

A model version may name vLLM V1 ``LogitsProcessor`` classes in ``model.json``'s
``logits_processors`` (``module:Class``, vLLM's own FQCN form) and ship general plugins
(``vllm.general_plugins`` entry points, e.g. registering a custom architecture). vLLM runs them
on a GPU; this module runs the very same classes here, so an author can test before a GPU.

:class:`ProcessorBatch` is vLLM 0.24's persistent batch as its GPU model runner drives logits
processors (``vllm/v1/worker/gpu_input_batch.py``, ``InputBatch``), reduced to what a logits
processor can observe, with the same order of operations and vLLM's own ``BatchUpdateBuilder``:

- :meth:`~ProcessorBatch.remove` is ``InputBatch.remove_request`` (the row is registered with
  ``removed_append`` and its slot emptied); it happens when a request finishes, before the next
  step's additions, as ``_update_states`` removes finished requests first;
- :meth:`~ProcessorBatch.add` is ``add_request`` / ``_register_add_request``: the lowest freed
  row is reused (``pop_removed``), otherwise the row after the last; ``added`` gets
  ``(row, SamplingParams, prompt token ids, output token ids)`` where the output list is the
  engine's own list for the request, which it appends each sampled token to in place;
- :meth:`~ProcessorBatch.step` is ``condense()`` (the last live rows move down into the holes,
  ``UNIDIRECTIONAL``) then ``refresh_metadata()``: ``get_and_reset(num_reqs)`` and
  ``update_state`` of every processor with the update, or with ``None`` when nothing changed;
- :meth:`~ProcessorBatch.apply` hands the logits of all rows, in row order, to each processor.

Processors are built as vLLM builds them, ``cls(vllm_config, device, is_pin_memory)``, with the
cheapest honest ``VllmConfig`` (:func:`cpu_vllm_config`), and ``cls.validate_params(params)``
runs when a request is admitted (vLLM runs it in ``SamplingParams.verify``), a ``ValueError``
becoming the request's 400.

Known differences from vLLM's sampler: all processors run before the engine's penalties,
temperature and top-k/top-p (vLLM runs argmax-invariant ones after temperature, on random
sampling only), and after the engine's own ``min_tokens``/``logit_bias`` would run on vLLM they
run before them here (masking with ``-inf`` commutes either way).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from serving.sampling.types import InvalidRequestError, SamplingOptions

logger = logging.getLogger("serving.engine")

GENERAL_PLUGINS_GROUP = "vllm.general_plugins"


class PluginLoadError(RuntimeError):
    """A plugin named by the model version cannot be loaded; the message says which and why."""


def load_general_plugins() -> list[str]:
    """Run the ``vllm.general_plugins`` entry points as vLLM does (``VLLM_PLUGINS``, when set,
    names the ones to load; unset, all are loaded), before a model is loaded. Returns their
    names.

    With vLLM importable, its own ``load_plugins_by_group`` finds and loads them and each is
    called, which is ``vllm.plugins.load_general_plugins`` without its once-per-process latch
    (plugins must be safe to call again, vLLM's rule). Without vLLM, the same lookup through
    ``importlib.metadata``. vLLM's own general plugins (LoRA resolvers) are left out, so vLLM
    is not imported at all when no other general plugin is installed.
    Unlike vLLM, which logs a plugin that fails to import and goes on, a failure here stops
    the load: the model it would register would fail later and less clearly."""
    discovered = importlib.metadata.entry_points(group=GENERAL_PLUGINS_GROUP)
    if not discovered:
        return []
    allowed = os.environ["VLLM_PLUGINS"].split(",") if "VLLM_PLUGINS" in os.environ else None
    # vLLM's own general plugins (its LoRA resolvers) mean nothing here, and importing vLLM
    # for them alone would add seconds to every start.
    wanted = [
        ep
        for ep in discovered
        if (allowed is None or ep.name in allowed)
        and (ep.dist is None or ep.dist.name.lower() != "vllm")
    ]
    if not wanted:
        return []
    try:
        from vllm.plugins import load_plugins_by_group
    except ImportError:
        funcs = {}
        for ep in wanted:
            try:
                funcs[ep.name] = ep.load()
            except Exception as exc:
                raise PluginLoadError(f"general plugin {ep.name} ({ep.value}): {exc}") from exc
    else:
        names = {ep.name for ep in wanted}
        funcs = {
            name: func
            for name, func in load_plugins_by_group(GENERAL_PLUGINS_GROUP).items()
            if name in names
        }
        missing = sorted({ep.name for ep in wanted} - set(funcs))
        if missing:
            raise PluginLoadError(f"general plugin(s) {missing} failed to import (see the log)")
    for name, func in funcs.items():
        try:
            func()
        except Exception as exc:
            raise PluginLoadError(f"general plugin {name} failed: {exc}") from exc
        logger.info("loaded vLLM general plugin %s", name)
    return sorted(funcs)


def load_processor_class(fqcn: str) -> type:
    """The ``LogitsProcessor`` subclass ``module:Class`` names, loaded as vLLM's
    ``_load_logitsprocs_by_fqcns`` does (the part after ``:`` may be dotted)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    module_path, sep, qualname = fqcn.partition(":")
    if not sep or not module_path or not qualname:
        raise PluginLoadError(f"logits processor {fqcn!r} is not 'module:Class'")
    try:
        obj: Any = importlib.import_module(module_path)
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
    except Exception as exc:
        raise PluginLoadError(f"logits processor {fqcn} does not load: {exc}") from exc
    if not isinstance(obj, type) or not issubclass(obj, LogitsProcessor):
        raise PluginLoadError(f"logits processor {fqcn} is not a vLLM V1 LogitsProcessor subclass")
    return obj


def cpu_vllm_config(max_num_seqs: int, max_model_len: int) -> Any:
    """The ``VllmConfig`` processors are built with on the CPU engine.

    Real: ``device_config`` (``cpu``), ``scheduler_config.max_num_seqs`` (the engine's, the most
    rows a processor will see), ``max_model_len`` and ``async_scheduling=False`` (the engine
    writes each token into the output lists before the processors run). Everything else is
    vLLM's default and ``model_config`` is None: building a ``ModelConfig`` resolves the model
    through vLLM's registry and platform, which the CPU engine does not use. A processor that
    reads the model config (the platform's own constraint processor reads the tokenizer from
    it) is not built this way; see :mod:`serving.engine.core`."""
    from vllm.config import DeviceConfig, SchedulerConfig, VllmConfig

    scheduler = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max(2048, max_model_len),
        is_encoder_decoder=False,
        async_scheduling=False,
    )
    return VllmConfig(device_config=DeviceConfig(device="cpu"), scheduler_config=scheduler)


def sampling_params(options: SamplingOptions) -> Any:
    """vLLM's ``SamplingParams`` for a request's options, as a processor sees them in
    ``BatchUpdate.added`` (``extra_args`` exactly as the request sent them)."""
    from vllm import SamplingParams

    return SamplingParams(
        n=options.n,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k if options.top_k > 0 else 0,
        min_p=options.min_p,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        repetition_penalty=options.repetition_penalty,
        seed=options.seed,
        stop=list(options.stop),
        stop_token_ids=list(options.stop_token_ids),
        ignore_eos=options.ignore_eos,
        max_tokens=options.max_tokens,
        min_tokens=options.min_tokens,
        logprobs=options.logprobs,
        include_stop_str_in_output=options.include_stop_str_in_output,
        skip_special_tokens=options.skip_special_tokens,
        logit_bias=dict(options.logit_bias) or None,
        extra_args=dict(options.extra_args) if options.extra_args else None,
    )


class ProcessorBatch:
    """A persistent batch of rows driving a list of vLLM V1 logits processors (see the module
    docstring for how each method mirrors vLLM's ``InputBatch``). Rows are keyed by any hashable
    the caller chooses (the engine uses its sequences)."""

    def __init__(
        self,
        classes: Sequence[type],
        *,
        max_num_reqs: int,
        vllm_config: Any = None,
        device: torch.device | str = "cpu",
        is_pin_memory: bool = False,
        processors: Sequence[Any] | None = None,
    ) -> None:
        from vllm.v1.sample.logits_processor import BatchUpdateBuilder

        self.classes: tuple[Any, ...] = tuple(classes)
        device = torch.device(device)
        built = [cls(vllm_config, device, is_pin_memory) for cls in self.classes]
        self.processors: list[Any] = built + list(processors or ())
        # vLLM applies the non-argmax-invariant ones first (Sampler.apply_logits_processors).
        self.processors.sort(key=lambda p: bool(p.is_argmax_invariant()))
        self.max_num_reqs = max_num_reqs
        self.builder = BatchUpdateBuilder()
        self._keys: list[Hashable | None] = []  # InputBatch._req_ids
        self._outputs: list[list[int] | None] = []  # InputBatch.req_output_token_ids
        self.row_of: dict[Hashable, int] = {}  # InputBatch.req_id_to_index
        self.last_update: Any = None  # the BatchUpdate (or None) of the last step

    @property
    def num_reqs(self) -> int:
        return len(self.row_of)

    def validate(self, params: Any) -> None:
        """Each processor class's ``validate_params``, as vLLM calls it at admission."""
        for cls in self.classes:
            try:
                cls.validate_params(params)
            except (ValueError, TypeError) as exc:
                raise InvalidRequestError(str(exc)) from None

    def add(self, key: Hashable, params: Any, prompt_ids: list[int] | None, output: list[int]):
        """``InputBatch.add_request``; ``output`` must be the list the engine appends to."""
        if key in self.row_of:
            raise ValueError(f"{key!r} is already in the batch")
        row = self.builder.pop_removed()
        if row is None:
            row = self.num_reqs
        if row >= self.max_num_reqs:
            raise ValueError(f"the batch holds at most {self.max_num_reqs} rows")
        self.builder.batch_changed = True
        self.builder.added.append((row, params, prompt_ids, output))
        if row == len(self._keys):
            self._keys.append(key)
            self._outputs.append(output)
        else:
            self._keys[row] = key
            self._outputs[row] = output
        self.row_of[key] = row
        return row

    def remove(self, key: Hashable) -> int | None:
        """``InputBatch.remove_request``: must be followed by :meth:`step` (its ``condense``)."""
        row = self.row_of.pop(key, None)
        if row is None:
            return None
        self.builder.removed_append(row)
        self._keys[row] = None
        self._outputs[row] = None
        return row

    def condense(self) -> None:
        """``InputBatch.condense``: the last live rows move down into the lowest holes."""
        from vllm.v1.sample.logits_processor import MoveDirectionality

        num_reqs = self.num_reqs
        builder = self.builder
        if not (empty := builder.removed):
            return
        if num_reqs == 0:
            self._keys.clear()
            self._outputs.clear()
            return
        last = num_reqs + len(empty) - 1
        while empty:
            while last in empty:
                last -= 1
            hole = builder.peek_removed()
            assert hole is not None
            if hole >= last:
                break
            builder.pop_removed()
            key = self._keys[last]
            assert key is not None
            self._keys[hole], self._keys[last] = key, None
            self._outputs[hole], self._outputs[last] = self._outputs[last], None
            self.row_of[key] = hole
            builder.moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
            last -= 1
        del self._keys[num_reqs:]
        del self._outputs[num_reqs:]

    def step(self) -> Any:
        """Before a forward pass: ``condense()`` then ``refresh_metadata()``. Returns the
        ``BatchUpdate`` every processor was given (None: nothing changed)."""
        self.condense()
        update = self.builder.get_and_reset(self.num_reqs)
        for processor in self.processors:
            processor.update_state(update)
        self.last_update = update
        return update

    def row_keys(self) -> list[Hashable]:
        """The key in each row, in row order."""
        keys = self._keys[: self.num_reqs]
        assert all(k is not None for k in keys), "step() must run between remove() and apply()"
        return keys

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits``: one row per batch row, in row order (``num_reqs`` rows)."""
        if logits.shape[0] != self.num_reqs:
            raise ValueError(f"{logits.shape[0]} rows of logits for {self.num_reqs} requests")
        for processor in self.processors:
            logits = processor.apply(logits)
        return logits
