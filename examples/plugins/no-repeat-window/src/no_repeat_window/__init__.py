"""No token repeated within the last N tokens of a request, as a vLLM V1 logits processor.

A request turns it on with ``SamplingParams.extra_args = {"no_repeat_window": N}`` (through the
OpenAI API: ``"vllm_xargs": {"no_repeat_window": N}``); without it the request is untouched.

vLLM keeps one instance per engine and tells it how the batch changed before every step
(``update_state``): requests added at a row with their parameters and their output token list
(the same list object, which vLLM appends to in place), rows removed, and rows moved when the
batch is condensed. ``apply`` then bans, in each row, the tokens of that row's last N.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

EXTRA_ARG = "no_repeat_window"


class NoRepeatWindow(LogitsProcessor):
    @classmethod
    def validate_params(cls, params) -> None:
        window = (params.extra_args or {}).get(EXTRA_ARG)
        if window is not None and (
            not isinstance(window, int) or isinstance(window, bool) or window < 0
        ):
            raise ValueError(f"{EXTRA_ARG} must be a non-negative integer, not {window!r}")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        # row -> (window, the request's output token ids, grown in place by the engine)
        self.rows: dict[int, tuple[int, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it can change the greedy choice

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index, params, _prompt, output in batch_update.added:
            window = (params.extra_args or {}).get(EXTRA_ARG) if params is not None else None
            if window:
                self.rows[index] = (int(window), output)
            else:
                self.rows.pop(index, None)
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for source, target, direction in batch_update.moved:
            moving = self.rows.pop(source, None)
            if direction == MoveDirectionality.SWAP:
                staying = self.rows.pop(target, None)
                if staying is not None:
                    self.rows[source] = staying
            if moving is not None:
                self.rows[target] = moving
            elif direction != MoveDirectionality.SWAP:
                self.rows.pop(target, None)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (window, output) in self.rows.items():
            recent = output[-window:]
            if recent:
                logits[index, torch.tensor(recent, dtype=torch.long)] = float("-inf")
        return logits
