"""Small helpers shared by the constraint tests."""

from __future__ import annotations

import numpy as np
import pytest

from serving.constraints.native import NativeEngine
from serving.constraints.reference import ReferenceEngine

# Adapter tests run over both engines: they must behave the same behind the same interface.
ENGINE_CLASSES = [
    pytest.param(ReferenceEngine, id="reference"),
    pytest.param(NativeEngine, id="native"),
]


def allowed_ids(bitmask: np.ndarray, row: int, size: int) -> list[int]:
    """The token IDs whose bits are set in one bitmask row."""
    words = bitmask[row].view(np.uint32)
    return [t for t in range(size) if (int(words[t >> 5]) >> (t & 31)) & 1]
