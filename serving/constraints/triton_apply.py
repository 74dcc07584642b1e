"""The fused bitmask apply for device logits, written in Triton's kernel language.

One launch covers the whole batch: program ``(i, j)`` takes block ``j`` of logits row
``rows[i]``, reads the packed words of mask row ``i`` that cover it, and writes ``-inf`` where a
bit is 0. Nothing is materialized: the kernel moves the mask (1 bit per token) and reads and
writes each logit once, the bandwidth floor of an in-place apply; the torch path it replaces
(unpack to a bool tensor, ``masked_fill_``) writes and reads a byte per token on top.

By default a block is read and rewritten whole (``read_row=True``): full-width vector loads and
stores. ``read_row=False`` skips the read and stores only the disallowed entries, which moves
fewer bytes but issues one predicated store per element; ``bench/gpu_check.py`` times both.

The mask is *compact*: ``packed[i]`` is the mask of logits row ``rows[i]``, so the host copies
only the constrained rows to the device. Bit ``t % 32`` of word ``t // 32`` set means token ``t``
is allowed (``docs/constraints.md``).

Triton decides at ``triton.jit`` time whether a kernel is compiled or run by its interpreter
(``TRITON_INTERPRET=1``), so the kernel is built on first use and kept per mode: the tests set
the variable and run the very same kernel on CPU tensors.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path in apply.py is the fallback
    triton = None
    tl = None

BLOCK = 4096
"""Logits per program (a multiple of 32). Large enough that a 128k row is 32 programs, small
enough that a batch of one still spreads over the device's SMs."""
NUM_WARPS = 8
READ_ROW = True

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def available() -> bool:
    return triton is not None


def interpreting() -> bool:
    """Whether kernels built now run in Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


if triton is not None:

    def _apply_kernel(
        logits_ptr,
        packed_ptr,
        rows_ptr,
        width,
        logits_stride,
        packed_stride,
        HAS_ROWS: tl.constexpr,
        INDEXED_MASK: tl.constexpr,
        WORDS: tl.constexpr,
        READ_ROW: tl.constexpr,
    ):
        i = tl.program_id(0)
        block = tl.program_id(1)
        if HAS_ROWS:  # noqa: SIM108 (a constexpr branch, resolved when compiled)
            row = tl.load(rows_ptr + i).to(tl.int64)
        else:
            row = i.to(tl.int64)
        # The block as a [WORDS, 32] tile: one mask word per tile row, loaded once and
        # broadcast along it, so the logits side stays contiguous and vectorizes.
        word = block * WORDS + tl.arange(0, WORDS)
        bit = tl.arange(0, 32)
        if INDEXED_MASK:  # noqa: SIM108 (a constexpr branch, resolved when compiled)
            mask_row = row
        else:
            mask_row = i.to(tl.int64)
        words = tl.load(
            packed_ptr + mask_row * packed_stride + word,
            mask=word < (width + 31) // 32,
            other=-1,
        )
        allowed = ((words[:, None] >> bit[None, :]) & 1) != 0
        cols = word[:, None] * 32 + bit[None, :]
        inside = cols < width
        ptrs = logits_ptr + row * logits_stride + cols
        ninf = tl.full([WORDS, 32], float("-inf"), logits_ptr.dtype.element_ty)
        if READ_ROW:
            # Read and rewrite the whole tile: full-width vector loads and stores.
            kept = tl.load(ptrs, mask=inside)
            tl.store(ptrs, tl.where(allowed, kept, ninf), mask=inside)
        else:
            # Write only the disallowed entries: no reads, but per-element predicated stores.
            tl.store(ptrs, ninf, mask=inside & (allowed == 0))


_KERNELS: dict[bool, Any] = {}


def _kernel() -> Any:
    mode = interpreting()
    kernel = _KERNELS.get(mode)
    if kernel is None:
        if triton is None:
            raise RuntimeError("the fused bitmask apply needs the triton package")
        kernel = _KERNELS[mode] = triton.jit(_apply_kernel)
    return kernel


def apply_packed_(
    logits: torch.Tensor,
    packed: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
    read_row: bool = READ_ROW,
    indexed_mask: bool = False,
) -> torch.Tensor:
    """Set ``logits[rows[i], t] = -inf`` where bit ``t`` of ``packed[i]`` is 0, in one launch.

    ``packed`` is int32 ``[n, words]`` on the logits' device; ``rows`` is an integer tensor of
    ``n`` logits row indices there (None: rows ``0..n-1``). With ``indexed_mask`` the mask of
    logits row ``r`` is ``packed[r]`` instead (a full-height mask, copied without a gather).
    The caller checks the indices (they are on the device). Columns past ``words * 32`` are
    left alone. Returns ``logits``."""
    view = logits if logits.dim() == 2 else logits.view(1, -1)
    if view.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    if view.dtype not in DTYPES:
        raise ValueError(f"logits dtype {view.dtype} is not one of {DTYPES}")
    if view.stride(-1) != 1:
        raise ValueError("logits rows must be contiguous (stride 1 along the vocabulary)")
    if packed.dtype != torch.int32 or packed.dim() != 2 or packed.stride(-1) != 1:
        raise ValueError("packed must be an int32 [rows, words] tensor with contiguous rows")
    if packed.device != view.device:
        raise ValueError(f"packed is on {packed.device}, the logits on {view.device}")
    n = packed.shape[0]
    if rows is not None:
        if indexed_mask:
            n = rows.shape[0]
        if rows.dim() != 1 or rows.shape[0] != n or rows.device != view.device:
            raise ValueError(f"rows must be a 1-D tensor of {n} indices on {view.device}")
        if rows.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"rows must be int32 or int64, got {rows.dtype}")
    elif n > view.shape[0]:
        raise ValueError(f"packed has {n} rows, the logits {view.shape[0]}")
    if block < 32 or block & (block - 1):
        raise ValueError(f"block must be a power of two of at least 32, got {block}")
    width = min(view.shape[1], packed.shape[1] * 32)
    if n == 0 or width == 0:
        return logits
    grid = (n, triton.cdiv(width, block))
    _kernel()[grid](
        view,
        packed,
        packed if rows is None else rows,  # not read when HAS_ROWS is false
        width,
        view.stride(0),
        packed.stride(0),
        HAS_ROWS=rows is not None,
        INDEXED_MASK=indexed_mask and rows is not None,
        WORDS=block // 32,
        READ_ROW=read_row,
        num_warps=num_warps,
    )
    return logits
