"""A bigram language model: the next token's logits depend on the current token only."""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class TinyBigramConfig(PretrainedConfig):
    model_type = "tiny_bigram"

    def __init__(self, vocab_size: int = 256, hidden_size: int = 16, **kwargs) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)


class TinyBigramForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = TinyBigramConfig
    base_model_prefix = "bigram"
    _no_split_modules: list[str] = []

    def __init__(self, config: TinyBigramConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor, attention_mask=None, past_key_values=None, **kwargs):
        logits = self.head(self.embed(input_ids))
        return CausalLMOutputWithPast(logits=logits, past_key_values=None)
