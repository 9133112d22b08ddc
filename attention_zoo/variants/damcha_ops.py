"""DAMCHA's tensor operations below the generator module: the context (token means), the per-head queries
q_i = X_i m_i, the block-scale matrix, the fused RowSum layer (``fold_rowsum``, ``_RowSumLinear``) and the shared
gradient buffer of a causal stack's stored per-position metrics (``SharedMetricGrad``). docs/variants.md §7.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


class SharedMetricGrad:
    """One gradient buffer for per-position metrics m [B,T,H,dh,dh] that every layer of a causal stack reads.

    Through plain autograd each layer's query product q_l = x_l m returns its own ∂L/∂m = x_lᵀ g_l (a fresh
    B·T·D·dh tensor per layer, page-faulted in and then summed by the engine). Here each layer's backward adds its
    outer products into this one buffer in place, and the stack's single ``_MetricGradCollect`` node hands the sum
    to m once every layer has run: the autograd graph orders it (each layer's ``_PositionQueries`` node consumes
    the collector's token, so the collector's backward runs after all of them). Same sum, in backward order.
    """

    def __init__(self, metrics: Tensor):
        self.buffer: Tensor | None = None
        self.metrics = metrics.detach()
        self.token = _MetricGradCollect.apply(metrics, self)  # a 0-dim tensor every layer's queries depend on

    def queries(self, xh: Tensor) -> Tensor:
        """q_i = X_i m_i for a layer's raw slices xh [B,H,T,dh]."""
        return _PositionQueries.apply(xh, self.metrics, self.token, self)

    def add(self, xh: Tensor, g: Tensor) -> None:
        x5, g5 = xh.transpose(1, 2).unsqueeze(-1), g.transpose(1, 2).unsqueeze(-2)  # (B,T,H,dh,1), (B,T,H,1,dh)
        if self.buffer is None:  # contiguous, as the final layer's backward GEMMs read it
            self.buffer = torch.mul(x5, g5, out=torch.empty_like(self.metrics, memory_format=torch.contiguous_format))
        else:
            self.buffer.addcmul_(x5, g5)

    def take(self) -> Tensor | None:
        buffer, self.buffer = self.buffer, None
        return buffer


class _MetricGradCollect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, metrics: Tensor, sink: SharedMetricGrad) -> Tensor:
        ctx.sink = sink
        return metrics.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, _g: Tensor):
        return ctx.sink.take(), None


class _PositionQueries(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xh: Tensor, metrics: Tensor, token: Tensor, sink: SharedMetricGrad) -> Tensor:
        ctx.save_for_backward(xh, metrics)
        ctx.sink = sink
        return head_queries(xh, metrics)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        xh, metrics = ctx.saved_tensors
        grad_x = head_queries(g, metrics.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        ctx.sink.add(xh, g)
        return grad_x, None, torch.zeros((), dtype=g.dtype, device=g.device), None


def token_context(x: Tensor, padding_mask: Tensor | None, causal: bool) -> Tensor:
    """Mean over real tokens [B,D], or causal prefix means [B,T,D]; padding joins neither."""
    if padding_mask is not None:
        x = x.masked_fill(~padding_mask[..., None], 0.0)
        count = padding_mask.to(x.dtype)  # (B, T)
    else:
        count = x.new_ones(x.shape[:2])
    if causal:
        return x.cumsum(1) / count.cumsum(1).clamp(min=1.0)[..., None]  # (B, T, D)
    return x.sum(1) / count.sum(1).clamp(min=1.0)[:, None]  # (B, D)


def block_scale_matrix(n_heads: int, diag: float, off: float, like: Tensor) -> Tensor:
    """S[i, j] = diag if i == j else off, shape [H, H]."""
    eye = torch.eye(n_heads, dtype=like.dtype, device=like.device)
    return off + (diag - off) * eye


def head_queries(xh: Tensor, m: Tensor) -> Tensor:
    """q_i = X_i m_i. xh [B,H,T,dh]; m [B,H,dh,dh] (per sequence) or [B,T,H,dh,dh] (per position)."""
    if m.dim() == 4:
        return xh @ m  # (B, H, T, dh)
    # A batched matmul on a view of m: einsum would copy m (B·T·D·dh values) into its own layout on every call.
    q = xh.transpose(1, 2).unsqueeze(-2) @ m  # (B, T, H, 1, dh)
    return q.squeeze(-2).transpose(1, 2)  # (B, H, T, dh)


def fold_rowsum(W: Tensor, b: Tensor, n_heads: int, scales: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Sum a D²-row affine layer over block columns j (optionally weighted by S[i, j]) -> H·dh·dh rows."""
    D = math.isqrt(W.shape[0])
    H, dh = n_heads, D // n_heads
    W5 = W.unflatten(0, (H, dh, H, dh))  # (H, dh, H, dh, w)
    b4 = b.unflatten(0, (H, dh, H, dh))  # (H, dh, H, dh)
    if scales is None:
        return W5.sum(2).flatten(0, 2), b4.sum(2).flatten()
    return torch.einsum("iajck,ij->iack", W5, scales).flatten(0, 2), torch.einsum("iajc,ij->iac", b4, scales).flatten()


class _RowSumLinear(torch.autograd.Function):
    """m = z W′ᵀ + b′ with (W′, b′) = ``fold_rowsum(W, b, H, S)``; z [n, w] -> m [n, H·dh·dh].

    Same values and gradients as autograd through the fold, minus one full-size intermediate: autograd forms the
    folded gradient ∂W′ = gᵀz (H·dh·dh × w, freshly allocated) and then expands it over the block columns j into
    ∂W (D² × w). Here ∂W′ is formed one block row i at a time (w·dh² values, reused by the allocator) and expanded
    straight into ∂W, so the only large write is ∂W itself.
    """

    @staticmethod
    def forward(ctx, z: Tensor, W: Tensor, b: Tensor, n_heads: int, scales: Tensor | None) -> Tensor:
        Wf, bf = fold_rowsum(W, b, n_heads, scales)  # (H*dh*dh, w), (H*dh*dh,)
        ctx.save_for_backward(z, Wf, scales)
        ctx.n_heads = n_heads
        return F.linear(z, Wf, bf)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        z, Wf, scales = ctx.saved_tensors
        H, n, w = ctx.n_heads, z.shape[0], z.shape[1]
        dh = math.isqrt(Wf.shape[0] // H)
        grad_z = g @ Wf if ctx.needs_input_grad[0] else None
        g4 = g.reshape(n, H, dh * dh)  # (n, H(i), dh(a)*dh(c))
        S = torch.ones(H, H, dtype=g.dtype, device=g.device) if scales is None else scales
        grad_W = z.new_empty(H, dh, H, dh, w)  # (H(i), dh(a), H(j), dh(c), w)
        for i in range(H):
            rows = (g4[:, i].T @ z).view(dh, 1, dh, w)  # ∂W′ of block row i: (dh(a), 1, dh(c), w)
            if scales is None:
                grad_W[i].copy_(rows.expand(dh, H, dh, w))
            else:
                torch.mul(rows, S[i].view(1, H, 1, 1), out=grad_W[i])
        grad_b = (g.sum(0).reshape(H, dh, 1, dh) * S[:, None, :, None]).flatten()  # (D²,)
        return grad_z, grad_W.view(H * dh * H * dh, w), grad_b, None, None
