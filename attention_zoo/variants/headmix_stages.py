"""The mixing stages of the head-mixed core (``headmix``): a ``MixStage`` (DCMHA's Compose, THA's static mix), its
per-query H×H matrices and key-side low-rank terms prepared in the blocked core's layout (``_Stage``), and one stage's
forward and backward over a block of query rows (native kernels where they load, ATen otherwise)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .headmix_native import (
    _native_backward,
    _native_forward,
    _native_lib,
)
from .headmix_ops import _Stage, mix_heads


@dataclass(frozen=True)
class MixStage:
    """Which terms a mixing stage has; its tensors travel separately (autograd needs them as inputs)."""

    identity: bool  # out starts from a (DCMHA) or from 0 (THA)
    static: bool  # an [H_out, H_in] matrix
    query: bool  # (w1, w2 [B,T,R,H], dd [B,T,H]) from the query token
    key: bool  # (w1, w2 [B,S,R,H], dd [B,S,H]) from the key token

    @property
    def n_tensors(self) -> int:
        return int(self.static) + 3 * int(self.query) + 3 * int(self.key)


def _unpack(stage: MixStage | None, tensors):
    """Flat stage tensors -> (static, (w1, w2, dd) | None, (w1, w2, dd) | None)."""
    if stage is None:
        return None, None, None
    it = iter(tensors)
    static = next(it) if stage.static else None
    qw = (next(it), next(it), next(it)) if stage.query else None
    kw = (next(it), next(it), next(it)) if stage.key else None
    return static, qw, kw


def query_matrix(w1: Tensor, w2: Tensor, dd: Tensor, static: Tensor | None, identity: bool) -> Tensor:
    """M_q[b,t,o,i] = [o = i] (identity) + static[o,i] + Σ_r w2[b,t,r,o] w1[b,t,r,i] + [o = i] dd[b,t,o].

    w1, w2 [B,T,R,H], dd [B,T,H], static [H,H] -> [B,T,H,H]: every query-side term of a stage as one matrix per row.
    """
    m = torch.einsum("btro,btri->btoi", w2, w1)  # (B, T, H, H)
    m = m + torch.diag_embed(dd + 1.0 if identity else dd)
    return m if static is None else m + static


def _prepare(stage: MixStage | None, tensors, blocked: bool = True) -> _Stage | None:
    """Stage tensors -> the ``_Stage`` layout, with plain differentiable ops on the small weights. ``blocked``: the
    key-side weights copied to the blocked core's memory layout; the batched core reads them as strided views."""
    if stage is None:
        return None
    static, qw, kw = _unpack(stage, tensors)
    qmat = mixmat = None
    if qw is not None:
        qmat = query_matrix(*qw, static, stage.identity)
    elif static is not None:
        mixmat = static + torch.eye(static.shape[0], dtype=static.dtype, device=static.device) if stage.identity \
            else static
    copy = qmat is None and mixmat is None and stage.identity
    k1 = k2 = kdd = None
    if kw is not None:  # (B, S, R, H) -> (B, R, H, S): unit stride along the keys, as the block
        k1, k2 = (w.permute(0, 2, 3, 1) for w in kw[:2])
        kdd = kw[2].transpose(1, 2)  # (B, H, S)
        if blocked:
            k1, k2, kdd = k1.contiguous(), k2.contiguous(), kdd.contiguous()
    return _Stage(qmat, mixmat, copy, k1, k2, kdd)


def _rows_matmul(m: Tensor, a: Tensor) -> Tensor:
    """out[b,o,t,s] = Σ_i m[b,t,o,i] a[b,i,t,s]: one GEMM per (b, t); a [B,H,c,S] in any layout with unit stride
    along s. The result lives in [B,c,H,S] memory (returned as its [B,H,c,S] view)."""
    B, H, c, S = a.shape
    at = a.transpose(1, 2)  # (B, c, H, S)
    if at.is_contiguous():
        return torch.matmul(m, at).transpose(1, 2)
    out = a.new_empty(B, c, H, S)
    for b in range(B):  # a[b] viewed [c, H, S] is a strided batch BLAS takes as is: no copy of a
        torch.matmul(m[b], at[b], out=out[b])
    return out.transpose(1, 2)


def _rows_gram(g: Tensor, a: Tensor, out: Tensor) -> None:
    """out[b,t,o,i] = Σ_s g[b,o,t,s] a[b,i,t,s] (the gradient of a per-row matrix); out [B,c,H,H], each out[b]
    contiguous (rows of a [B,T,H,H] gradient)."""
    gt, at = g.transpose(1, 2), a.transpose(1, 2)  # (B, c, H, S)
    for b in range(g.shape[0]):
        torch.matmul(gt[b], at[b].transpose(-1, -2), out=out[b])


def _head_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` over (batch, head) where a block stored as [B,c,H,S] may be either operand: one strided bmm per
    batch row instead of the contiguous copy of the block that a 4-D matmul would make."""
    if all(t.is_contiguous() or t.transpose(-1, -2).is_contiguous() for t in (a, b)):
        return a @ b
    return torch.stack([a[i] @ b[i] for i in range(a.shape[0])])


def _head_matmul_t(a: Tensor, b: Tensor) -> Tensor:
    """``aᵀ @ b`` for a [B,c,H,S]-stored block a, as (bᵀ a)ᵀ: BLAS reads the block untransposed (a transposed
    operand with the block's long row stride is several times slower) and only the small result is transposed."""
    if a.is_contiguous():
        return a.transpose(-1, -2) @ b
    return _head_matmul(b.transpose(-1, -2), a).transpose(-1, -2)


def _key_project(a: Tensor, w: Tensor) -> Tensor:
    """low[b,r,t,s] = Σ_h w[b,r,h,s] a[b,h,t,s]; a [B,H,c,S'], w [B,R,H,S'] -> [B,R,c,S'].

    Broadcast products over the H planes, all R projections of a plane in one op (each plane is read once): the
    contraction is diagonal in s, so a GEMM would need a transposed copy of the block.
    """
    out = torch.mul(a[:, 0, None], w[:, :, 0, None, :])
    for h in range(1, a.shape[1]):
        out.addcmul_(a[:, h, None], w[:, :, h, None, :])
    return out


def _stage_forward(st: _Stage, a: Tensor, rows: slice, cols: int, mix, into: Tensor | None = None
                   ) -> tuple[Tensor, Tensor | None]:
    """One mixing stage on a block a [B,H,c,S'] (query rows ``rows``, keys [0, cols)) -> (out, key projections).
    ``into``: scratch the static mix may write its result into (``_mix``)."""
    lib = _native_lib(st, a, mix)
    if lib is not None:
        return _native_forward(lib, st, a, rows), None
    if st.qmat is not None:
        out = _rows_matmul(st.qmat[:, rows], a)
    elif st.mixmat is not None:
        out = _mix(mix, st.mixmat, a, into)
    elif st.copy:
        out = a.clone()
    else:
        out = torch.zeros_like(a)
    low = None
    if st.k1 is not None:
        k1, k2, kdd = st.k1[..., :cols], st.k2[..., :cols], st.kdd[..., :cols]
        low = _key_project(a, k1)  # (B, R, c, S')
        out.addcmul_(a, kdd[:, :, None, :])  # key gate (B, H, 1, S')
        for r in range(low.shape[1]):
            out.addcmul_(low[:, r, None], k2[:, r, :, None, :])  # (B, 1, c, S') * (B, H, 1, S')
    return out, low


def _stage_backward(st: _Stage, a: Tensor, g: Tensor, low: Tensor | None, rows: slice, cols: int, mix,
                    grads: list, into: Tensor | None = None) -> Tensor:
    """∂/∂a of one stage (the transposed map) and its weight gradients, accumulated into ``grads``
    ([qmat, mixmat, k1, k2, kdd], None where absent); ``into`` as in ``_stage_forward``."""
    lib = _native_lib(st, a, mix)
    if lib is not None and g.stride(-1) == 1:
        return _native_backward(lib, st, a, g, rows, cols, grads)
    if low is None and st.k1 is not None:  # the forward ran natively and kept none
        low = _key_project(a, st.k1[..., :cols])
    if st.qmat is not None:
        g_a = _rows_matmul(st.qmat[:, rows].transpose(-1, -2), g)
        _rows_gram(g, a, grads[0][:, rows])
    elif st.mixmat is not None:
        g_a = _mix(mix, st.mixmat.transpose(0, 1), g, into)
        B, H = a.shape[:2]
        gs = torch.bmm(g.reshape(B, H, -1), a.reshape(B, H, -1).transpose(1, 2)).sum(0)  # (H_out, H_in)
        grads[1] += gs
    elif st.copy:
        g_a = g.clone()
    else:
        g_a = torch.zeros_like(g)
    if st.k1 is not None:
        k1, k2, kdd = st.k1[..., :cols], st.k2[..., :cols], st.kdd[..., :cols]
        g_low = _key_project(g, k2)  # (B, R, c, S'): Σ_h w2[r,h] g_h
        g_a.addcmul_(g, kdd[:, :, None, :])
        for r in range(g_low.shape[1]):
            g_a.addcmul_(g_low[:, r, None], k1[:, r, :, None, :])
        gk1, gk2, gkdd = grads[2][..., :cols], grads[3][..., :cols], grads[4][..., :cols]
        prod = torch.empty_like(g)
        for r in range(g_low.shape[1]):  # Σ_t over the block's rows: broadcast products, reduced over axis 2
            gk1[:, r] += torch.mul(a, g_low[:, r, None], out=prod).sum(2)  # (B, H, S')
            gk2[:, r] += torch.mul(g, low[:, r, None], out=prod).sum(2)
        gkdd += torch.mul(g, a, out=prod).sum(2)
    return g_a


def _mix(mix, weight: Tensor, a: Tensor, into: Tensor | None) -> Tensor:
    """``mix(weight, a)``, written into ``into`` when given and the mix is the module's own (a caller's hook is
    called as it is)."""
    if into is None or mix is not mix_heads:
        return mix(weight, a)
    return mix_heads(weight, a, out=into)


def _stages(pre, post, tensors) -> tuple[_Stage | None, _Stage | None]:
    """The Function's flat tensors (5 per stage, None where absent) -> the pre and post ``_Stage``s; ``pre`` and
    ``post`` are the stages' ``copy`` flags, None for a stage that does not exist."""
    out, it = [], iter(tensors)
    for copy in (pre, post):
        if copy is None:
            out.append(None)
            continue
        qmat, mixmat, k1, k2, kdd = (next(it) for _ in range(5))
        out.append(_Stage(qmat, mixmat, copy, k1, k2, kdd))
    return out[0], out[1]


