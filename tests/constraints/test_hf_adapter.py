"""The Hugging Face adapter inside a real ``model.generate``, fully offline: a byte-level BPE
tokenizer trained here on a few hundred sentences and a randomly initialized one-layer GPT-2.
A random model goes anywhere it may, so every output satisfying its constraint (and ending
with EOS) is the adapter's doing."""

from __future__ import annotations

import random
import re

import pytest
import tokenizers
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from serving.constraints.hf import ConstraintLogitsProcessor
from serving.constraints.vocab import Vocabulary
from serving.sampling.constraint_spec import parse_constraint
from tests.constraints.helpers import ENGINE_CLASSES

EOS_TEXT = "<|endoftext|>"
WORDS = [
    "red",
    "green",
    "blue",
    "amber",
    "cyan",
    "teal",
    "violet",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "code",
    "item",
    "part",
    "zone",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    rng = random.Random(0)
    sentences = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        + f" {rng.randint(0, 9999)}-{rng.choice('ABCXYZ')}{rng.randint(0, 99)}."
        for _ in range(400)
    ]
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOS_TEXT],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(sentences, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS_TEXT, pad_token=EOS_TEXT)
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def model(tokenizer) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer) + 5,  # padded past the tokenizer, like many real models
        n_layer=1,
        n_embd=32,
        n_head=2,
        n_positions=128,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def vocab(tokenizer, model) -> Vocabulary:
    size = model.config.vocab_size
    if hasattr(Vocabulary, "from_hf_tokenizer"):
        try:
            return Vocabulary.from_hf_tokenizer(tokenizer, size=size)
        except TypeError:
            pass
    # Byte-level BPE spells byte b as the printable character bytes_to_unicode()[b].
    decode = {char: byte for byte, char in bytes_to_unicode().items()}
    special = set(tokenizer.all_special_ids)
    tokens = [
        b"" if i in special else bytes(decode[c] for c in tokenizer.convert_ids_to_tokens(i))
        for i in range(len(tokenizer))
    ]
    return Vocabulary.of(tokens, [tokenizer.eos_token_id], size=size)


def generate(model, tokenizer, vocab, engine, constraints, prompts, **kwargs):
    compiled = [None if c is None else engine.compile(parse_constraint(c)) for c in constraints]
    proc = ConstraintLogitsProcessor(engine, compiled)
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(kwargs.pop("seed", 0))
    out = model.generate(
        **inputs,
        logits_processor=LogitsProcessorList([proc]),
        max_new_tokens=40,
        pad_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **kwargs,
    )
    texts, ended = [], []
    for row in out[:, inputs["input_ids"].shape[1] :].tolist():
        eos_at = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else None
        ended.append(eos_at is not None)
        texts.append(b"".join(vocab.tokens[t] for t in row[:eos_at]).decode("utf-8"))
    return texts, ended, proc


CHOICES = ["red", "green", "blue", "amber-7", "teal"]
REGEXES = [r"[a-c]{2,4}-[0-9]{2}", r"(alpha|beta) [0-9]{1,3}", r"[A-Z][a-z]{0,3}\.?", r"\d{3}"]


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
@pytest.mark.parametrize("seed", range(3))
def test_sampled_outputs_satisfy_their_constraints_and_end_with_eos(
    model, tokenizer, vocab, engine_cls, seed
):
    engine = engine_cls(vocab)
    constraints = [{"choice": CHOICES}, *({"regex": r} for r in REGEXES)]
    prompts = ["red green", "alpha", "code 12", "zone", "beta delta gamma"]
    texts, ended, proc = generate(
        model, tokenizer, vocab, engine, constraints, prompts, do_sample=True, seed=seed
    )
    assert texts[0] in CHOICES
    for pattern, text in zip(REGEXES, texts[1:], strict=True):
        assert re.fullmatch(pattern, text, re.ASCII), (pattern, text)
    assert all(ended)
    assert proc.dead_rows_total == 0


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_num_return_sequences_rows_share_their_prompts_constraint(
    model, tokenizer, vocab, engine_cls
):
    engine = engine_cls(vocab)
    texts, ended, _ = generate(
        model,
        tokenizer,
        vocab,
        engine,
        [{"choice": CHOICES}, {"regex": REGEXES[0]}],
        ["red", "blue teal"],
        do_sample=True,
        num_return_sequences=3,
    )
    assert len(texts) == 6 and all(ended)
    assert all(text in CHOICES for text in texts[:3])
    assert all(re.fullmatch(REGEXES[0], text) for text in texts[3:])


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_beam_search_outputs_satisfy_the_constraint(model, tokenizer, vocab, engine_cls):
    engine = engine_cls(vocab)
    texts, ended, _ = generate(
        model,
        tokenizer,
        vocab,
        engine,
        [{"regex": REGEXES[1]}, {"choice": CHOICES}],
        ["gamma", "violet"],
        do_sample=False,
        num_beams=3,
        num_return_sequences=2,
    )
    assert all(ended)
    assert all(re.fullmatch(REGEXES[1], text) for text in texts[:2])
    assert all(text in CHOICES for text in texts[2:])


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_unconstrained_rows_are_untouched(vocab, engine_cls):
    engine = engine_cls(vocab)
    proc = ConstraintLogitsProcessor(
        engine, [None, engine.compile(parse_constraint({"max_tokens": 0}))]
    )
    input_ids = torch.zeros(2, 3, dtype=torch.long)
    scores = torch.randn(2, vocab.size)
    before = scores.clone()
    assert proc(input_ids, scores) is scores
    assert torch.equal(scores[0], before[0])
    assert torch.isfinite(scores[1]).nonzero().flatten().tolist() == list(vocab.eos_token_ids)


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_a_row_count_that_is_not_a_multiple_of_the_prompts_is_refused(vocab, engine_cls):
    engine = engine_cls(vocab)
    proc = ConstraintLogitsProcessor(engine, [None, None])
    with pytest.raises(ValueError, match="multiple"):
        proc(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, vocab.size))
