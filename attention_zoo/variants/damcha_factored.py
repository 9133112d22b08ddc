"""DAMCHA's compact-rank metrics kept as their factors (docs/variants.md §7.4, "factored queries").

With ``compact_rank = r`` the per-head metric is m_i = U_i Vs_iᵀ / √r, U_i = the generator's U rows of head i
[dh, r] and Vs_i = Σ_j S_ij V_j [dh, r] (block scales S; S = 1: the plain sum, the same Vs for every head). A query
needs only q_i = X_i m_i = ((X_i U_i) / √r) Vs_iᵀ: two contractions of width r instead of forming the dh×dh metric.
In the causal decoder the metrics are per position, so forming them costs B·T·H·dh² values (and as many gradient
values, page-faulted in afresh every step) where the factors are 2·B·T·H·dh·r. The factored product is the same
function (float reassociation: float32 bits differ from forming m; tested equal in float64). Measured on one thread
(B=16, T=64, H=4, dh=16, r=4, two layers reading one stack's metrics, fwd+bwd, busy 2-core host): 25 ms formed,
9 ms factored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .base import autocast_enabled


def _factored(xt: Tensor, U: Tensor, Vs: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(a, q): a = (x U)·scale [B,T,H,r], q = a Vsᵀ [B,T,H,dh]; xt [B,T,H,dh], U [B,T,H,dh,r], Vs [B,T,H|1,dh,r]."""
    a = torch.einsum("bthd,bthdr->bthr", xt, U) * scale
    if Vs.shape[2] == 1:  # unit block scales: one Vs for every head
        return a, torch.einsum("bthr,btcr->bthc", a, Vs.squeeze(2))
    return a, torch.einsum("bthr,bthcr->bthc", a, Vs)


class _FactoredQueries(torch.autograd.Function):
    """q = ((x U)·scale) Vsᵀ with a backward of outer products and width-r contractions (autograd's own would run
    batched GEMMs of inner dimension 1 over every (position, head))."""

    @staticmethod
    def forward(ctx, xh: Tensor, U: Tensor, Vs: Tensor, scale: float) -> Tensor:
        a, q = _factored(xh.transpose(1, 2), U, Vs, scale)
        ctx.save_for_backward(xh, U, Vs, a)
        ctx.scale = scale
        return q.transpose(1, 2)  # (B, H, T, dh)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        xh, U, Vs, a = ctx.saved_tensors
        gt = g.transpose(1, 2)  # (B, T, H, dh)
        if Vs.shape[2] == 1:
            ga = torch.einsum("bthc,btcr->bthr", gt, Vs.squeeze(2))
            g_vs = torch.einsum("bthc,bthr->btcr", gt, a).unsqueeze(2)  # summed over the heads that share it
        else:
            ga = torch.einsum("bthc,bthcr->bthr", gt, Vs)
            g_vs = gt.unsqueeze(-1) * a.unsqueeze(-2)
        ga = ga * ctx.scale
        g_u = xh.transpose(1, 2).unsqueeze(-1) * ga.unsqueeze(-2)  # (B, T, H, dh, r)
        g_x = torch.einsum("bthr,bthdr->bthd", ga, U).transpose(1, 2)
        return g_x, g_u, g_vs, None


@dataclass
class FactoredMetrics:
    """Per-position metrics m = U Vsᵀ / √r held as their factors: ``U`` [B, T, H, dh, r], ``Vs`` [B, T, H or 1,
    dh, r] (1: unit block scales, one Vs for every head), ``scale`` = 1/√r."""

    U: Tensor
    Vs: Tensor
    scale: float

    @classmethod
    def from_outputs(cls, out: Tensor, n_heads: int, head_dim: int, rank: int, scales: Tensor | None = None
                     ) -> FactoredMetrics:
        """From the generator's compact output [B, T, 2·D·r] (U then V, each [D, r] = [H, dh, r])."""
        U, V = out.unflatten(-1, (2, n_heads, head_dim, rank)).unbind(-4)  # (B, T, H, dh, r) each
        Vs = V.sum(-3, keepdim=True) if scales is None else torch.einsum("ij,...jcr->...icr", scales, V)
        return cls(U, Vs, 1.0 / math.sqrt(rank))

    def queries(self, xh: Tensor) -> Tensor:
        """q_i = X_i m_i for raw head slices xh [B, H, T, dh] -> [B, H, T, dh]."""
        if autocast_enabled(xh.device.type) or torch.compiler.is_compiling():  # plain ops: autocast casts them
            return _factored(xh.transpose(1, 2), self.U, self.Vs, self.scale)[1].transpose(1, 2)
        return _FactoredQueries.apply(xh, self.U, self.Vs, self.scale)

    def dense(self) -> Tensor:
        """The metrics themselves, [B, T, H, dh, dh] (for analysis and tests)."""
        return self.U @ self.Vs.transpose(-1, -2) * self.scale


__all__ = ["FactoredMetrics"]
