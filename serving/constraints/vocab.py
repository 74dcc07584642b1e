"""The token vocabulary a constraint is compiled against: what bytes each token ID spells."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from serving.constraints.spec import ConstraintError


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
