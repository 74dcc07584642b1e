"""Vocabulary.from_hf_tokenizer on tokenizers trained offline: the bytes of the encoded IDs
must concatenate to the UTF-8 of the text, for byte-level BPE and for Metaspace with byte
fallback."""

from __future__ import annotations

import json
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from serving.constraints.vocab import Vocabulary

WORDS = "the quick brown fox jumps over lazy dog café naïve über 東京 😀 déjà vu 42 tokens"
SENTENCES = [" ".join(WORDS.split()[i % 13 :] + WORDS.split()[: i % 7]) for i in range(300)]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\u2581"))


@cache
def byte_level() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>")


@cache
def metaspace() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"])
    tok.train_from_iterator(SENTENCES, trainer)
    config = json.loads(tok.to_str())
    vocab = config["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    config["model"]["byte_fallback"] = True
    config["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ],
    }
    tok = Tokenizer.from_str(json.dumps(config))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def roundtrip(tokenizer: PreTrainedTokenizerFast, text: str) -> bytes:
    vocab = Vocabulary.from_hf_tokenizer(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return b"".join(vocab.tokens[i] for i in ids)


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_byte_level_tokens_spell_the_text(text):
    assert roundtrip(byte_level(), text) == text.encode()


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_metaspace_byte_fallback_tokens_spell_the_text(text):
    assert roundtrip(metaspace(), text) == text.encode()


def test_special_tokens_eos_and_size():
    tokenizer = byte_level()
    vocab = Vocabulary.from_hf_tokenizer(tokenizer, size=len(tokenizer) + 10)
    eos = tokenizer.eos_token_id
    assert vocab.eos_token_ids == (eos,)
    assert vocab.tokens[eos] == b""
    assert vocab.size == len(tokenizer) + 10
    assert len(vocab.tokens) == len(tokenizer)
    explicit = Vocabulary.from_hf_tokenizer(tokenizer, eos_token_ids=[1, 2])
    assert explicit.eos_token_ids == (1, 2)


def test_metaspace_pieces():
    tokenizer = metaspace()
    vocab = Vocabulary.from_hf_tokenizer(tokenizer)
    assert vocab.tokens[tokenizer.convert_tokens_to_ids("<0xC3>")] == b"\xc3"
    assert vocab.tokens[tokenizer.convert_tokens_to_ids("</s>")] == b""
    assert b" " in {t[:1] for t in vocab.tokens}
