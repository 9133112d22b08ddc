"""Attention whose logits and weights are mixed across heads (THA, DCMHA ``paper``), chunked over queries.

``mixed_attention`` runs logits = q kᵀ -> pre-mix -> mask -> softmax -> post-mix -> re-zero -> dropout -> ·V in
blocks of query rows inside one autograd Function. Only q, k, v, the mixing weights and the softmax output of each
block are saved; the logits and the post-mixed weights are recomputed in backward (one GEMM and one mix pass).
That keeps one [B,H,T,S] tensor per layer alive instead of four (saving more is slower, not faster: every saved
byte is fresh memory each step, page-faulted in on first touch), and every temporary is a block, small enough to
stay in the allocator's cache instead of being page-faulted in as a fresh mmap each time. Under causality the
block of rows [t0, t1) only reads keys [0, t1): the later keys are invisible to every head, so their weights are
exactly 0 before and after any linear head mix, and they contribute nothing to values or gradients.

A mixing stage (``MixStage``) is DCMHA's ``Compose`` over the head axis at every (t, s):
out = [a] + static·a + Σ_r w2_q[t,r] <w1_q[t,r], a> + Σ_r w2_k[s,r] <w1_k[s,r], a> + (dd_q[t] + dd_k[s]) ⊙ a,
with the identity branch optional (THA's mixes are a plain static H×H matrix). Everything that reads the query
token is one H×H matrix per query row, M_q[t] = [I] + static + Σ_r w2_q[t,r]ᵀ w1_q[t,r] + diag(dd_q[t]) (formed
outside the Function from the small weights, so autograd takes their gradients from ∂M_q), applied to the block
as one batched GEMM over (b, t); the key-side terms vary along the key axis, the block's contiguous one, and are
broadcast products over the H planes (low rank: R projections and R expansions, plus the gate). The same values as
the term-by-term sum up to float reassociation. Its backward with respect to a is the same map transposed.

That is the CPU's core. On every other device ``mixed_attention`` runs ``headmix_batched.batched_attention``
instead, the same pipeline on the whole [B,H,T,S] tensor with autograd's backward: there each iteration of the
loops below would be a kernel launch.

Under ``torch.compile`` on the CPU the core is one custom op, ``attention_zoo::mixed_attention_core`` (and its
backward op): the graph holds one node for the blocked eager code instead of the unrolled block loop, so it neither
breaks nor grows with T, and inductor compiles the layer around it (see "the core as one custom op" below).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Masks, autocast_cast, autocast_enabled, autocast_off
from .headmix_batched import batched_attention, use_batched
from .headmix_native import (
    _fused_backward,
    _fused_forward,
    _fused_lib,
    _native_backward,
    _native_forward,
    _native_lib,
    _observed,
)
from .headmix_ops import _Stage, mix_heads, rezero, softmax_fp32  # noqa: F401  (softmax_fp32: imported from here by THA, DCMHA)
from .headmix_workspace import Workspace


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


def _take(scratch, name: str, a: Tensor) -> Tensor | None:
    """A kept scratch block of ``a``'s shape and dtype, or None without a workspace."""
    return None if scratch is None else scratch(name, tuple(a.shape), a)


def _qk(q_c: Tensor, k_c: Tensor, scratch, name: str) -> Tensor:
    """The block's logits q kᵀ [B,H,c,S'], into kept scratch when there is a workspace."""
    if scratch is None:
        return q_c @ k_c.transpose(-1, -2)
    out = scratch(name, (*q_c.shape[:3], k_c.shape[2]), q_c)
    return torch.matmul(q_c, k_c.transpose(-1, -2), out=out)


def _softmax_into(scores: Tensor, slot: Tensor) -> Tensor:
    """The softmax written straight into the saved slot where the layouts allow, else computed and copied."""
    if scores.is_contiguous() and scores.dtype in (torch.float32, torch.float64) and scores.dtype == slot.dtype:
        return torch.ops.aten._softmax.out(scores, -1, False, out=slot)
    return slot.copy_(_softmax_rows(scores))


def _softmax_rows(scores: Tensor) -> Tensor:
    """``softmax_fp32`` on the layout the block is stored in (a [B,c,H,S] block stays one: no copy)."""
    t = scores.transpose(1, 2)
    if t.is_contiguous() and not scores.is_contiguous():
        return softmax_fp32(t).transpose(1, 2)
    return softmax_fp32(scores)


def _softmax_grad(g: Tensor, w: Tensor, into: Tensor | None = None) -> Tensor:
    """w ⊙ (g - Σ_s g ⊙ w), the softmax backward, as ATen's fused kernel (one pass; autograd's own) on the layout
    both blocks are stored in; the explicit in-place formula when their layouts differ. ``into``: scratch of the
    [B,H,c,S'] layout (not aliasing g) the kernel may write into."""
    if into is not None and g.is_contiguous() and w.is_contiguous():
        return torch.ops.aten._softmax_backward_data.out(g, w, -1, w.dtype, grad_input=into)
    for gv, wv in ((g, w), (g.transpose(1, 2), w.transpose(1, 2))):
        if gv.is_contiguous() and wv.is_contiguous():
            out = torch._softmax_backward_data(gv, wv, -1, wv.dtype)
            return out if gv is g else out.transpose(1, 2)
    return g.sub_((g * w).sum(-1, keepdim=True)).mul_(w)


def _mask_(scores: Tensor, masks: Masks, neg: float) -> Tensor:
    """``Masks.apply`` in place on a block the core owns."""
    if masks.bias is not None:
        scores.add_(masks.bias)
    if masks.keep is not None:
        scores.masked_fill_(~masks.keep, neg)
    if masks.dead is not None:
        scores.masked_fill_(masks.dead, 0.0)
    return scores


class _MixedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, ws: Workspace | None, masks: Masks, q: Tensor, k: Tensor, v: Tensor, *tensors: Tensor
                ) -> Tensor:
        pre, post, chunk, drop_p, mix, rz = cfg
        pre_s, post_s = _stages(pre, post, tensors)
        store, ctx.leases = None, ()
        if ws is not None:  # the saved blocks go into a kept buffer, leased to this graph (headmix_workspace)
            shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            w_all, w_lease = ws.saved(shape, q.dtype, q.device)
            keep_all, k_lease = ws.saved(shape, torch.bool, q.device) if drop_p else (None, None)
            store, ctx.leases = (w_all, keep_all), (w_lease, k_lease)
        with ws.scratch() if ws is not None else contextlib.nullcontext() as scratch:
            out, saved = _forward_blocks(q, k, v, masks, pre_s, post_s, chunk, drop_p, mix, rz, save=True,
                                         store=store, scratch=scratch)
        ctx.cfg, ctx.ws, ctx.masks, ctx.n_tensors = cfg, ws, masks, len(tensors)
        ctx.save_for_backward(q, k, v, *tensors, *[t for block in saved for t in block])
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        pre, post, chunk, drop_p, mix, rz = ctx.cfg
        saved = ctx.saved_tensors
        q, k, v = saved[:3]
        tensors = saved[3 : 3 + ctx.n_tensors]
        blocks = saved[3 + ctx.n_tensors :]
        pre_s, post_s = _stages(pre, post, tensors)
        with ctx.ws.scratch() if ctx.ws is not None else contextlib.nullcontext() as scratch:
            grads = _backward_blocks(grad_out, q, k, v, ctx.masks, pre_s, post_s, chunk, drop_p, mix, rz,
                                     [blocks[i : i + 2] for i in range(0, len(blocks), 2)], scratch)
        return (None, None, None, *grads)


def _backward_blocks(grad_out, q, k, v, masks, pre_s, post_s, chunk, drop_p, mix, rz, blocks, scratch=None) -> list:
    """Gradients [gq, gk, gv, *pre stage tensors, *post stage tensors] (None where a tensor is absent), block by
    block from the saved (w, keep) pairs: the logits and the mixes are recomputed. ``scratch`` (a workspace's):
    the stage-by-stage path writes its block temporaries there, three named buffers whose uses never overlap."""
    g_pre = [] if pre_s is None else [None if t is None else torch.zeros_like(t) for t in pre_s.tensors]
    g_post = [] if post_s is None else [None if t is None else torch.zeros_like(t) for t in post_s.tensors]
    gq, gk, gv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    grad_out = grad_out.contiguous()
    T, S = q.shape[2], k.shape[2]
    scale = 1.0 / (1.0 - drop_p) if drop_p else 1.0
    for n, t0 in enumerate(range(0, T, chunk)):
        rows = slice(t0, min(t0 + chunk, T))
        cols = _key_cols(masks, rows, S)
        m = _block_masks(masks, rows, cols)
        w, keep = blocks[n]
        q_c, k_c, v_c = q[:, :, rows], k[:, :, :cols], v[:, :, :cols]
        lib = _fused_lib(pre_s, post_s, w, m, drop_p, mix, rz)
        if lib is not None:  # one native pass per row: post-mix again, its backward, softmax's, the pre-mix's
            g_o = grad_out[:, :, rows]
            a0 = _qk(q_c, k_c, scratch, "b") if pre_s is not None else None  # recomputed logits (B, H, c, S')
            into = None if scratch is None else (_take(scratch, "c", w), _take(scratch, "d", w))
            p, g_l = _fused_backward(lib, pre_s, post_s, a0, w, _qk(g_o, v_c, scratch, "a"), rows, cols, g_pre,
                                     g_post, into)
            gv[:, :, :cols] += _head_matmul_t(p, g_o)
            gq[:, :, rows] = _head_matmul(g_l, k_c)
            gk[:, :, :cols] += _head_matmul_t(g_l, q_c)
            continue
        # the post-mixed weights and their key projections, recomputed from w (scratch: p "a", g_p "b", the post
        # stage's gradient "c", g_l "a", the logits "b", the pre stage's gradient "c")
        p, low_post = (_stage_forward(post_s, w, rows, cols, mix, _take(scratch, "a", w)) if post_s is not None
                       else (w, None))
        p = rz(p, m)
        if keep is not None:
            p = p * keep * scale
        g_o = grad_out[:, :, rows]
        gv[:, :, :cols] += _head_matmul_t(p, g_o)
        g_p = _qk(g_o, v_c, scratch, "b")  # (B, H, c, S')
        if keep is not None:
            g_p.mul_(keep).mul_(scale)
        g_p = _rezero_grad(g_p, m)
        if post_s is not None:
            g_p = _stage_backward(post_s, w, g_p, low_post, rows, cols, mix, g_post, _take(scratch, "c", w))
        g_l = _softmax_grad(g_p, w, _take(scratch, "a", w))  # w ⊙ (g - Σ_s g w)
        if m.dead is not None:  # dead rows had their logits replaced by 0: no gradient
            g_l.masked_fill_(m.dead, 0.0)
        if pre_s is not None:
            a0 = _qk(q_c, k_c, scratch, "b")  # recomputed logits (B, H, c, S')
            low_pre = (_key_project(a0, pre_s.k1[..., :cols]) if pre_s.k1 is not None
                       and _native_lib(pre_s, a0, mix) is None else None)  # the kernel forms its own
            g_l = _stage_backward(pre_s, a0, g_l, low_pre, rows, cols, mix, g_pre, _take(scratch, "c", w))
        gq[:, :, rows] = _head_matmul(g_l, k_c)
        gk[:, :, :cols] += _head_matmul_t(g_l, q_c)
    return [gq, gk, gv, *g_pre, *g_post]


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


def _key_cols(masks: Masks, rows: slice, S: int) -> int:
    """Keys a block of rows must read: [0, rows.stop) when causal. Not with dead rows: their uniform weights
    (1/S over every key) reach the other heads through the post-mix, so every key counts there."""
    return min(rows.stop, S) if masks.causal and masks.dead is None else S


def _rezero_grad(g: Tensor, masks: Masks) -> Tensor:
    """Gradient through ``rezero``: zero where it filled (per-head invisible keys, dead rows)."""
    if masks.keep is not None and masks.keep.shape[1] != 1:
        g = g.masked_fill(~masks.keep, 0.0)
    if masks.dead is not None:
        g = g.masked_fill(masks.dead, 0.0)
    return g


def _block_masks(masks: Masks, rows: slice, cols: int) -> Masks:
    """The masks restricted to query rows ``rows`` and keys [0, cols) (broadcast axes kept)."""

    def pick(t, key_axis=True):
        if t is None:
            return None
        t = t if t.shape[-2] == 1 else t[..., rows, :]
        return t if not key_axis or t.shape[-1] == 1 else t[..., :cols]

    return Masks(pick(masks.keep), pick(masks.bias), pick(masks.dead, False), masks.padding, masks.causal,
                 masks.causal_only)


def _forward_blocks(q, k, v, masks, pre_s, post_s, chunk, drop_p, mix, rz, save, store=None, scratch=None):
    """The blocks of query rows; with ``save``, per block the softmax output w and the dropout keep mask (or None).
    ``store``: packed [B,H,T,S] outputs the saved blocks are written into; ``scratch`` (a workspace's): where the
    block temporaries go (the logits "a", the pre-mixed logits "b", the post-mixed weights "c").

    Nothing else is kept for backward: it recomputes the logits (a GEMM) and the mixes. Every saved byte is fresh
    memory on each step (page faults on first touch), which costs more than recomputing from q, k and w."""
    B, H, T, dh = q.shape
    S = k.shape[2]
    out = q.new_empty(B, H, T, v.shape[-1])
    saved, offset = [], 0
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(t0 + chunk, T))
        cols = _key_cols(masks, rows, S)
        m = _block_masks(masks, rows, cols)
        a0 = _qk(q[:, :, rows], k[:, :, :cols], scratch, "a")  # (B, H, c, S')
        lib = _fused_lib(pre_s, post_s, a0, m, drop_p, mix, rz)
        if lib is not None:  # one native pass per row: pre-mix, mask, softmax, post-mix
            w = (_slot(store[0], offset, a0.shape) if save and store is not None
                 else _take(scratch, "b", a0) if not save and scratch is not None else torch.empty_like(a0))
            p = _fused_forward(lib, pre_s, post_s, a0, m, rows, w, _take(scratch, "c", a0))
        else:
            logits, low_pre = (_stage_forward(pre_s, a0, rows, cols, mix, _take(scratch, "b", a0))
                               if pre_s is not None else (a0, None))
            # finite negative after the pre-mix: nothing -inf is ever mixed
            logits = _mask_(logits, m, torch.finfo(logits.dtype).min)
            w = (_softmax_into(logits, _slot(store[0], offset, logits.shape)) if save and store is not None
                 else _softmax_rows(logits))  # (B, H, c, S')
            p = rz(_stage_forward(post_s, w, rows, cols, mix, _take(scratch, "c", w))[0] if post_s is not None
                   else w, m)
        keep = None
        if drop_p:
            keep = torch.empty(p.shape, dtype=p.dtype, device=p.device).bernoulli_(1.0 - drop_p)  # nn.Dropout's
            p = p * keep * (1.0 / (1.0 - drop_p))
            keep = keep.bool() if save else None
        out[:, :, rows] = _head_matmul(p, v[:, :, :cols])
        if save:
            if store is not None:  # the custom op's packed outputs: each block's slot, written as it is done
                slot = _slot(store[0], offset, w.shape)
                w = slot if w.data_ptr() == slot.data_ptr() else slot.copy_(w)
                keep = None if keep is None else _slot(store[1], offset, keep.shape).copy_(keep)
                offset += w.numel()
            saved.append((w, keep))
    return out, saved


def mixed_attention(q: Tensor, k: Tensor, v: Tensor, masks: Masks, pre: MixStage | None, pre_tensors: list,
                    post: MixStage | None, post_tensors: list, *, chunk: int, dropout: float, mix=mix_heads,
                    rezero_fn=rezero, workspace: Workspace | None = None) -> Tensor:
    """Head-mixed attention core: q [B,H,T,dh] (pre-scaled), k [B,H,S,dh], v [B,H,S,dv] -> [B,H,T,dv].

    ``mix`` and ``rezero_fn`` are the caller's static head mix and re-zeroing (THA passes its module's own, which
    its tests patch). ``dropout`` is the attention-dropout probability in effect (0 in eval). Under autocast the
    whole core runs in autocast's dtype with autocast off (``autocast_cast``): its backward, which autocast does
    not reach, recomputes the mixes in the forward's dtype. Off the CPU (or inside ``batched_core()``) the core is
    the batched one, eager and under torch.compile alike.
    """
    if autocast_enabled(q.device.type):
        n_pre = len(pre_tensors)
        q, k, v, *tensors = autocast_cast(q, k, v, *pre_tensors, *post_tensors)
        with autocast_off(q.device.type):
            return mixed_attention(q, k, v, masks, pre, tensors[:n_pre], post, tensors[n_pre:], chunk=chunk,
                                   dropout=dropout, mix=mix, rezero_fn=rezero_fn, workspace=workspace)
    if workspace is not None and (torch.compiler.is_compiling() or _observed()):
        workspace = None  # compiled: the custom op; counted or traced: the plain ops, not their out= forms
    batched = use_batched(q.device)
    pre_s, post_s = _prepare(pre, pre_tensors, not batched), _prepare(post, post_tensors, not batched)
    if batched:  # off the CPU: a few large kernels instead of the blocked loops' many small ones
        return batched_attention(q, k, v, masks, pre_s, post_s, dropout, mix, rezero_fn)
    if torch.compiler.is_compiling():  # one opaque op in the graph (see _core_op): nothing unrolled
        return _compiled_core(q, k, v, masks, pre_s, post_s, chunk, dropout)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tensors = [*(pre_s.tensors if pre_s else ()), *(post_s.tensors if post_s else ())]
    cfg = (None if pre_s is None else pre_s.copy, None if post_s is None else post_s.copy, chunk, dropout, mix,
           rezero_fn)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *tensors) if t is not None):
        return _MixedAttention.apply(cfg, workspace, masks, q, k, v, *tensors)
    with workspace.scratch() if workspace is not None else contextlib.nullcontext() as scratch:
        return _forward_blocks(q, k, v, masks, pre_s, post_s, chunk, dropout, mix, rezero_fn, save=False,
                               scratch=scratch)[0]


# ---- the core as one custom op (torch.compile) -----------------------------------------------------------------
# Under torch.compile the Function above would be traced: dynamo inlines its forward and backward, unrolling the
# block loop and the per-batch / per-plane loops inside it into thousands of small graph nodes (about 400 forward
# and 950 backward nodes per block), which inductor then runs as separate kernels, slower than eager. As a custom
# op (forward and backward each one node whose implementation is the blocked eager code) the graph stays small
# and independent of T, nothing in it breaks or recompiles on the block count, and inductor compiles everything
# around the core (projections, the generator, the per-row matrices). The op saves the blocks' softmax outputs
# packed into one [B,H,T,S] tensor (and the dropout keep mask) as extra outputs for its backward op.

_N_STAGE = 5  # tensors per stage in the op's signature: qmat, mixmat, k1, k2, kdd


def _slot(store: Tensor, offset: int, shape) -> Tensor:
    """A block's contiguous slot in a packed [B,H,T,S] output: blocks lie one after another (a causal block is
    narrower than S), so every saved block is a contiguous tensor, as in the eager path."""
    n = math.prod(shape)
    return store.view(-1)[offset : offset + n].view(shape)


def _op_masks(keep, bias, dead, causal: bool) -> Masks:
    """The op's masks. A compiled graph cannot test for dead rows (data-dependent), so ``resolve_masks`` always hands
    it a ``dead`` tensor; inside the op the test is cheap, and dropping an all-False one restores the eager path's
    causal skip of invisible keys (``_key_cols``)."""
    if dead is not None and not bool(dead.any()):
        dead = None
    return Masks(keep, bias, dead, None, causal, False)


def _op_stages(flags: list[int], tensors) -> tuple[_Stage | None, _Stage | None]:
    """flags [pre, post]: -1 for an absent stage, else its ``copy`` flag as 0/1."""
    pre = None if flags[0] < 0 else bool(flags[0])
    post = None if flags[1] < 0 else bool(flags[1])
    present = [t for i, t in enumerate(tensors) if (pre is not None if i < _N_STAGE else post is not None)]
    return _stages(pre, post, present)


@torch.library.custom_op("attention_zoo::mixed_attention_core", mutates_args=())
def _core_op(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, bias: Tensor | None, dead: Tensor | None,
             causal: bool, flags: list[int], pre_qmat: Tensor | None, pre_mixmat: Tensor | None,
             pre_k1: Tensor | None, pre_k2: Tensor | None, pre_kdd: Tensor | None, post_qmat: Tensor | None,
             post_mixmat: Tensor | None, post_k1: Tensor | None, post_k2: Tensor | None, post_kdd: Tensor | None,
             chunk: int, dropout: float) -> tuple[Tensor, Tensor, Tensor]:
    """(out [B,H,T,dv], the softmax outputs [B,H,T,S], the dropout keep mask [B,H,T,S] or an empty tensor)."""
    tensors = (pre_qmat, pre_mixmat, pre_k1, pre_k2, pre_kdd, post_qmat, post_mixmat, post_k1, post_k2, post_kdd)
    pre_s, post_s = _op_stages(flags, tensors)
    masks = _op_masks(keep, bias, dead, causal)
    B, H, T, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    w_all = q.new_empty(B, H, T, S)  # the blocks one after another (``_slot``); causal ones fill a prefix
    keep_all = q.new_empty(B, H, T, S, dtype=torch.bool) if dropout else q.new_empty(0, dtype=torch.bool)
    out, _ = _forward_blocks(q, k, v, masks, pre_s, post_s, chunk, dropout, mix_heads, rezero, save=True,
                             store=(w_all, keep_all))
    return out, w_all, keep_all


@_core_op.register_fake
def _(q, k, v, keep, bias, dead, causal, flags, *rest):
    *_, chunk, dropout = rest
    B, H, T, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    keep_shape = (B, H, T, S) if dropout else (0,)
    return (q.new_empty(B, H, T, v.shape[-1]), q.new_empty(B, H, T, S), q.new_empty(keep_shape, dtype=torch.bool))


@torch.library.custom_op("attention_zoo::mixed_attention_core_backward", mutates_args=())
def _core_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, bias: Tensor | None,
                      dead: Tensor | None, causal: bool, flags: list[int], pre_qmat: Tensor | None,
                      pre_mixmat: Tensor | None, pre_k1: Tensor | None, pre_k2: Tensor | None,
                      pre_kdd: Tensor | None, post_qmat: Tensor | None, post_mixmat: Tensor | None,
                      post_k1: Tensor | None, post_k2: Tensor | None, post_kdd: Tensor | None, chunk: int,
                      dropout: float, w_all: Tensor, keep_all: Tensor) -> list[Tensor]:
    """[gq, gk, gv, then one gradient per stage tensor slot (an empty tensor where the slot is None)]."""
    tensors = (pre_qmat, pre_mixmat, pre_k1, pre_k2, pre_kdd, post_qmat, post_mixmat, post_k1, post_k2, post_kdd)
    pre_s, post_s = _op_stages(flags, tensors)
    masks = _op_masks(keep, bias, dead, causal)
    T, S = q.shape[2], k.shape[2]
    blocks, offset, B, H = [], 0, q.shape[0], q.shape[1]
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(t0 + chunk, T))
        shape = (B, H, rows.stop - rows.start, _key_cols(masks, rows, S))
        blocks.append((_slot(w_all, offset, shape), _slot(keep_all, offset, shape) if dropout else None))
        offset += math.prod(shape)
    grads = _backward_blocks(grad_out, q, k, v, masks, pre_s, post_s, chunk, dropout, mix_heads, rezero, blocks)
    it = iter(grads[3:])
    slots = []
    for i in range(len(tensors)):
        stage_on = flags[0 if i < _N_STAGE else 1] >= 0
        g = next(it) if stage_on else None
        slots.append(q.new_empty(0) if g is None else g)
    return [*grads[:3], *slots]


@_core_backward_op.register_fake
def _(grad_out, q, k, v, keep, bias, dead, causal, flags, *rest):
    tensors = rest[:2 * _N_STAGE]
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            *[q.new_empty(0) if t is None else torch.empty_like(t) for t in tensors]]


def _core_setup_context(ctx, inputs, output):
    ctx.inputs = inputs[3:]  # everything but q, k, v: masks, flags, stage tensors, chunk, dropout
    ctx.save_for_backward(inputs[0], inputs[1], inputs[2], output[1], output[2])


def _core_op_backward(ctx, grad_out, _grad_w, _grad_keep):
    q, k, v, w_all, keep_all = ctx.saved_tensors
    rest = ctx.inputs
    grads = _core_backward_op(grad_out, q, k, v, *rest, w_all, keep_all)
    tensors = rest[5 : 5 + 2 * _N_STAGE]
    slots = [None if t is None else g for t, g in zip(tensors, grads[3:])]
    return (*grads[:3], None, None, None, None, None, *slots, None, None)


_core_op.register_autograd(_core_op_backward, setup_context=_core_setup_context)


def _compiled_core(q, k, v, masks: Masks, pre_s: _Stage | None, post_s: _Stage | None, chunk: int,
                   dropout: float) -> Tensor:
    """``mixed_attention`` under torch.compile: the blocked core as ``attention_zoo::mixed_attention_core``. It
    runs the module's default mix and re-zeroing (``mix_heads``, ``rezero``), not the caller's hooks."""
    flags = [-1 if pre_s is None else int(pre_s.copy), -1 if post_s is None else int(post_s.copy)]
    none = (None,) * _N_STAGE
    tensors = [*(pre_s.tensors if pre_s else none), *(post_s.tensors if post_s else none)]
    return _core_op(q.contiguous(), k.contiguous(), v.contiguous(), masks.keep, masks.bias, masks.dead, masks.causal,
                    flags, *tensors, chunk, dropout)[0]
