"""DAMCHA's generator configuration (``MetricConfig``: the authors' option names and their checks) and what a stack
hands its layers once per forward (``MetricContext``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from torch import Tensor

from .base import check_choice, check_fraction, check_positive_int
from .damcha_factored import FactoredMetrics
from .damcha_ops import SharedMetricGrad

OFF_DIAG_MODES = ("mlp", "linear_comb", "bayesian", "separate_B")
_CHUNK_BUDGET = 1 << 22  # metric elements held at once by the causal path (16 MiB in fp32)


@dataclass
class MetricConfig:
    """Generator options (names as in the DAMCHA authors' code)."""

    hidden_dims: tuple[int, ...] = (256, 512)  # () gives one Linear(D -> D²)
    off_diag_mode: str = "mlp"
    diag_scale: float = 1.0
    off_diag_scale: float = 1.0
    # r > 0: the generator outputs U, V ∈ R^{D×r} and M = U Vᵀ / √r, as in the authors' code: ``off_diag_mode`` is
    # then skipped (the mode's parameters are still built but do not shape M).
    compact_rank: int = 0
    use_layer_bias: bool = False
    layer_bias_rank: int = 16
    # True: the generator's raw D×D output is the metric whatever ``off_diag_mode`` is (the authors' ``free_M``);
    # layer bias and block scales still apply. The mode's parameters are built but do not shape M.
    free_M: bool = False
    fused_rowsum: bool = True
    gen_dropout: float | None = None  # None: the owning layer's ``dropout``, as the authors pass it
    off_diag_alpha_init: float = 0.1
    kl_weight: float = 1e-4
    query_chunk: int | None = None  # causal path: positions per chunk (None: sized to a fixed memory budget)
    collapsed_generator: bool = False  # final layer outputs the H·dh·dh RowSums directly (see collapse_generator)
    # Causal shared stack: "store" computes the per-position metrics [B,T,H,dh,dh] once per forward and every layer
    # reads them (the authors' semantics, one final-layer GEMM per stack); "recompute" has each layer rebuild them
    # chunk by chunk under checkpointing (memory O(B·T·D) instead of B·T·D·dh, the final layer run once per layer
    # and again in backward). Same values and gradients.
    metric_cache: str = "store"

    def __post_init__(self):
        if not isinstance(self.hidden_dims, (list, tuple)) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in self.hidden_dims):
            raise ValueError(f"hidden_dims: expected a sequence of positive ints, got {self.hidden_dims!r}")
        self.hidden_dims = tuple(self.hidden_dims)
        for f in fields(self):  # bool-typed options: "no" or 0 must not silently mean True/False
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"{f.name}: expected a bool, got {getattr(self, f.name)!r}")
        check_choice("off_diag_mode", self.off_diag_mode, OFF_DIAG_MODES)
        check_positive_int("compact_rank", self.compact_rank, allow_zero=True)
        check_positive_int("layer_bias_rank", self.layer_bias_rank)
        if self.gen_dropout is not None:
            check_fraction("gen_dropout", self.gen_dropout)
        for name in ("diag_scale", "off_diag_scale", "off_diag_alpha_init", "kl_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name}: expected a finite float, got {v!r}")
        if self.query_chunk is not None:
            check_positive_int("query_chunk", self.query_chunk)
        check_choice("metric_cache", self.metric_cache, ("store", "recompute"))
        if self.collapsed_generator and not (self.off_diag_mode == "mlp" and self.compact_rank == 0
                                             and not self.use_layer_bias and self.fused_rowsum):
            raise ValueError("collapsed_generator: needs off_diag_mode='mlp', compact_rank=0, use_layer_bias=False "
                             "and fused_rowsum=True (only there does the loss see the output rows through RowSum)")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


@dataclass
class MetricContext:
    """What one generator call leaves for the layers that use it."""

    summary: Tensor  # [B, D] detached context (final prefix when causal), for get_M_matrices
    hidden: Tensor  # z, the penultimate activations: [B, w] or [B, T, w]
    alpha: Tensor | None  # α of linear_comb / bayesian, sampled once per forward
    metrics: Tensor | None  # [B, H, dh, dh]; causal: [B, T, H, dh, dh] when stored, else None (made per chunk)
    # Stored causal metrics read by several layers: their gradients meet in one buffer (see ``SharedMetricGrad``).
    metric_grad: SharedMetricGrad | None = None
    # Stored causal compact-rank metrics as their factors (``damcha_factored``): read instead of ``metrics``.
    factors: FactoredMetrics | None = None
