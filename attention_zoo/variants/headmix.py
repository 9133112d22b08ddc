"""Attention whose logits and weights are mixed across heads (THA, DCMHA ``paper``), chunked over queries.

``mixed_attention`` runs logits = q kᵀ -> pre-mix -> mask -> softmax -> post-mix -> re-zero -> dropout -> ·V in
blocks of query rows inside one autograd Function. Only q, k, v, the mixing weights and the softmax output of each
block are saved; the logits and the post-mixed weights are recomputed in backward (one GEMM and one mix pass).
That keeps one [B,H,T,S] tensor per layer alive instead of four, and every temporary is a block, small enough to
stay in the allocator's cache instead of being page-faulted in as a fresh mmap each time. Under causality the
block of rows [t0, t1) only reads keys [0, t1): the later keys are invisible to every head, so their weights are
exactly 0 before and after any linear head mix, and they contribute nothing to values or gradients.

A mixing stage (``MixStage``) is DCMHA's ``Compose`` over the head axis at every (t, s):
out = [a] + static·a + Σ_r w2_q[t,r] <w1_q[t,r], a> + Σ_r w2_k[s,r] <w1_k[s,r], a> + (dd_q[t] + dd_k[s]) ⊙ a,
with the identity branch optional (THA's mixes are a plain static H×H matrix). Its backward with respect to a is
the same map with w1 and w2 swapped and the static matrix transposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import Masks


def mix_heads(weight: Tensor, a: Tensor) -> Tensor:
    """out[b,o,t,s] = sum_i weight[o,i] a[b,i,t,s]: one GEMM per batch on the contiguous [H, T*S] view.

    An explicit bmm: ``weight @ a`` would fold the batch into a [B*T*S, H] GEMM with two transposed copies.
    """
    B, H, T, S = a.shape
    return torch.bmm(weight.expand(B, H, H), a.reshape(B, H, T * S)).view(B, H, T, S)  # (B, H, T, S)


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


def _matmul_into(dst: Tensor, a: Tensor, b: Tensor) -> None:
    """``dst = a @ b`` without a temporary in eager mode; torch.compile cannot write into a strided ``out=`` view
    (a graph break), so it gets the copy."""
    if torch.compiler.is_compiling():
        dst.copy_(torch.matmul(a, b))
    else:
        torch.matmul(a, b, out=dst)


def _proj_query(a: Tensor, w: Tensor) -> Tensor:
    """low[b,t,r,s] = Σ_h w[b,t,r,h] a[b,h,t,s]; a [B,H,c,S], w [B,c,R,H] -> [B,c,R,S] (a GEMM per batch row)."""
    B, _, c, S = a.shape
    out = a.new_empty(B, c, w.shape[2], S)
    for b in range(B):  # a[b] viewed [c, H, S] is a strided batch BLAS takes as is: no copy of a
        _matmul_into(out[b], w[b], a[b].transpose(0, 1))
    return out


def _expand_query_(out: Tensor, low: Tensor, w: Tensor) -> None:
    """out[b,h,t,s] += Σ_r w[b,t,r,h] low[b,t,r,s] in place."""
    for b in range(out.shape[0]):
        out[b].transpose(0, 1).add_(torch.matmul(w[b].transpose(1, 2), low[b]))  # (c, H, S)


def _proj_key(a: Tensor, w: Tensor) -> Tensor:
    """low[b,r,t,s] = Σ_h w[b,s,r,h] a[b,h,t,s] -> [B,R,c,S].

    Elementwise over the H planes: the contraction is diagonal in s, so a GEMM would need a transposed copy of a,
    which costs more than the whole product (a transpose of [B,H,c,S] is cache-hostile).
    """
    wt = w.permute(0, 2, 3, 1).contiguous()  # (B, R, H, S): unit stride along s for the broadcasts
    R, H = wt.shape[1], wt.shape[2]
    out = a.new_empty(a.shape[0], R, a.shape[2], a.shape[3])
    for r in range(R):
        acc = out[:, r]  # (B, c, S)
        if torch.compiler.is_compiling():  # no strided out= under torch.compile (see _matmul_into)
            acc.copy_(a[:, 0] * wt[:, r, 0, None, :])
        else:
            torch.mul(a[:, 0], wt[:, r, 0, None, :], out=acc)
        for h in range(1, H):
            acc.addcmul_(a[:, h], wt[:, r, h, None, :])
    return out


def _expand_key_(out: Tensor, low: Tensor, w: Tensor) -> None:
    """out[b,h,t,s] += Σ_r w[b,s,r,h] low[b,r,t,s] in place."""
    wt = w.permute(0, 2, 3, 1).contiguous()  # (B, R, H, S): unit stride along s for the broadcasts
    for h in range(out.shape[1]):
        o = out[:, h]  # (B, c, S)
        for r in range(wt.shape[1]):
            o.addcmul_(low[:, r], wt[:, r, h, None, :])


def _compose(a: Tensor, stage: MixStage, static, qw, kw, rows: slice, cols: int, mix, keep_lows: bool = False,
             need_out: bool = True):
    """One mixing stage on a block a [B,H,c,S'] (query rows ``rows``, keys [0, cols)).

    Returns (out, low_q, low_k): the low-rank projections are returned when ``keep_lows`` (for the weight gradients).
    """
    low_q = low_k = None
    if qw is not None and (keep_lows or need_out):
        low_q = _proj_query(a, qw[0][:, rows])
    if kw is not None and (keep_lows or need_out):
        low_k = _proj_key(a, kw[0][:, :cols])
    if not need_out:
        return None, low_q, low_k
    out = mix(static, a) if static is not None else None
    if stage.identity:
        out = a.clone() if out is None else out.add_(a)
    elif out is None:
        out = torch.zeros_like(a)
    if qw is not None:
        _expand_query_(out, low_q, qw[1][:, rows])
        out.addcmul_(a, qw[2][:, rows].transpose(1, 2)[..., None])  # query gate (B, H, c, 1)
    if kw is not None:
        _expand_key_(out, low_k, kw[1][:, :cols])
        out.addcmul_(a, kw[2][:, :cols].transpose(1, 2).contiguous()[:, :, None, :])  # key gate (B, H, 1, S')
    return out, (low_q if keep_lows else None), (low_k if keep_lows else None)


def _compose_backward(a: Tensor, g: Tensor, stage: MixStage, static, qw, kw, rows: slice, cols: int, mix,
                      lows, grads: list) -> Tensor:
    """∂/∂a of one stage (the transposed map) and the weight gradients, accumulated into ``grads`` (stage order)."""
    swapped_q = None if qw is None else (qw[1], qw[0], qw[2])
    swapped_k = None if kw is None else (kw[1], kw[0], kw[2])
    static_t = None if static is None else static.transpose(0, 1)
    g_a, g_low_q, g_low_k = _compose(g, stage, static_t, swapped_q, swapped_k, rows, cols, mix, keep_lows=True)
    low_q, low_k = lows
    i = 0
    if static is not None:
        B, H = a.shape[:2]
        gs = torch.bmm(g.reshape(B, H, -1), a.reshape(B, H, -1).transpose(1, 2)).sum(0)  # (H_out, H_in)
        grads[i] = gs if grads[i] is None else grads[i] + gs
        i += 1
    ga = g * a if (qw is not None or kw is not None) else None
    if qw is not None:
        gw1, gw2, gdd = grads[i : i + 3]
        for b in range(a.shape[0]):  # Σ_s over the block's keys: [c, R, S'] @ [c, S', H]
            _matmul_into(gw1[b, rows], g_low_q[b], a[b].permute(1, 2, 0))
            _matmul_into(gw2[b, rows], low_q[b], g[b].permute(1, 2, 0))
        gdd[:, rows] = ga.sum(-1).transpose(1, 2)  # (B, c, H)
        i += 3
    if kw is not None:
        gw1, gw2, gdd = grads[i : i + 3]
        for r in range(low_k.shape[1]):  # Σ_t as broadcast products: an einsum would transpose the whole block
            gw1[:, :cols, r] += (a * g_low_k[:, r, None]).sum(2).transpose(1, 2)  # (B, S', H)
            gw2[:, :cols, r] += (g * low_k[:, r, None]).sum(2).transpose(1, 2)
        gdd[:, :cols] += ga.sum(2).transpose(1, 2)  # (B, S', H)
    return g_a


class _MixedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cfg, masks: Masks, q: Tensor, k: Tensor, v: Tensor, *tensors: Tensor) -> Tensor:
        pre, post, chunk, drop_p, mix, rz = cfg
        n_pre = 0 if pre is None else pre.n_tensors
        pre_t, post_t = _unpack(pre, tensors[:n_pre]), _unpack(post, tensors[n_pre:])
        out, saved = _forward_blocks(q, k, v, masks, pre, pre_t, post, post_t, chunk, drop_p, mix, rz, save=True)
        ctx.cfg, ctx.masks, ctx.n_pre, ctx.n_blocks = cfg, masks, n_pre, len(saved)
        ctx.save_for_backward(q, k, v, *tensors, *[t for pair in saved for t in pair if t is not None])
        ctx.has_drop = bool(saved) and saved[0][1] is not None
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        pre, post, chunk, drop_p, mix, rz = ctx.cfg
        masks = ctx.masks
        saved = ctx.saved_tensors
        q, k, v = saved[:3]
        n_w = (0 if pre is None else pre.n_tensors) + (0 if post is None else post.n_tensors)
        tensors = saved[3 : 3 + n_w]
        blocks = saved[3 + n_w :]
        step = 2 if ctx.has_drop else 1
        pre_t, post_t = _unpack(pre, tensors[: ctx.n_pre]), _unpack(post, tensors[ctx.n_pre :])
        g_pre = [torch.zeros_like(t) for t in tensors[: ctx.n_pre]]
        g_post = [torch.zeros_like(t) for t in tensors[ctx.n_pre :]]
        gq, gk, gv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        grad_out = grad_out.contiguous()
        T, S = q.shape[2], k.shape[2]
        scale = 1.0 / (1.0 - drop_p) if drop_p else 1.0
        for n, t0 in enumerate(range(0, T, chunk)):
            rows = slice(t0, min(t0 + chunk, T))
            cols = _key_cols(masks, rows, S)
            m = _block_masks(masks, rows, cols)
            w = blocks[n * step]
            keep = blocks[n * step + 1] if ctx.has_drop else None
            q_c, k_c, v_c = q[:, :, rows], k[:, :, :cols], v[:, :, :cols]
            if post is not None:
                p, lq, lk = _compose(w, post, *post_t, rows, cols, mix, keep_lows=True)
            else:
                p, lq, lk = w, None, None
            p = rz(p, m)
            if keep is not None:
                p = p * keep * scale
            g_o = grad_out[:, :, rows]
            gv[:, :, :cols] += p.transpose(-1, -2) @ g_o
            g_p = g_o @ v_c.transpose(-1, -2)  # (B, H, c, S')
            if keep is not None:
                g_p.mul_(keep).mul_(scale)
            g_p = _rezero_grad(g_p, m)
            if post is not None:
                g_p = _compose_backward(w, g_p, post, *post_t, rows, cols, mix, (lq, lk), g_post)
            # softmax backward, in place: g_l = w ⊙ (g - Σ_s g w)
            g_l = g_p.sub_((g_p * w).sum(-1, keepdim=True)).mul_(w)
            if m.dead is not None:  # dead rows had their logits replaced by 0: no gradient
                g_l.masked_fill_(m.dead, 0.0)
            if pre is not None:
                a0 = q_c @ k_c.transpose(-1, -2)  # recomputed logits (B, H, c, S')
                _, lq, lk = _compose(a0, pre, *pre_t, rows, cols, mix, keep_lows=True, need_out=False)
                g_l = _compose_backward(a0, g_l, pre, *pre_t, rows, cols, mix, (lq, lk), g_pre)
            gq[:, :, rows] = g_l @ k_c
            gk[:, :, :cols] += g_l.transpose(-1, -2) @ q_c
        return (None, None, gq, gk, gv, *g_pre, *g_post)


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


def _forward_blocks(q, k, v, masks, pre, pre_t, post, post_t, chunk, drop_p, mix, rz, save):
    B, H, T, dh = q.shape
    S = k.shape[2]
    out = q.new_empty(B, H, T, v.shape[-1])
    saved = []
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(t0 + chunk, T))
        cols = _key_cols(masks, rows, S)
        m = _block_masks(masks, rows, cols)
        logits = q[:, :, rows] @ k[:, :, :cols].transpose(-1, -2)  # (B, H, c, S')
        if pre is not None:
            logits = _compose(logits, pre, *pre_t, rows, cols, mix)[0]
        # finite negative after the pre-mix: nothing -inf is ever mixed
        w = softmax_fp32(m.apply(logits, torch.finfo(logits.dtype).min))  # (B, H, c, S')
        p = rz(_compose(w, post, *post_t, rows, cols, mix)[0] if post is not None else w, m)
        keep = None
        if drop_p:
            keep = torch.empty_like(p).bernoulli_(1.0 - drop_p)  # nn.Dropout's draw
            p = p * keep * (1.0 / (1.0 - drop_p))
            keep = keep.bool() if save else None
        out[:, :, rows] = p @ v[:, :, :cols]
        if save:
            saved.append((w, keep))
    return out, saved


def mixed_attention(q: Tensor, k: Tensor, v: Tensor, masks: Masks, pre: MixStage | None, pre_tensors: list,
                    post: MixStage | None, post_tensors: list, *, chunk: int, dropout: float, mix=mix_heads,
                    rezero_fn=rezero) -> Tensor:
    """Head-mixed attention core: q [B,H,T,dh] (pre-scaled), k [B,H,S,dh], v [B,H,S,dv] -> [B,H,T,dv].

    ``mix`` and ``rezero_fn`` are the caller's static head mix and re-zeroing (THA passes its module's own, which
    its tests patch). ``dropout`` is the attention-dropout probability in effect (0 in eval).
    """
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tensors = [*pre_tensors, *post_tensors]
    cfg = (pre, post, chunk, dropout, mix, rezero_fn)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *tensors)):
        return _MixedAttention.apply(cfg, masks, q, k, v, *tensors)
    pre_t, post_t = _unpack(pre, pre_tensors), _unpack(post, post_tensors)
    return _forward_blocks(q, k, v, masks, pre, pre_t, post, post_t, chunk, dropout, mix, rezero_fn, save=False)[0]
