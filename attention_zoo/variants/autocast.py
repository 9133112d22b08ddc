"""Autocast as the attention cores meet it: whether it is on for a device, turning it off, and casting a custom
autograd Function's inputs the way autocast would (so its forward and backward compute in one dtype). The meta
device, which has no autocast, reads as "off"."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor


def autocast_enabled(device_type: str) -> bool:
    """``torch.is_autocast_enabled(device_type)``; False where autocast does not exist (the meta device, on which
    shape-only runs count a step's kernels)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def autocast_off(device_type: str):
    """``torch.autocast(device_type, enabled=False)``, or nothing where autocast does not exist (meta)."""
    try:
        return torch.autocast(device_type, enabled=False)
    except RuntimeError:
        return contextlib.nullcontext()


def autocast_cast(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """The tensors as autocast hands them to a matmul: floating ones other than float64 in autocast's dtype, the
    rest (and everything outside autocast) unchanged. A custom autograd Function runs its backward outside
    autocast, so its callers cast with this before ``apply`` and run the Function with autocast off: forward and
    backward then compute in one dtype (what ``torch.amp.custom_fwd(cast_inputs=...)`` does for one device)."""
    ref = next((t for t in tensors if t is not None), None)
    if ref is None or not autocast_enabled(ref.device.type):
        return tensors
    dtype = torch.get_autocast_dtype(ref.device.type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                 for t in tensors)
