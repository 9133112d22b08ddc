"""The blocked core of the head-mixed attention (``headmix``): logits, masks, softmax and the two mixing stages over
blocks of query rows, inside one autograd Function that saves only the softmax outputs and recomputes the rest in
backward (the module docstring of ``headmix`` says why)."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

from .base import Masks
from .headmix_native import (
    _fused_backward,
    _fused_forward,
    _fused_lib,
    _native_lib,
)
from .headmix_ops import softmax_fp32
from .headmix_stages import (
    _head_matmul,
    _head_matmul_t,
    _key_project,
    _stage_backward,
    _stage_forward,
    _stages,
)
from .headmix_workspace import Workspace


def _slot(store: Tensor, offset: int, shape) -> Tensor:
    """A block's contiguous slot in a packed [B,H,T,S] output: blocks lie one after another (a causal block is
    narrower than S), so every saved block is a contiguous tensor, as in the eager path."""
    n = math.prod(shape)
    return store.view(-1)[offset : offset + n].view(shape)


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


