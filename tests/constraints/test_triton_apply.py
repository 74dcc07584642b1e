"""The fused Triton apply kernel, run by Triton's CPU interpreter, against the native CPU apply
bit for bit.

The kernel is the one a CUDA device compiles: ``triton_apply`` builds it on first use for the
mode ``TRITON_INTERPRET`` names at that moment, so these tests set the variable and call the
production functions on CPU tensors. Sizes are small: the interpreter runs each program in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.constraints import triton_apply
from serving.constraints.apply import _apply_indexed_, _apply_kernel_, apply_bitmask_

pytestmark = pytest.mark.skipif(not triton_apply.available(), reason="triton is not installed")

BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS.get(t.dtype, torch.int16))


def random_case(
    rows: int, vocab: int, dtype: torch.dtype, seed: int, pad: int = 0
) -> tuple[torch.Tensor, np.ndarray]:
    """Logits (rows strided when ``pad``) holding specials the kernel must leave alone, and a
    random bitmask whose row 0 allows everything and row 1 nothing."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab + pad, generator=gen) * 10).to(dtype)[:, :vocab]
    logits[0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])[: min(3, vocab)].to(dtype)
    words = (vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen)
    mask[0] = -1
    if rows > 1:
        mask[1] = 0
    return logits, mask.numpy()


def native(logits: torch.Tensor, mask: np.ndarray, rows: list[int] | None) -> torch.Tensor:
    out = logits.clone()
    apply_bitmask_(out, mask, rows=rows)
    return out


@pytest.mark.parametrize("read_row", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("vocab", [1, 31, 33, 700, 1029])
def test_kernel_equals_native_apply(dtype: torch.dtype, vocab: int, read_row: bool) -> None:
    logits, mask = random_case(5, vocab, dtype, seed=vocab, pad=3)
    rows = [4, 0, 1, 3]  # unordered, row 2 unconstrained
    out = logits.clone()
    packed = torch.from_numpy(mask[rows]).contiguous()
    index = torch.tensor(rows, dtype=torch.int32)
    triton_apply.apply_packed_(out, packed, index, block=256, read_row=read_row)
    assert torch.equal(as_bits(out), as_bits(native(logits, mask, rows)))
    assert torch.equal(as_bits(out[2]), as_bits(logits[2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_without_an_index_applies_the_first_rows(dtype: torch.dtype) -> None:
    logits, mask = random_case(4, 300, dtype, seed=7)
    out = logits.clone()
    triton_apply.apply_packed_(out, torch.from_numpy(mask[:3]).contiguous(), None, block=128)
    assert torch.equal(as_bits(out), as_bits(native(logits, mask, [0, 1, 2])))


def test_bit_order_is_low_bit_first() -> None:
    """Bit ``t % 32`` of word ``t // 32`` is token ``t``; bit 31 is the int32 sign bit."""
    mask = np.zeros((1, 2), dtype=np.int32)
    mask[0, 0] = np.int32(-(2**31)) | 1  # tokens 0 and 31
    mask[0, 1] = 1 << 4  # token 36
    out = torch.zeros(1, 40)
    triton_apply.apply_packed_(out, torch.from_numpy(mask), None, block=32)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [0, 31, 36]


def test_columns_past_the_mask_are_left_alone() -> None:
    logits = torch.randn(2, 70)
    out = logits.clone()
    triton_apply.apply_packed_(out, torch.zeros(2, 1, dtype=torch.int32), None, block=64)
    assert torch.isinf(out[:, :32]).all()
    assert torch.equal(out[:, 32:], logits[:, 32:])


@pytest.mark.parametrize("rows", [None, [2], [3, 1, 0]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_device_path_equals_native_apply(rows: list[int] | None, dtype: torch.dtype) -> None:
    """``apply.py``'s kernel path (gather the constrained rows, copy, one launch), here with
    the device being the CPU: what a CUDA device runs, but the pinning."""
    logits, mask = random_case(4, 5000, dtype, seed=3)
    out = logits.clone()
    _apply_kernel_(out, torch.from_numpy(mask), rows)
    assert torch.equal(as_bits(out), as_bits(native(logits, mask, rows)))


@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("rows", [[2], [3, 1, 0], [0, 1, 2, 3]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_free_path_equals_native_apply(
    rows: list[int], dtype: torch.dtype, use_kernel: bool
) -> None:
    """What the vLLM adapter runs on a device: the mask rows copied as they are, each logits
    row's mask picked on the device by the kernel (or by torch without triton)."""
    logits, mask = random_case(5, 2000, dtype, seed=9)
    out = logits.clone()
    assert _apply_indexed_(out, torch.from_numpy(mask), rows, use_kernel=use_kernel) is None
    assert torch.equal(as_bits(out), as_bits(native(logits, mask, rows)))


def test_indexed_mask_reads_the_mask_row_of_each_logits_row() -> None:
    logits, mask = random_case(6, 300, torch.float32, seed=4)
    out = logits.clone()
    index = torch.tensor([5, 2], dtype=torch.int32)
    triton_apply.apply_packed_(out, torch.from_numpy(mask), index, block=64, indexed_mask=True)
    assert torch.equal(as_bits(out), as_bits(native(logits, mask, [5, 2])))


def test_device_path_refuses_rows_outside_the_logits_or_mask() -> None:
    mask = torch.full((3, 2), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="row 3 is outside"):
        _apply_kernel_(torch.zeros(4, 64), mask, [0, 3])
    with pytest.raises(ValueError, match="row -1 is outside"):
        _apply_kernel_(torch.zeros(4, 64), mask, [-1])
    with pytest.raises(ValueError, match="row 3 is outside"):
        _apply_indexed_(torch.zeros(4, 64), mask, [3], use_kernel=True)


def test_bad_arguments_are_refused() -> None:
    logits = torch.zeros(2, 64)
    mask = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="dtype"):
        triton_apply.apply_packed_(logits.to(torch.int32), mask)
    with pytest.raises(ValueError, match="contiguous"):
        triton_apply.apply_packed_(logits.t(), mask)
    with pytest.raises(ValueError, match="packed must be an int32"):
        triton_apply.apply_packed_(logits, mask.to(torch.int64))
    with pytest.raises(ValueError, match="rows must be a 1-D tensor of 2"):
        triton_apply.apply_packed_(logits, mask, torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="block must be a power of two"):
        triton_apply.apply_packed_(logits, mask, block=48)
    with pytest.raises(ValueError, match="packed has 3 rows"):
        triton_apply.apply_packed_(logits, torch.zeros(3, 2, dtype=torch.int32))


def test_cpu_logits_keep_the_native_path() -> None:
    """Only CUDA logits go to the kernel; on CPU the native apply stays (no interpreter)."""
    from serving.constraints.apply import _kernel_applies

    assert not _kernel_applies(torch.zeros(2, 64))
