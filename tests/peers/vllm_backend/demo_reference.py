"""The demo model's own greedy outputs, computed with Hugging Face ``transformers`` (not with the
engine under test), standing in for the facebook/opt-125m texts and vLLM offline baselines
that Triton's CI tests compare against.

The peer tests read ``DEMO_MODEL_DIR`` (set by ``conftest.py``); the model is loaded once per
process. ``max_tokens`` defaults to vLLM's ``SamplingParams`` default, 16, as the tests rely on.
"""

from __future__ import annotations

import functools
import os
from typing import Any

VLLM_DEFAULT_MAX_TOKENS = 16


@functools.cache
def _model() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.environ["DEMO_MODEL_DIR"]
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return tokenizer, model


def greedy_token_ids(prompt: str, max_tokens: int = VLLM_DEFAULT_MAX_TOKENS) -> list[int]:
    """Greedy continuation of ``prompt``, stopping at EOS (included) or ``max_tokens``."""
    import torch

    tokenizer, model = _model()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(ids).logits[0, -1]
            token = int(torch.argmax(logits))
            out.append(token)
            if token == tokenizer.eos_token_id:
                break
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


def greedy_text(prompt: str, max_tokens: int = VLLM_DEFAULT_MAX_TOKENS) -> str:
    tokenizer, _ = _model()
    return tokenizer.decode(greedy_token_ids(prompt, max_tokens), skip_special_tokens=True)


def greedy_stream(prompt: str, max_tokens: int = VLLM_DEFAULT_MAX_TOKENS) -> list[str]:
    """The text each generated token adds (what a streaming response carries per step)."""
    tokenizer, _ = _model()
    ids = greedy_token_ids(prompt, max_tokens)
    pieces, previous = [], ""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        pieces.append(text[len(previous) :])
        previous = text
    return pieces


def greedy_choice(prompt: str, choices: list[str]) -> str:
    """Greedy decoding restricted to ``choices`` (vLLM's structured ``choice``): at each step
    the most likely token that keeps the text a prefix of some choice, until one is complete."""
    import torch

    tokenizer, model = _model()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    text = ""
    with torch.inference_mode():
        while text not in choices:
            logits = model(ids).logits[0, -1]
            for token in torch.argsort(logits, descending=True).tolist():
                piece = tokenizer.decode([token], skip_special_tokens=True)
                if piece and any(c.startswith(text + piece) for c in choices):
                    break
            text += piece
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return text


def expected_output(prompt: str, exclude_input_in_output: bool | None) -> bytes:
    """Non-streaming ``text_output`` for ``prompt`` under the default sampling parameters."""
    prefix = "" if exclude_input_in_output else prompt
    return (prefix + greedy_text(prompt)).encode("utf-8")


class DemoGreedyEngine:
    """What accuracy_test.py asks of vLLM's ``AsyncLLMEngine`` for its baseline: ``generate``
    yielding request outputs whose ``outputs[i].text`` is the completion. Greedy only, as the
    test's parameters (temperature 0, top_p 1) are."""

    async def generate(self, prompt: str, sampling_params: Any, request_id: str) -> Any:
        from types import SimpleNamespace

        assert sampling_params.temperature == 0 and sampling_params.top_p == 1
        structured = sampling_params.structured_outputs
        if structured is not None:
            assert structured.choice, "only the test's choice constraint is modelled"
            text = greedy_choice(prompt, list(structured.choice))
        else:
            text = greedy_text(prompt, sampling_params.max_tokens)
        yield SimpleNamespace(outputs=[SimpleNamespace(text=text)], finished=True)


def prompt_tokens(prompts: list[str]) -> int:
    """How many tokens the demo tokenizer makes of ``prompts`` together (vLLM's
    ``vllm:prompt_tokens_total`` after one request each)."""
    tokenizer, _ = _model()
    return sum(len(tokenizer(prompt).input_ids) for prompt in prompts)
