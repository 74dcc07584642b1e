"""Apply a packed token bitmask to a logits tensor in place (disallowed entries become -inf).

CPU float tensors go to the native engine (threads, no temporary tensors). Any other device
(CUDA) takes the device path: the bitmask, already in pinned host memory, is copied once to the
device without blocking, unpacked there and applied with one ``masked_fill_``, so the only
host-to-device traffic is the bitmask itself (1 bit per token).
"""

from __future__ import annotations

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
    return _apply_torch_(logits, mask, rows)


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
    if device.type != "cpu":
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
