"""The token vocabulary a constraint is compiled against: what bytes each token ID spells."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from serving.sampling.constraint_spec import ConstraintError


@dataclass(frozen=True)
class Vocabulary:
    """``tokens[i]`` is the bytes token ``i`` spells (``b""`` for special tokens),
    ``eos_token_ids`` end generation, and ``size`` is the width of the model's logits
    (``>= len(tokens)``; IDs past ``len(tokens)`` are padding and never allowed)."""

    tokens: tuple[bytes, ...]
    eos_token_ids: tuple[int, ...]
    size: int = 0
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.size == 0:
            object.__setattr__(self, "size", len(self.tokens))
        if self.size < len(self.tokens):
            raise ConstraintError("vocabulary size is smaller than the number of tokens")
        for eos in self.eos_token_ids:
            if not 0 <= eos < len(self.tokens):
                raise ConstraintError(f"EOS token ID {eos} is outside the vocabulary")
        if not self.fingerprint:
            digest = hashlib.sha256()
            for token in self.tokens:
                digest.update(len(token).to_bytes(4, "little"))
                digest.update(token)
            digest.update(repr((self.eos_token_ids, self.size)).encode())
            object.__setattr__(self, "fingerprint", digest.hexdigest())

    @classmethod
    def of(cls, tokens: Iterable[bytes], eos_token_ids: Iterable[int], size: int = 0) -> Vocabulary:
        return cls(tuple(tokens), tuple(eos_token_ids), size)

    @classmethod
    def from_hf_tokenizer(
        cls,
        tokenizer: Any,
        size: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
    ) -> Vocabulary:
        """The bytes every token of a Hugging Face tokenizer spells.

        Byte-level BPE stores bytes as printable stand-in characters, SentencePiece-style
        vocabularies write spaces as ``\u2581`` and raw bytes as ``<0xHH>``; anything else is
        the token's text in UTF-8. Special tokens spell nothing (``b""``)."""
        count = len(tokenizer)
        style = _token_style(tokenizer)
        special = _special_ids(tokenizer)
        added = _added_contents(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(count)))
        tokens = []
        for token_id, piece in enumerate(pieces):
            if token_id in special or piece is None:
                tokens.append(b"")
            elif token_id in added:
                tokens.append(added[token_id].encode("utf-8"))
            else:
                tokens.append(_piece_bytes(piece, style))
        if eos_token_ids is None:
            eos = tokenizer.eos_token_id
            eos_token_ids = [] if eos is None else [eos]
        return cls(tuple(tokens), tuple(eos_token_ids), size or count)


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character table, from transformers itself
    (imported here: a tokenizer to read implies transformers is installed)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def _component_types(config: Any) -> set[str]:
    """Every ``type`` named in a tokenizer JSON component, looking into Sequences."""
    if isinstance(config, dict):
        found = {str(config["type"])} if "type" in config else set()
        for value in config.values():
            found |= _component_types(value)
        return found
    if isinstance(config, list):
        return set().union(*(_component_types(item) for item in config)) if config else set()
    return set()


def _token_style(tokenizer: Any) -> str:
    """ "bytelevel", "metaspace" or "plain", from the fast tokenizer's decoder and
    pre-tokenizer, or from the slow tokenizer's attributes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        config = json.loads(backend.to_str())
        kinds = _component_types(config.get("decoder")) | _component_types(
            config.get("pre_tokenizer")
        )
        if "ByteLevel" in kinds:
            return "bytelevel"
        if kinds & {"Metaspace", "ByteFallback", "Replace"}:
            return "metaspace"
        return "plain"
    if hasattr(tokenizer, "byte_decoder"):
        return "bytelevel"
    if hasattr(tokenizer, "sp_model"):
        return "metaspace"
    return "plain"


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def _added_contents(tokenizer: Any) -> dict[int, str]:
    """Non-special added tokens are matched as literal text, not in the model's encoding."""
    out: dict[int, str] = {}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if not getattr(added, "special", False):
            out[int(token_id)] = str(getattr(added, "content", added))
    return out


def _piece_bytes(piece: str, style: str) -> bytes:
    if style == "bytelevel":
        decoder = _byte_decoder()
        if all(ch in decoder for ch in piece):
            return bytes(decoder[ch] for ch in piece)
        return piece.encode("utf-8")
    if style == "metaspace":
        fallback = _BYTE_FALLBACK.match(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")
    return piece.encode("utf-8")
