"""Registers the ``TinyBigramForCausalLM`` architecture, as a vLLM general plugin.

The platform's convention for a custom architecture: one Hugging Face ``transformers``
implementation, registered twice by the plugin's entry point function, which vLLM (and the
platform's CPU engine) call in every process before a model loads:

- with ``transformers``' Auto classes (``AutoConfig``, ``AutoModelForCausalLM``), so the CPU
  engine, which loads with ``AutoModelForCausalLM.from_pretrained``, finds it;
- with vLLM's ``ModelRegistry`` under the name a checkpoint's ``config.json`` lists in
  ``architectures``, pointing at vLLM's Transformers backend, which runs a model registered with
  the Auto classes.

It must be safe to call more than once (vLLM calls general plugins in every process).
"""

from __future__ import annotations

ARCHITECTURE = "TinyBigramForCausalLM"


def register() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tiny_bigram.modeling import TinyBigramConfig, TinyBigramForCausalLM

    AutoConfig.register(TinyBigramConfig.model_type, TinyBigramConfig, exist_ok=True)
    AutoModelForCausalLM.register(TinyBigramConfig, TinyBigramForCausalLM, exist_ok=True)
    try:
        from vllm import ModelRegistry
    except ImportError:  # an engine without vLLM (the platform's CPU engine) needs only the above
        return
    ModelRegistry.register_model(
        ARCHITECTURE, "vllm.model_executor.models.transformers:TransformersForCausalLM"
    )
