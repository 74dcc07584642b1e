"""Apply a packed token bitmask to a logits tensor in place (disallowed entries become -inf).

CPU float tensors go to the native engine (threads, no temporary tensors). Any other device
(CUDA) takes a device path where the only host-to-device traffic is the bitmask rows of the
constrained requests (1 bit per token), gathered into pinned memory and copied without
blocking:

- the fused Triton kernel (``triton_apply.py``) when ``triton`` is installed and the logits
  are contiguous float rows: one launch, no temporaries, writes only the disallowed logits;
- otherwise torch: unpack on the device and one ``masked_fill_``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def apply_bitmask_(
    logits: torch.Tensor,
    bitmask: np.ndarray | torch.Tensor,
    rows: list[int] | None = None,
) -> torch.Tensor:
    """Set ``logits[r, t] = -inf`` where bit ``t`` of ``bitmask[r]`` is 0, for each row ``r`` in
    ``rows`` (every row when None). Columns past the bitmask's width are left alone."""
    if rows is not None and not rows:
        return logits
    if logits.device.type == "cpu" and logits.dtype in _NATIVE_DTYPES and logits.stride(-1) == 1:
        return _apply_native_(logits, bitmask, rows)
    mask = torch.from_numpy(bitmask) if isinstance(bitmask, np.ndarray) else bitmask
    if _kernel_applies(logits):
        return _apply_kernel_(logits, mask, rows)
    return _apply_torch_(logits, mask, rows)


def _kernel_applies(logits: torch.Tensor) -> bool:
    from serving.constraints import triton_apply

    return (
        logits.device.type == "cuda"
        and triton_apply.available()
        and logits.dtype in triton_apply.DTYPES
        and logits.dim() in (1, 2)
        and logits.stride(-1) == 1
    )


_NATIVE_DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def _apply_native_(
    logits: torch.Tensor, bitmask: np.ndarray | torch.Tensor, rows: list[int] | None
) -> torch.Tensor:
    from serving.constraints import _native

    mask = bitmask.numpy() if isinstance(bitmask, torch.Tensor) else bitmask
    view = logits if logits.dim() == 2 else logits.view(1, -1)
    _native.apply_bitmask(
        view.data_ptr(),
        _NATIVE_DTYPES[view.dtype],
        view.shape[0],
        view.shape[1],
        view.stride(0),
        mask,
        rows,
    )
    return logits


def _apply_kernel_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None
) -> torch.Tensor:
    """The fused kernel on the logits' device. The mask rows are gathered straight into a
    fresh pinned block (torch's caching host allocator recycles it only once the copy that reads
    it has finished, so the caller may refill ``bitmask`` at once), then copied without blocking.

    On CPU logits (Triton's interpreter, in the tests) the same steps run without pinning."""
    from serving.constraints import triton_apply

    device = logits.device
    pin = device.type == "cuda"
    n_logits = logits.shape[0] if logits.dim() == 2 else 1
    if rows is None:
        n = min(n_logits, bitmask.shape[0])
        packed = bitmask[:n]
        if pin and not packed.is_pinned():
            packed = packed.pin_memory()
        index = None
    else:
        _check_rows(rows, n_logits, bitmask.shape[0])
        host_rows = torch.tensor(rows, dtype=torch.long)
        packed = torch.empty((len(rows), bitmask.shape[1]), dtype=torch.int32, pin_memory=pin)
        torch.index_select(bitmask, 0, host_rows, out=packed)
        index_host = host_rows.to(torch.int32)
        index = index_host.pin_memory() if pin else index_host
        index = index.to(device, non_blocking=True)
    packed = packed.to(device, non_blocking=True)
    return triton_apply.apply_packed_(logits, packed, index)


def apply_bitmask_async_(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> Any:
    """``apply_bitmask_`` for device logits without a host-side gather: the rows
    ``0..max(rows)`` of ``bitmask`` (pinned) are copied to the device as they are, and the
    kernel (or torch, without triton) picks each row's mask there. No CPU time goes into moving
    the mask (at B = 256, V = 128k the gather was a 4 MB copy on the critical path), but the
    copy reads ``bitmask`` after this returns: the caller must not write it until the returned
    CUDA event has completed (None when nothing is in flight, e.g. CPU logits, which take
    ``apply_bitmask_``)."""
    if logits.device.type == "cpu":
        apply_bitmask_(logits, bitmask, rows)
        return None
    return _apply_indexed_(logits, bitmask, rows, use_kernel=_kernel_applies(logits))


def _apply_indexed_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], use_kernel: bool
) -> Any:
    """The body of ``apply_bitmask_async_`` (on CPU tensors too: Triton's interpreter in the
    tests and in ``bench/gpu_check.py --cpu-interpret``)."""
    if not rows:
        return None
    n_logits = logits.shape[0] if logits.dim() == 2 else 1
    _check_rows(rows, n_logits, bitmask.shape[0])
    device = logits.device
    cuda = device.type == "cuda"
    mask = bitmask[: max(rows) + 1].to(device, non_blocking=cuda and bitmask.is_pinned())
    host_index = torch.tensor(rows, dtype=torch.int32)
    index = (host_index.pin_memory() if cuda else host_index).to(device, non_blocking=cuda)
    if use_kernel:
        from serving.constraints import triton_apply

        triton_apply.apply_packed_(logits, mask, index, indexed_mask=True)
    else:
        _apply_torch_(logits, mask, rows)
    if not cuda:
        return None
    copied = torch.cuda.Event()
    copied.record()
    return copied


def _check_rows(rows: list[int], n_logits: int, n_mask: int) -> None:
    """The kernel indexes device memory with these, so they are checked on the host."""
    low, high = min(rows), max(rows)
    if low < 0 or high >= min(n_logits, n_mask):
        bad = low if low < 0 else high
        raise ValueError(
            f"row {bad} is outside the logits ({n_logits} rows) or the bitmask ({n_mask} rows)"
        )


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _apply_torch_(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int] | None
) -> torch.Tensor:
    device = logits.device
    width = min(logits.shape[-1], bitmask.shape[-1] * 32)
    if rows is None:
        packed = bitmask[: logits.shape[0]]
    else:
        packed = bitmask[torch.as_tensor(rows, dtype=torch.long)]
    if device.type == "cuda" and packed.device.type == "cpu":
        packed = packed.pin_memory() if not packed.is_pinned() else packed
    packed = packed.to(device, non_blocking=True)
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    allowed = ((packed.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)[:, :width]
    if rows is None:
        logits[: packed.shape[0], :width].masked_fill_(~allowed, float("-inf"))
    else:
        index = torch.as_tensor(rows, dtype=torch.long, device=device)
        sub = logits[index, :width].masked_fill_(~allowed, float("-inf"))
        logits[index, :width] = sub
    return logits
