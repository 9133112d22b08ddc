"""The head-mixed attention core (THA, DCMHA) as a few batched ops: the path every device but the CPU takes.

``headmix.mixed_attention``'s blocked core is tuned for CPU caches: it walks blocks of query rows, and inside a
block loops over batch rows, heads and rank terms so that every temporary stays small and BLAS reads strided blocks
without copies. On an accelerator each iteration of those Python loops is a kernel launch, and at the benchmark's
sizes the step would be bound by launches rather than by the mechanism. Here the same pipeline runs on the whole
[B,H,T,S] tensor at once: logits in one matmul, each mixing stage as one batched GEMM (the per-row query matrices
or the static mix) plus two einsums and a gate (the key-side low-rank terms), the mask, the softmax in at least
fp32, the post-mix, the re-zeroing, dropout and ·V. Autograd takes the backward; the [B,H,T,S] intermediates it
keeps are acceptable on a device where these variants need the full logits anyway (``needs_full_logits``).

It reads the stages in the blocked core's layout (``headmix_ops._Stage``, formed by ``headmix._prepare`` with
differentiable ops, so the small weights get their gradients through it) and gives the blocked core's values:
float64 outputs and gradients agree to float reassociation (tests/test_headmix_batched.py). Under a causal mask it
computes the invisible keys that the blocked core skips; their weights are exactly 0 after the softmax in every
head, so they change nothing.

``batched_core()`` forces this path on the CPU too (tests compare the two paths there; nothing else should).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Masks
from .headmix_ops import _Stage, softmax_fp32

_forced = False  # set by ``batched_core``


@contextlib.contextmanager
def batched_core(enabled: bool = True) -> Iterator[None]:
    """Within the block, THA's and DCMHA's cores take the batched path on every device (CPU included)."""
    global _forced
    before, _forced = _forced, enabled
    try:
        yield
    finally:
        _forced = before


def use_batched(device: torch.device) -> bool:
    """The batched path runs off the CPU (``cuda``, ``meta``, …), where launches rather than caches set the cost."""
    return _forced or device.type != "cpu"


def _stage(st: _Stage, a: Tensor, mix: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """One mixing stage on a [B,H,T,S] tensor (``headmix``'s docstring has the terms), every op out of place."""
    if st.qmat is not None:  # one [H,H] matrix per (b, t): a batched GEMM over (b, t) on the [B,T,H,S] view
        out = torch.matmul(st.qmat, a.transpose(1, 2)).transpose(1, 2)
    elif st.mixmat is not None:
        out = mix(st.mixmat, a)
    else:
        out = a if st.copy else None
    if st.k1 is None:
        return torch.zeros_like(a) if out is None else out
    low = torch.einsum("brhs,bhts->brts", st.k1, a)  # (B, R, T, S): the R key-side projections of each head vector
    key = torch.einsum("brts,brhs->bhts", low, st.k2)  # their expansions back onto the heads
    key = torch.addcmul(key, a, st.kdd[:, :, None, :])  # the key gate (B, H, 1, S)
    return key if out is None else out + key


def _mask(scores: Tensor, masks: Masks) -> Tensor:
    """``Masks.apply`` with a finite negative (nothing -inf is ever mixed) that keeps the scores' dtype: an fp32
    bias is added in fp32 and rounded once, as the blocked core's in-place add does."""
    if masks.bias is not None:
        scores = (scores + masks.bias).to(scores.dtype)
    if masks.keep is not None:
        scores = scores.masked_fill(~masks.keep, torch.finfo(scores.dtype).min)
    if masks.dead is not None:
        scores = scores.masked_fill(masks.dead, 0.0)
    return scores


def batched_attention(q: Tensor, k: Tensor, v: Tensor, masks: Masks, pre_s: _Stage | None, post_s: _Stage | None,
                      dropout: float, mix: Callable, rz: Callable) -> Tensor:
    """q [B,H,T,dh] (pre-scaled), k [B,H,S,dh], v [B,H,S,dv] -> [B,H,T,dv]; the arguments as the blocked core's."""
    logits = q @ k.transpose(-1, -2)  # (B, H, T, S)
    if pre_s is not None:
        logits = _stage(pre_s, logits, mix)
    w = softmax_fp32(_mask(logits, masks))
    p = rz(_stage(post_s, w, mix) if post_s is not None else w, masks)
    if dropout:
        p = F.dropout(p, dropout)
    return p @ v
