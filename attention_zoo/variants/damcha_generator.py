"""DAMCHA's metric generator f_θ (``StructuredMLPForM``, paper Eq. 3; variants.md §7.1–7.5).

From a context vector c (the mean of the real tokens, or the causal prefix mean) it generates a D×D metric
M = reshape(f_θ(c)) viewed as H×H blocks M_ij of size d_h×d_h, applies the block scales, and returns the per-head
metrics m_i = Σ_j M_ij (RowSum over block columns, Eq. 4).

Fused RowSum (variants.md §7.4): RowSum is linear, so in ``mlp`` mode it is folded into the final affine layer
(W′ = Σ_j W[(i,a,j,c), :]) and the D² outputs are never built; values and gradients equal the explicit path.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .base import autocast_enabled, check_fraction, check_positive_int
from .damcha_config import _CHUNK_BUDGET, OFF_DIAG_MODES, MetricConfig, MetricContext  # noqa: F401
from .damcha_factored import FactoredMetrics
from .damcha_generator_costs import GeneratorCosts
from .damcha_ops import (  # noqa: F401  (fold_rowsum, _RowSumLinear: also imported from here by callers)
    FoldRowSum,
    GradStorage,
    SharedMetricGrad,
    _RowSumLinear,
    block_scale_matrix,
    fold_rowsum,
    head_queries,
    token_context,
)


class StructuredMLPForM(GeneratorCosts, nn.Module):
    """Metric generator: context -> hidden MLP (Linear, GELU, Dropout)* -> Linear(w_last -> D² or 2·D·r)."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, n_layers: int = 1,
                 config: MetricConfig | None = None, dropout: float = 0.0):
        """``dropout`` is the owning layer's dropout; the hidden layers use it unless ``config.gen_dropout`` is set
        (the authors pass the layer's dropout to the generator)."""
        super().__init__()
        cfg = config or MetricConfig()
        if cfg.gen_dropout is None:
            cfg = replace(cfg, gen_dropout=check_fraction("dropout", dropout))
        self.cfg, self.causal, self.n_layers = cfg, causal, n_layers
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        D, H, dh = d_model, n_heads, self.head_dim
        layers, width = [], D
        for h in cfg.hidden_dims:
            layers += [nn.Linear(width, h), nn.GELU(), nn.Dropout(cfg.gen_dropout)]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.out = nn.Linear(width, 2 * D * cfg.compact_rank if cfg.compact_rank else D * D)
        self.block_scales = (float(cfg.diag_scale), float(cfg.off_diag_scale))
        # where the final layer's weight gradient and the stored metrics' gradient are written each step
        self.grad_storage, self.metric_grad_storage = GradStorage(), GradStorage()
        if cfg.collapsed_generator:
            if self.block_scales != (1.0, 1.0):
                raise ValueError("collapsed_generator: needs unit block scales while training (diag/off_diag_scale)")
            # Initialised from the folded full layer (same random draw), so it starts as the full generator does.
            W, b = fold_rowsum(self.out.weight, self.out.bias, H)
            self.out = nn.utils.skip_init(nn.Linear, width, H * dh * dh)  # no RNG draw: later inits line up
            with torch.no_grad():
                self.out.weight.copy_(W / H)
                self.out.bias.copy_(b / H)
        if cfg.off_diag_mode == "linear_comb":
            self.alpha = nn.Parameter(torch.randn(H, H, H) * cfg.off_diag_alpha_init)
        elif cfg.off_diag_mode == "bayesian":
            self.alpha_mu = nn.Parameter(torch.randn(H, H, H) * cfg.off_diag_alpha_init)
            self.alpha_logvar = nn.Parameter(torch.full((H, H, H), -4.0))
        elif cfg.off_diag_mode == "separate_B":
            self.B = nn.Parameter(torch.randn(H, dh, D) * 0.01)
        if cfg.use_layer_bias:
            r = cfg.layer_bias_rank
            self.bias_U = nn.Parameter(nn.init.orthogonal_(torch.empty(D, r), gain=0.1))
            self.bias_V = nn.Parameter(nn.init.orthogonal_(torch.empty(D, r), gain=0.1))
            std = 0.1 * (1.0 + 0.2 * torch.arange(n_layers, dtype=torch.float32))[:, None]
            self.bias_s = nn.Parameter(torch.randn(n_layers, r) * std)  # s_l ~ N(0, (0.1·(1+0.2·l))²)
        self.aux_loss: Tensor | None = None
        # The causal path's chunks run under activation checkpointing; False keeps the per-chunk metrics in the
        # autograd graph (for inspecting ∂L/∂M; see ``inspectable``). Same values and gradients either way.
        self.checkpoint_chunks = True

    # ---- structure ----------------------------------------------------------------------------------------
    @property
    def metric_mode(self) -> str:
        """The off-diagonal structure that actually shapes M: ``mlp`` whenever ``free_M`` or ``compact_rank`` makes
        the generator's output the metric, else ``off_diag_mode``."""
        c = self.cfg
        return "mlp" if c.free_M or c.compact_rank else c.off_diag_mode

    @property
    def fusable(self) -> bool:
        """RowSum can be taken without building M whenever every block comes from the generator (mlp mode).

        Beyond the authors' fused path (plain output, no layer bias) this covers compact rank,
        m_i = U_i (Σ_j S_ij V_j)ᵀ/√r, and the layer bias, whose RowSum is a constant: same values, no D×D tensor.
        """
        return self.metric_mode == "mlp"

    @property
    def fused(self) -> bool:
        return self.cfg.fused_rowsum and self.fusable

    @property
    def collapsed(self) -> bool:
        return self.cfg.collapsed_generator

    @property
    def out_dim(self) -> int:
        """Outputs of the final layer: D² (full), 2·D·r (compact) or H·dh·dh (collapsed)."""
        c, D = self.cfg, self.d_model
        return D * self.head_dim if c.collapsed_generator else (2 * D * c.compact_rank if c.compact_rank else D * D)

    @property
    def last_width(self) -> int:
        return self.cfg.hidden_dims[-1] if self.cfg.hidden_dims else self.d_model

    def _unit_scales(self) -> bool:
        return self.block_scales == (1.0, 1.0)

    @property
    def runs_per_layer(self) -> bool:
        """The one statement of the rule (docs/variants.md §7.3): with a layer bias each layer runs the generator on
        its own input with its ``layer_idx``, so a shared stack computes nothing ahead. Read by ``stack_context``,
        ``stores_metrics``, the FLOP counts and the layers."""
        return self.cfg.use_layer_bias

    # ---- the generator call ---------------------------------------------------------------------------------
    def prepare(self, x: Tensor, padding_mask: Tensor | None, layer_idx: int | None = None,
                causal: bool | None = None) -> MetricContext:
        """Run context + hidden layers once; metrics follow from ``metric_fn`` (per layer when causal)."""
        causal = self.causal if causal is None else causal
        ctx = token_context(x, padding_mask, causal)
        summary = (ctx[:, -1] if causal else ctx).detach()
        z = self.trunk(ctx)
        alpha = self.sample_alpha()
        if self.cfg.off_diag_mode == "bayesian":
            self.aux_loss = self.cfg.kl_weight * self.kl_divergence()
        metrics = None if causal else self.metric_fn(alpha, layer_idx)(z)
        return MetricContext(summary, z, alpha, metrics)

    def head_metrics(self, x: Tensor, causal: bool | None = None, padding_mask: Tensor | None = None,
                     layer_idx: int | None = None) -> Tensor:
        """Per-head metrics m_i = Σ_j M_ij for the layer input x [B,T,D]: [B,H,dh,dh] from the mean of the real
        tokens, or [B,T,H,dh,dh] from the causal prefix means (``causal`` defaults to the generator's own).

        ``layer_idx`` picks the layer bias (``use_layer_bias``); block scales apply. The causal result holds
        B·T·D·dh values (the layers build it chunk by chunk instead), so it is meant for analysis.

        Raises:
            ValueError: x not a floating [B,T,d_model] tensor, a bad padding_mask, or a layer_idx out of range.
        """
        if not torch.is_tensor(x) or x.dim() != 3 or not x.is_floating_point() or x.shape[-1] != self.d_model:
            got = (tuple(x.shape), x.dtype) if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f"x: expected a floating tensor [B, T, {self.d_model}], got {got}")
        if causal is not None and not isinstance(causal, bool):
            raise ValueError(f"causal: expected a bool, got {causal!r}")
        if padding_mask is not None:
            if not torch.is_tensor(padding_mask) or tuple(padding_mask.shape) != tuple(x.shape[:2]) \
                    or padding_mask.is_floating_point():
                got = (tuple(padding_mask.shape), padding_mask.dtype) if torch.is_tensor(padding_mask) else padding_mask
                raise ValueError(f"padding_mask: expected a bool [B, T] = {tuple(x.shape[:2])} tensor, got {got}")
            padding_mask = padding_mask.to(device=x.device, dtype=torch.bool)
        if layer_idx is not None:
            check_positive_int("layer_idx", layer_idx, allow_zero=True)
            if layer_idx >= self.n_layers:
                raise ValueError(f"layer_idx: expected < n_layers={self.n_layers}, got {layer_idx}")
        ctx = self.prepare(x, padding_mask, layer_idx, causal)
        return ctx.metrics if ctx.metrics is not None else self.metric_fn(ctx.alpha, layer_idx)(ctx.hidden)

    def forward(self, x: Tensor, causal: bool | None = None, padding_mask: Tensor | None = None,
                layer_idx: int | None = None) -> Tensor:
        """Same as :meth:`head_metrics`."""
        return self.head_metrics(x, causal, padding_mask, layer_idx)

    def stack_context(self, x: Tensor, padding_mask: Tensor | None) -> MetricContext | None:
        """The once-per-stack call (None when ``runs_per_layer``: each layer then calls the generator itself)."""
        if self.runs_per_layer:
            return None
        ctx = self.prepare(x, padding_mask)
        if self.stores_metrics and self.factored(None):
            ctx.factors = self.metric_factors(ctx.hidden)  # U, Vs per position, read by every layer
        elif self.stores_metrics:
            ctx.metrics = self.metric_fn(ctx.alpha, None)(ctx.hidden)  # (B, T, H, dh, dh), read by every layer
            if ctx.metrics.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling():
                ctx.metric_grad = SharedMetricGrad(ctx.metrics, self.metric_grad_storage)
        return ctx

    @property
    def stores_metrics(self) -> bool:
        """Whether the stack call precomputes the causal per-position metrics (``metric_cache="store"``)."""
        return self.causal and self.cfg.metric_cache == "store" and not self.runs_per_layer

    def sample_alpha(self) -> Tensor | None:
        mode = self.cfg.off_diag_mode
        if mode == "linear_comb":
            return self.alpha
        if mode == "bayesian":
            if not self.training:
                return self.alpha_mu
            return self.alpha_mu + torch.exp(0.5 * self.alpha_logvar) * torch.randn_like(self.alpha_mu)
        return None

    def kl_divergence(self) -> Tensor:
        """½ Σ_{i≠j,k} (σ² + μ² − 1 − log σ²) against N(0, 1); 0 unless bayesian."""
        if self.cfg.off_diag_mode != "bayesian":
            return self.out.weight.new_zeros(())
        off = (1.0 - torch.eye(self.n_heads, device=self.alpha_mu.device, dtype=self.alpha_mu.dtype))[..., None]
        lv = self.alpha_logvar
        return 0.5 * ((lv.exp() + self.alpha_mu**2 - 1.0 - lv) * off).sum()

    # ---- metrics --------------------------------------------------------------------------------------------
    def metric_fn(self, alpha: Tensor | None, layer_idx: int | None):
        """z [..., w] -> per-head metrics m [..., H, dh, dh], with the weight folding done once."""
        H, dh = self.n_heads, self.head_dim
        if self.collapsed:
            # W′ = H·P, applied as P(H·z) + H·b: scaling the input is far cheaper than scaling the weight.
            if not self._unit_scales():
                raise ValueError("block_scales: a collapsed generator has no blocks to scale; use the full one")
            # W′ = H·P, b′ = H·b: H·(P z + b), through the layer itself (so a grouped copy works too).
            return lambda z: (self.out(z) * H).unflatten(-1, (H, dh, dh))  # (..., H, dh, dh)
        if not self.fused:
            return lambda z: self.full_metric(z, alpha, layer_idx).sum(-2)  # RowSum over block columns j
        S = None if self._unit_scales() else block_scale_matrix(H, *self.block_scales, self.out.weight)
        const = self._layer_bias_rowsum(layer_idx, S)  # (H, dh, dh) or None
        if self.cfg.compact_rank:
            r = self.cfg.compact_rank

            def compact(z):
                U, V = self.out(z).unflatten(-1, (2, H, dh, r)).unbind(-4)  # (..., H, dh, r) each
                Vs = V.sum(-3, keepdim=True) if S is None else torch.einsum("ij,...jcr->...icr", S, V)
                m = U @ Vs.transpose(-1, -2) / math.sqrt(r)  # (..., H, dh, dh) = U_i (Σ_j S_ij V_j)ᵀ / √r
                return m if const is None else m + const

            return compact
        def folded_linear(z, W, b):
            return F.linear(z, W, b if const is None else b + const.flatten()).unflatten(-1, (H, dh, dh))

        if not self.causal:  # one context per sequence: one call per forward, so the fold can live in the call
            def per_sequence(z):
                if z.dim() != 2 or autocast_enabled(z.device.type):
                    return folded_linear(z, *self.folded_output())
                m = _RowSumLinear.apply(z, self.out.weight, self.out.bias, H, S, self.grad_storage)  # (B, H*dh*dh)
                return (m if const is None else m + const.flatten()).unflatten(-1, (H, dh, dh))  # (B, H, dh, dh)

            return per_sequence
        W, b = self.folded_output()  # folded once, reused by every causal chunk
        return lambda z: folded_linear(z, W, b)  # (..., H, dh, dh)

    def _layer_bias_rowsum(self, layer_idx: int | None, S: Tensor | None) -> Tensor | None:
        """RowSum of the block-scaled layer bias U diag(s_l) Vᵀ: an input-independent [H, dh, dh]."""
        if not self.cfg.use_layer_bias:
            return None
        H, dh = self.n_heads, self.head_dim
        s = self.bias_s[0 if layer_idx is None else layer_idx]
        bias = ((self.bias_U * s) @ self.bias_V.T).reshape(H, dh, H, dh)
        if S is not None:
            bias = bias * S[:, None, :, None]
        return bias.sum(2)

    def folded_output(self) -> tuple[Tensor, Tensor]:
        """W′ [(H·dh·dh), w] and b′: the final layer summed over block columns j, block scales folded in."""
        H = self.n_heads
        scales = None if self._unit_scales() else block_scale_matrix(H, *self.block_scales, self.out.weight)
        W, b = self.out.weight, self.out.bias
        if torch.is_grad_enabled() and W.requires_grad and not torch.compiler.is_compiling():
            return FoldRowSum.apply(W, b, H, scales, self.grad_storage)
        return fold_rowsum(W, b, H, scales)

    def full_metric(self, z: Tensor, alpha: Tensor | None, layer_idx: int | None) -> Tensor:
        """The explicit D×D metric as blocks [..., H(i), dh(a), H(j), dh(c)], block scales applied."""
        cfg, D, H, dh = self.cfg, self.d_model, self.n_heads, self.head_dim
        if self.collapsed:  # no D² outputs exist: the block-diagonal metric with the same RowSum stands for M
            m = self.metric_fn(None, layer_idx)(z)  # (..., H, dh, dh)
            return torch.einsum("ij,...iac->...iajc", torch.eye(H, dtype=m.dtype, device=m.device), m)
        out = self.out(z)
        if cfg.compact_rank:
            U, V = out.unflatten(-1, (2, D, cfg.compact_rank)).unbind(-3)  # (..., D, r) each
            M = U @ V.transpose(-1, -2) / math.sqrt(cfg.compact_rank)  # (..., D, D)
        else:
            M = out.unflatten(-1, (D, D))  # (..., D, D)
        M = M.unflatten(-1, (H, dh)).unflatten(-3, (H, dh))  # (..., H, dh, H, dh)
        eye = torch.eye(H, dtype=M.dtype, device=M.device)
        mode = self.metric_mode  # free_M and compact rank take the generated M as it is
        if mode in ("linear_comb", "bayesian"):
            diag = M.diagonal(dim1=-4, dim2=-2).movedim(-1, -3)  # (..., H(k), dh, dh): generated blocks D_k
            off = torch.einsum("ijk,...kac->...iajc", alpha, diag)  # Σ_k α_ijk D_k
            M = torch.einsum("ij,...iac->...iajc", eye, diag) + off * (1 - eye)[:, None, :, None]
        elif mode == "separate_B":
            B = self.B.reshape(H, dh, H, dh)  # free off-diagonal entries, B ∈ R^{H×dh×D} viewed as D×D
            M = M * eye[:, None, :, None] + B * (1 - eye)[:, None, :, None]
        if cfg.use_layer_bias:
            s = self.bias_s[0 if layer_idx is None else layer_idx]
            M = M + ((self.bias_U * s) @ self.bias_V.T).reshape(H, dh, H, dh)  # U diag(s_l) Vᵀ
        if not self._unit_scales():
            M = M * block_scale_matrix(H, *self.block_scales, M)[:, None, :, None]
        return M

    def factored(self, layer_idx: int | None) -> bool:
        """Whether the causal queries take the factored compact-rank product (``damcha_factored``): a fused compact
        rank without a layer bias (its constant RowSum is not a product of the factors)."""
        return self.causal and self.fused and bool(self.cfg.compact_rank) and not self.cfg.use_layer_bias

    def metric_factors(self, z: Tensor) -> FactoredMetrics:
        """The compact-rank metrics of hidden activations z [..., w] as their factors (block scales applied).

        With unit block scales the V half of the output layer enters only through Vs = Σ_j V_j, so it is summed over
        the heads j on the weights (as the fused RowSum is): D·r outputs instead of H·D·r (a grouped copy, whose
        weight carries the seed axis, calls the layer instead)."""
        H, dh, r = self.n_heads, self.head_dim, self.cfg.compact_rank
        W, b = self.out.weight, self.out.bias
        if not self._unit_scales() or W.dim() != 2:
            S = None if self._unit_scales() else block_scale_matrix(H, *self.block_scales, W)
            return FactoredMetrics.from_outputs(self.out(z), H, dh, r, S)
        n = self.d_model * r  # rows [U (D·r); V (D·r)]
        U = F.linear(z, W[:n], b[:n]).unflatten(-1, (H, dh, r))
        Vs = F.linear(z, W[n:].view(H, dh * r, -1).sum(0), b[n:].view(H, dh * r).sum(0))
        return FactoredMetrics(U, Vs.unflatten(-1, (1, dh, r)), 1.0 / math.sqrt(r))

    def queries(self, xh: Tensor, ctx: MetricContext, layer_idx: int | None) -> Tensor:
        """q_i = X_i m_i for the heads' raw slices xh [B,H,T,dh]."""
        if ctx.factors is not None:
            return ctx.factors.queries(xh)
        if ctx.metric_grad is not None:
            return ctx.metric_grad.queries(xh)
        if ctx.metrics is not None:
            return head_queries(xh, ctx.metrics)
        fn = self.metric_fn(ctx.alpha, layer_idx)
        factored = self.factored(layer_idx)
        B, H, T, dh = xh.shape
        per_pos = B * (H * dh * dh if self.fused else self.d_model**2)
        chunk = self.cfg.query_chunk or max(1, _CHUNK_BUDGET // per_pos)

        def chunk_queries(x_c: Tensor, z_c: Tensor) -> Tensor:
            if factored:  # the metrics' factors only: no [B, chunk, H, dh, dh] tensor
                return self.metric_factors(z_c).queries(x_c)
            return head_queries(x_c, fn(z_c))  # metrics for `chunk` positions only

        # Checkpointing keeps the [B,chunk,H,dh,dh] metrics out of the autograd graph: memory O(B·T·D) + a chunk.
        remat = torch.is_grad_enabled() and self.checkpoint_chunks
        out = []
        for s in range(0, T, chunk):
            x_c, z_c = xh[:, :, s : s + chunk], ctx.hidden[:, s : s + chunk]
            if remat:
                out.append(checkpoint(chunk_queries, x_c, z_c, use_reentrant=False, preserve_rng_state=False))
            else:
                out.append(chunk_queries(x_c, z_c))
        return torch.cat(out, dim=2)  # (B, H, T, dh)

    @torch.no_grad()
    def metric_matrix(self, summary: Tensor, layer_idx: int | None) -> Tensor:
        """Full D×D metric for visualisation: generated from ``summary`` [B,D], averaged over the batch."""
        with _eval_mode(self):
            z = self.trunk(summary)
            M = self.full_metric(z, self.sample_alpha(), layer_idx)
        return M.mean(0).reshape(self.d_model, self.d_model)

    def ensemble_prepare(self) -> None:
        """For ``engine.ensemble``: the fused RowSum of a full D² output reads the output layer's raw weight; the
        explicit path (same values and gradients, docs/variants.md §7.4) calls the layer, which a grouped copy
        replaces. The fused compact-rank path already calls the layer (per head, no D×D tensor): it stays."""
        if self.fused and not self.collapsed and not self.cfg.compact_rank:
            self.cfg = replace(self.cfg, fused_rowsum=False)


@contextlib.contextmanager
def _eval_mode(module: nn.Module):
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)




def __getattr__(name: str):
    """``adam_param_groups`` and ``collapse_generator`` moved to ``damcha_collapse``: the old names still resolve (a
    DeprecationWarning), loaded on first use so that the two modules do not import each other."""
    if name in ("adam_param_groups", "collapse_generator"):
        import importlib
        import warnings

        warnings.warn(f"{__name__}.{name} moved to {__package__}.damcha_collapse.{name}; the old path goes in the next "
                      "release", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"{__package__}.damcha_collapse"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
