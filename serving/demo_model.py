"""Make a tiny Llama-style causal LM with random weights and a locally trained BPE tokenizer.

The README's demo and the tests need a real Hugging Face model directory (config, safetensors,
tokenizer, chat template) without ever reaching a model hub. Its output is noise: only a
constraint can make it say anything in particular, which is exactly what the structured-output
tests rely on.

    python -m serving.demo_model OUT_DIR [--seed N]

The same seed gives the same tokenizer and weights.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

# Byte-level BPE learns merges from this text; every byte is in the base alphabet, so any
# string (JSON, digits, UTF-8) can be encoded whatever the corpus holds.
CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "A model serving platform registers models, materializes weights and rolls out versions.",
    "Red-Black rollouts shift traffic in stages; Versioned rollouts keep one endpoint per version.",
    "Callers send prompts and receive completions, streamed token by token.",
    '{"name": "Ada", "age": 36, "tags": ["math", "code"], "active": true, "score": null}',
    '{"color": "red", "size": 3}, {"color": "green", "size": 12}, {"color": "blue", "size": 7}',
    "yes no maybe true false red green blue small medium large",
    "0123456789 42 3.14 2026-12-03 ABC-1234 user@example.com",
    "Hello! How are you today? I am fine, thank you.",
    "system user assistant: you are a helpful assistant.",
]

# Tools are described and calls written in the Hermes format that Qwen's and Hermes' templates
# use, which the front end's auto tool choice reads back (serving.frontend.tools); a tool's
# result goes back as a user turn, as in Qwen's template. Without tools the prompt is just the
# turns.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call functions. To call one, answer "
    '<tool_call>{"name": <name>, "arguments": <arguments object>}</tool_call>. '
    "Functions:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</s>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "<|user|>\n<tool_response>\n{{ message['content'] }}\n</tool_response></s>\n"
    "{% else %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    '<tool_call>{"name": {{ call.function.name | tojson }}, '
    '"arguments": {{ call.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}</s>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2 style) wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = list(itertools.chain.from_iterable(itertools.repeat(CORPUS_LINES, 20)))
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_demo_model(
    out: Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    max_position_embeddings: int = 1024,
) -> Path:
    """Write the model to ``out`` (created) and return it."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = make_demo_model(args.out, seed=args.seed)
    print(json.dumps({"model": str(path)}))


if __name__ == "__main__":
    main()
