"""The CPU engine's logits processing against vLLM 0.24's own sampler code, run on CPU torch.

vLLM is installed without its dependencies and without its compiled ops; its V1 ``Sampler``, the
built-in logits processors (min_tokens, logit_bias, min_p) and the penalty functions still import
and run on CPU tensors (the repetition penalty falls back to vLLM's torch implementation). Each
case feeds the same fixed logits and token histories to both and compares the results.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from serving.engine.sampling import adjust_logits, choose, sampling_scores
from serving.sampling.types import SamplingOptions

vllm_sampler = pytest.importorskip("vllm.v1.sample.sampler")
builtin = pytest.importorskip("vllm.v1.sample.logits_processor.builtin")
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.ops import penalties  # noqa: E402
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch  # noqa: E402

VOCAB = 48
EOS = 2
PROMPT = [5, 9, 9, 17, 30, 3]
OUTPUT = [9, 11, 11, 11, 40, 5, 12]


@pytest.fixture(autouse=True)
def _no_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM decides to pin host memory at import (it assumes an accelerator); CPU torch has no
    pinned allocator, so its module-level switch is turned off where it was copied to."""
    import vllm.utils.torch_utils as torch_utils

    for module in (torch_utils, penalties, vllm_sampler):
        monkeypatch.setattr(module, "PIN_MEMORY", False)


def _logits(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Positive and negative logits both, so the repetition penalty's two branches are taken.
    return torch.randn(VOCAB, generator=generator) * 3


CASES: list[dict[str, Any]] = [
    {},
    {"repetition_penalty": 1.5},
    {"repetition_penalty": 0.7},
    {"frequency_penalty": 0.8},
    {"presence_penalty": 1.2},
    {"frequency_penalty": -0.5, "presence_penalty": -1.0},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.4, "presence_penalty": 0.6},
    {"logit_bias": {11: 4.0, 30: -7.5, 0: 100.0}},
    # A bias that moves a logit across zero changes how the repetition penalty scales it:
    # only the order bias-then-penalty gives vLLM's numbers.
    {"logit_bias": {9: 6.0, 17: -6.0}, "repetition_penalty": 2.0},
    {"min_tokens": 10, "stop_token_ids": [7], "logit_bias": {EOS: 50.0}},
    {"temperature": 0.7, "min_p": 0.05},
    {"temperature": 1.3, "min_p": 0.3, "top_k": 5},
    {"temperature": 0.9, "top_p": 0.6, "frequency_penalty": 1.0},
    {"temperature": 1.0, "top_k": 7, "top_p": 0.8, "min_p": 0.02, "repetition_penalty": 1.2},
    {"temperature": 0.5, "logit_bias": {3: 3.0}, "presence_penalty": 2.0, "min_p": 0.1},
]


def _ours(kind: dict[str, Any]) -> SamplingOptions:
    values = dict(kind)
    if "logit_bias" in values:
        values["logit_bias"] = tuple(sorted(values["logit_bias"].items()))
    if "stop_token_ids" in values:
        values["stop_token_ids"] = tuple(values["stop_token_ids"])
    return SamplingOptions(max_tokens=16, **values)


def _vllm_metadata(kind: dict[str, Any], output: list[int]) -> tuple[SamplingMetadata, Any]:
    """A one-request batch as vLLM's model runner would hand it to the sampler."""
    params = SamplingParams(max_tokens=16, **kind)
    params._all_stop_token_ids.add(EOS)  # the engine adds the model's EOS
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4))
    processors = [
        builtin.MinTokensLogitsProcessor(config, torch.device("cpu"), False),
        builtin.LogitBiasLogitsProcessor(config, torch.device("cpu"), False),
        builtin.MinPLogitsProcessor(config, torch.device("cpu"), False),
    ]
    update = BatchUpdate(batch_size=1, removed=[], added=[(0, params, PROMPT, output)], moved=[])
    for processor in processors:
        processor.update_state(update)
    greedy = params.temperature < 1e-5
    metadata = SamplingMetadata(
        temperature=None if greedy else torch.tensor([params.temperature]),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=None if params.top_p == 1 else torch.tensor([params.top_p]),
        top_k=None if params.top_k in (0, -1) else torch.tensor([params.top_k]),
        generators={},
        max_num_logprobs=None,
        no_penalties=(
            params.repetition_penalty == 1
            and params.frequency_penalty == 0
            and params.presence_penalty == 0
        ),
        prompt_token_ids=torch.tensor([PROMPT]),
        frequency_penalties=torch.tensor([params.frequency_penalty]),
        presence_penalties=torch.tensor([params.presence_penalty]),
        repetition_penalties=torch.tensor([params.repetition_penalty]),
        output_token_ids=[output],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(processors),
    )
    return metadata, params


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("output", [OUTPUT, []], ids=["with-output", "first-token"])
@pytest.mark.parametrize("kind", CASES, ids=lambda k: ",".join(k) or "defaults")
def test_adjusted_logits_equal_vllms(kind: dict[str, Any], output: list[int], seed: int) -> None:
    """Phase 1 (what greedy decoding takes the argmax of): min_tokens, logit_bias, penalties."""
    logits = _logits(seed)
    metadata, _ = _vllm_metadata(kind, list(output))
    sampler = vllm_sampler.Sampler()
    theirs = sampler.apply_logits_processors(logits.clone()[None], metadata, False)[0]
    options = _ours(kind)
    stop_ids = {EOS, *options.stop_token_ids}
    ours = adjust_logits(logits, options, PROMPT, output, stop_ids)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-5)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", [k for k in CASES if k.get("temperature")], ids=str)
def test_sampling_scores_equal_vllms(kind: dict[str, Any], seed: int) -> None:
    """Phase 2 (random sampling): temperature, then min_p, then top-k/top-p; the tokens left
    to draw from and their probabilities are vLLM's."""
    logits = _logits(seed)
    metadata, params = _vllm_metadata(kind, list(OUTPUT))
    sampler = vllm_sampler.Sampler()
    theirs = sampler.apply_logits_processors(logits.clone()[None], metadata, False)
    theirs = sampler.apply_temperature(theirs, metadata.temperature, metadata.all_random)
    for processor in metadata.logitsprocs.argmax_invariant:
        theirs = processor.apply(theirs)
    theirs = apply_top_k_top_p_pytorch(theirs, metadata.top_k, metadata.top_p)[0]
    options = _ours(kind)
    adjusted = adjust_logits(logits, options, PROMPT, OUTPUT, {EOS})
    ours = sampling_scores(adjusted, options)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    assert 0 < int(kept.sum()) < VOCAB or not (params.min_p or params.top_k or params.top_p < 1)
    torch.testing.assert_close(torch.softmax(ours, -1), torch.softmax(theirs, -1))


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("kind", [k for k in CASES if not k.get("temperature")], ids=str)
def test_greedy_choice_is_vllms(kind: dict[str, Any], seed: int) -> None:
    """The whole vLLM sampler, greedy: the same token."""
    logits = _logits(seed)
    greedy = {**kind, "temperature": 0.0}
    metadata, _ = _vllm_metadata(greedy, list(OUTPUT))
    output = vllm_sampler.Sampler()(logits.clone()[None], metadata)
    theirs = int(output.sampled_token_ids[0, 0])
    options = _ours(greedy)
    adjusted = adjust_logits(logits, options, PROMPT, OUTPUT, {EOS, *options.stop_token_ids})
    assert choose(adjusted, options, torch.Generator()) == theirs


def test_min_p_near_one_leaves_only_the_most_likely_token() -> None:
    logits = _logits(5)
    options = SamplingOptions(temperature=1.0, min_p=0.999)
    scores = sampling_scores(logits, options)
    assert int((~torch.isinf(scores)).sum()) == 1
    assert int(torch.argmax(scores)) == int(torch.argmax(logits))
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        assert choose(logits, options, generator) == int(torch.argmax(logits))


def test_a_tiny_temperature_is_raised_as_vllm_raises_it() -> None:
    """vLLM raises 0 < temperature < 0.01 to 0.01 (smaller ones overflow)."""
    logits = _logits(6)
    tiny = sampling_scores(logits, SamplingOptions(temperature=1e-6))
    torch.testing.assert_close(tiny, logits / 1e-2)
    assert SamplingParams(temperature=1e-6).temperature == pytest.approx(1e-2)
