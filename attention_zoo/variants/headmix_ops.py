"""The elementwise building blocks of head-mixed attention (THA, DCMHA): a static head mix as one GEMM, the
softmax in at least fp32, and the re-zeroing of invisible keys after a post-softmax mix. ``headmix.py`` composes
them; the native kernels (``headmix_native.py``) replace them only where they are these exact functions. ``_Stage``,
the layout of a stage both of them run, lives here so that neither imports the other."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .base import Masks


def mix_heads(weight: Tensor, a: Tensor, out: Tensor | None = None) -> Tensor:
    """out[b,o,t,s] = sum_i weight[o,i] a[b,i,t,s]: one GEMM per batch on the contiguous [H, T*S] view.

    An explicit bmm: ``weight @ a`` would fold the batch into a [B*T*S, H] GEMM with two transposed copies.
    ``out``: a contiguous [B,H,T,S] tensor to write into (the core's kept scratch).
    """
    B, H, T, S = a.shape
    into = None if out is None else out.view(B, H, T * S)
    return torch.bmm(weight.expand(B, H, H), a.reshape(B, H, T * S), out=into).view(B, H, T, S)  # (B, H, T, S)


def softmax_fp32(scores: Tensor) -> Tensor:
    """Softmax over keys, computed in at least fp32, returned in the input dtype."""
    low = scores.dtype in (torch.float16, torch.bfloat16)
    return torch.softmax(scores, dim=-1, dtype=torch.float32 if low else None).to(scores.dtype)


def rezero(weights: Tensor, masks: Masks) -> Tensor:
    """Re-zero invisible keys and dead rows after a post-softmax head mix.

    A head-shared mask leaves exactly 0 at invisible keys of every head (exp(finfo.min - max) == 0) and a
    linear head mix keeps them 0, so only per-head masks and dead rows (uniform weights) need the fill.
    """
    if masks.keep is not None and masks.keep.shape[1] != 1:
        weights = weights.masked_fill(~masks.keep, 0.0)
    if masks.dead is not None:
        weights = weights.masked_fill(masks.dead, 0.0)
    return weights


class _Stage(NamedTuple):
    """A stage as the Function runs it: one head-linear part (``qmat`` per row, ``mixmat`` shared, the identity
    ``copy`` or nothing) plus the key-side low-rank terms and gate (``k1``, ``k2`` [B,R,H,S], ``kdd`` [B,H,S])."""

    qmat: Tensor | None  # (B, T, H, H)
    mixmat: Tensor | None  # (H, H), through the caller's ``mix``
    copy: bool
    k1: Tensor | None
    k2: Tensor | None
    kdd: Tensor | None

    @property
    def tensors(self) -> tuple:
        return self.qmat, self.mixmat, self.k1, self.k2, self.kdd
