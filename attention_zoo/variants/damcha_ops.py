"""DAMCHA's tensor operations below the generator module: the context (token means), the per-head queries
q_i = X_i m_i, the block-scale matrix, the fused RowSum layer (``fold_rowsum``, ``FoldRowSum``, ``_RowSumLinear``),
the shared gradient buffer of a causal stack's stored per-position metrics (``SharedMetricGrad``) and the storage
that the generator's large gradients are written into step after step (``GradStorage``). docs/variants.md §7.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable


class GradStorage:
    """Memory for a large per-step gradient that outlives the step (held by the module that makes it).

    The generator's final layer has D²·w weights (134 MB at D = 256, w = 512), and the fold's backward writes its
    whole gradient every step. Made afresh, such a block is mapped by the C library and faulted in by the kernel on
    first touch each step, which on a virtual machine costs several times the arithmetic. Here the backward writes
    into this storage and returns a tensor over it; autograd hands that tensor to the parameter's ``.grad`` without
    a copy, so after ``zero_grad(set_to_none=True)`` the next step writes the same pages again. Whenever anything
    else still holds the storage (a ``.grad`` kept for accumulation, a tensor the caller kept), the backward gets a
    fresh block instead, so no live tensor is ever overwritten. Values are unchanged.
    """

    enabled = True  # class-wide switch (tests compare both paths)

    def __init__(self):
        self.storage: torch.UntypedStorage | None = None

    def __deepcopy__(self, memo):  # a copied module gets its own (the copy's gradients are its own)
        return GradStorage()

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.storage = None

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialised tensor of ``shape`` over the kept storage when no one else holds it, else fresh."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        s = self.storage
        if not self.enabled:
            return torch.empty(shape, dtype=dtype, device=device)
        if s is not None and torch._C._storage_Use_Count(s._cdata) > 1:
            return torch.empty(shape, dtype=dtype, device=device)  # the last one is still in use: leave it
        if s is None or s.nbytes() != nbytes or s.device != torch.device(device):
            self.storage = s = torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()
        return torch.empty(0, dtype=dtype, device=device).set_(s, 0, shape)


class SharedMetricGrad:
    """One gradient buffer for per-position metrics m [B,T,H,dh,dh] that every layer of a causal stack reads.

    Through plain autograd each layer's query product q_l = x_l m returns its own ∂L/∂m = x_lᵀ g_l (a fresh
    B·T·D·dh tensor per layer, page-faulted in and then summed by the engine). Here each layer's backward adds its
    outer products into this one buffer in place, and the stack's single ``_MetricGradCollect`` node hands the sum
    to m once every layer has run: the autograd graph orders it (each layer's ``_PositionQueries`` node consumes
    the collector's token, so the collector's backward runs after all of them). Same sum, in backward order.
    """

    def __init__(self, metrics: Tensor, storage: GradStorage | None = None):
        self.buffer: Tensor | None = None
        self.storage = storage or GradStorage()
        self.metrics = metrics.detach()
        self.token = _MetricGradCollect.apply(metrics, self)  # a 0-dim tensor every layer's queries depend on

    def queries(self, xh: Tensor) -> Tensor:
        """q_i = X_i m_i for a layer's raw slices xh [B,H,T,dh]."""
        return _PositionQueries.apply(xh, self.metrics, self.token, self)

    def add(self, xh: Tensor, g: Tensor) -> None:
        x5, g5 = xh.transpose(1, 2).unsqueeze(-1), g.transpose(1, 2).unsqueeze(-2)  # (B,T,H,dh,1), (B,T,H,1,dh)
        if self.buffer is None:  # contiguous, as the final layer's backward GEMMs read it
            out = self.storage.empty(tuple(self.metrics.shape), self.metrics.dtype, self.metrics.device)
            self.buffer = torch.mul(x5, g5, out=out)
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


def _expand_rows(rows: Tensor, S: Tensor | None, out: Tensor) -> None:
    """out[i, a, j, c, ...] = S[i, j] · rows[i, a, c, ...] (S = 1: a copy), one block row i at a time."""
    H = out.shape[0]
    for i in range(H):
        r = rows[i].unsqueeze(1)  # (dh(a), 1, dh(c), ...)
        if S is None:
            out[i].copy_(r.expand_as(out[i]))
        else:
            torch.mul(r, S[i].view(1, H, *([1] * (r.dim() - 2))), out=out[i])


class FoldRowSum(torch.autograd.Function):
    """``fold_rowsum`` with its weight gradient written into the generator's ``GradStorage`` (autograd would expand
    the folded gradient over the block columns j into a fresh D²·w block every step). Same values and gradients."""

    @staticmethod
    def forward(ctx, W: Tensor, b: Tensor, n_heads: int, scales: Tensor | None, storage: GradStorage):
        ctx.save_for_backward(scales)
        ctx.n_heads, ctx.storage, ctx.w_meta = n_heads, storage, (W.shape, W.dtype, W.device)
        return fold_rowsum(W, b, n_heads, scales)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_w: Tensor, g_b: Tensor):
        (scales,), H = ctx.saved_tensors, ctx.n_heads
        shape, dtype, device = ctx.w_meta
        D = math.isqrt(shape[0])
        dh, w = D // H, shape[1]
        grad_W = ctx.storage.empty((H, dh, H, dh, w), dtype, device)
        _expand_rows(g_w.reshape(H, dh, dh, w), scales, grad_W)  # (H(i), dh(a), dh(c), w) -> over j
        grad_b = g_b.new_empty(H, dh, H, dh)
        _expand_rows(g_b.reshape(H, dh, dh), scales, grad_b)
        return grad_W.view(shape), grad_b.flatten(), None, None, None


class _RowSumLinear(torch.autograd.Function):
    """m = z W′ᵀ + b′ with (W′, b′) = ``fold_rowsum(W, b, H, S)``; z [n, w] -> m [n, H·dh·dh].

    Same values and gradients as autograd through the fold, minus one full-size intermediate: autograd forms the
    folded gradient ∂W′ = gᵀz (H·dh·dh × w, freshly allocated) and then expands it over the block columns j into
    ∂W (D² × w). Here ∂W′ is formed one block row i at a time (w·dh² values, reused by the allocator) and expanded
    straight into ∂W, so the only large write is ∂W itself.
    """

    @staticmethod
    def forward(ctx, z: Tensor, W: Tensor, b: Tensor, n_heads: int, scales: Tensor | None,
                storage: GradStorage | None = None) -> Tensor:
        Wf, bf = fold_rowsum(W, b, n_heads, scales)  # (H*dh*dh, w), (H*dh*dh,)
        ctx.save_for_backward(z, Wf, scales)
        ctx.n_heads, ctx.storage = n_heads, storage or GradStorage()
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
        grad_W = ctx.storage.empty((H, dh, H, dh, w), z.dtype, z.device)  # (H(i), dh(a), H(j), dh(c), w)
        for i in range(H):
            rows = (g4[:, i].T @ z).view(dh, 1, dh, w)  # ∂W′ of block row i: (dh(a), 1, dh(c), w)
            if scales is None:
                grad_W[i].copy_(rows.expand(dh, H, dh, w))
            else:
                torch.mul(rows, S[i].view(1, H, 1, 1), out=grad_W[i])
        grad_b = (g.sum(0).reshape(H, dh, 1, dh) * S[:, None, :, None]).flatten()  # (D²,)
        return grad_z, grad_W.view(H * dh * H * dh, w), grad_b, None, None, None
