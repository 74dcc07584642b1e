"""How one row of logits becomes the scores a token is drawn from, in vLLM V1's order.

vLLM's sampler (0.24, ``vllm/v1/sample/sampler.py``) works in two phases, and the order matters
because the steps do not commute (a logit bias moves a logit across zero, which flips how the
repetition penalty scales it; min-p is relative to the distribution *after* temperature):

1. :func:`adjust_logits`, which can change the greedy choice: ``min_tokens`` bans the stop tokens,
   ``logit_bias`` is added, then the penalties: repetition over prompt *and* output tokens
   (positive logits divided by it, negative ones multiplied), frequency (times each token's count)
   and presence (once per token) over output tokens only.
2. :func:`sampling_scores`, for random sampling only (greedy takes the argmax of phase 1):
   temperature, min-p (tokens below ``min_p`` times the top probability are dropped), then top-k
   and top-p.

Returned logprobs are not computed from either: vLLM's default ``logprobs_mode`` is
``raw_logprobs``, the log-softmax of the model's logits before any of this (see
:meth:`serving.engine.core.Engine._sample_and_emit`).

Everything here is a pure function of a 1-D float tensor and the request's options, so the
formulas can be checked against vLLM's own (``tests/serving/engine/test_sampling.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from serving.sampling.types import SamplingOptions

# vLLM raises a positive temperature below this to it (``SamplingParams.__post_init__``: smaller
# ones overflow to inf/nan); zero means greedy.
MIN_TEMPERATURE = 1e-2


def is_greedy(options: SamplingOptions) -> bool:
    return options.temperature == 0


def has_penalties(options: SamplingOptions) -> bool:
    return (
        options.repetition_penalty != 1
        or options.frequency_penalty != 0
        or options.presence_penalty != 0
    )


def adjust_logits(
    logits: torch.Tensor,
    options: SamplingOptions,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    stop_ids: Collection[int],
) -> torch.Tensor:
    """Phase 1 on a copy of ``logits`` (shape ``[vocab]``): ``stop_ids`` are the tokens
    ``min_tokens`` holds back (EOS and ``stop_token_ids``)."""
    logits = logits.clone()
    if len(output_ids) < options.min_tokens and stop_ids:
        logits[list(stop_ids)] = -float("inf")
    if options.logit_bias:
        ids = torch.tensor([t for t, _ in options.logit_bias], dtype=torch.long)
        logits[ids] += torch.tensor([b for _, b in options.logit_bias], dtype=logits.dtype)
    if has_penalties(options):
        logits = apply_penalties(
            logits,
            prompt_ids,
            output_ids,
            repetition=options.repetition_penalty,
            frequency=options.frequency_penalty,
            presence=options.presence_penalty,
        )
    return logits


def apply_penalties(
    logits: torch.Tensor,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    repetition: float,
    frequency: float,
    presence: float,
) -> torch.Tensor:
    """The three penalties, as vLLM applies them (OpenAI's definition for frequency/presence)."""
    vocab = logits.shape[-1]
    output_counts = torch.bincount(
        torch.tensor(list(output_ids), dtype=torch.long), minlength=vocab
    )[:vocab].to(logits.dtype)
    if repetition != 1:
        seen = output_counts > 0
        if prompt_ids:
            prompt = torch.tensor(list(prompt_ids), dtype=torch.long)
            seen = seen | (torch.bincount(prompt, minlength=vocab)[:vocab] > 0)
        factor = torch.where(logits > 0, 1.0 / repetition, repetition)
        logits = torch.where(seen, logits * factor, logits)
    if frequency:
        logits = logits - frequency * output_counts
    if presence:
        logits = logits - presence * (output_counts > 0).to(logits.dtype)
    return logits


def sampling_scores(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    """Phase 2 (random sampling): the logits whose softmax the token is drawn from; dropped
    tokens are ``-inf``. Not for greedy requests (vLLM skips it for them)."""
    scores = logits / max(options.temperature, MIN_TEMPERATURE)
    if options.min_p > 0:
        probs = torch.softmax(scores, dim=-1)
        scores = scores.masked_fill(probs < options.min_p * probs.max(), -float("inf"))
    vocab = scores.shape[-1]
    if 0 < options.top_k < vocab:
        kth = torch.topk(scores, options.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if options.top_p < 1:
        # From the least likely up: drop tokens while the mass dropped stays within 1 - top_p,
        # never the most likely one.
        ordered, order = torch.sort(scores)
        mass_up_to = torch.softmax(ordered, dim=-1).cumsum(-1)
        drop = mass_up_to <= 1 - options.top_p
        drop[-1] = False
        scores = scores.scatter(0, order, ordered.masked_fill(drop, -float("inf")))
    return scores


def choose(scores: torch.Tensor, options: SamplingOptions, generator: torch.Generator) -> int:
    """The next token from phase-1 logits: the argmax when greedy, else a draw."""
    if is_greedy(options):
        return int(torch.argmax(scores))
    probs = torch.softmax(sampling_scores(scores, options), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
