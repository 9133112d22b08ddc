"""What the metric generator costs and shows (``StructuredMLPForM`` inherits it): its closed-form parameters and
FLOPs, the explicit path for inspection and the blocks of its final layer's gradient, and fvcore's handle for the
folded output layer."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

from torch import Tensor

from .base import value_shape
from .damcha_ops import _RowSumLinear


class GeneratorCosts:
    """Mixed into ``StructuredMLPForM``: reads its ``cfg``, widths and layers."""

    # ---- inspection -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def inspectable(self):
        """Within the block, run the explicit D×D path (``fused_rowsum=False``) without chunk checkpointing, so the
        final layer's D² outputs, i.e. the metric M before RowSum, are in the autograd graph. Same values and
        gradients (docs/variants.md §7.4); the configuration is restored on exit."""
        saved = self.cfg, self.checkpoint_chunks
        try:
            self.cfg, self.checkpoint_chunks = replace(self.cfg, fused_rowsum=False), False
            yield self
        finally:
            self.cfg, self.checkpoint_chunks = saved

    @property
    def outputs_metric(self) -> bool:
        """Whether the final layer's D² outputs are the metric M itself (mlp mode, no compact rank, not collapsed)."""
        return self.metric_mode == "mlp" and not self.cfg.compact_rank and not self.collapsed

    def final_layer_grad_blocks(self) -> Tensor:
        """The gradient of the final layer's weight, as blocks [H(i), dh(a), H(j), dh(c), w] of its D² outputs
        (in every ``off_diag_mode``; only in ``mlp`` mode are those outputs the metric itself).

        Raises:
            ValueError: a final layer without D² outputs (compact rank, collapsed) or no gradient yet.
        """
        if self.cfg.compact_rank or self.collapsed:
            raise ValueError("generator: its final layer has no D² outputs (compact rank or collapsed)")
        if self.out.weight.grad is None:
            raise ValueError("generator: no gradient yet; run backward first")
        H, dh = self.n_heads, self.head_dim
        return self.out.weight.grad.unflatten(0, (H, dh, H, dh))

    @staticmethod
    def fvcore_handles() -> dict:
        """fvcore handle of the RowSum-folded final layer (a custom autograd Function, opaque to the tracer): a
        Linear on the folded weight, z [n, w] -> [n, H·dh·dh]; the fold's additions count 0, as elsewhere."""
        def rowsum_linear(inputs, outputs):
            return math.prod(value_shape(outputs[0])) * value_shape(inputs[0])[-1]

        return {f"prim::PythonOp.{_RowSumLinear.__name__}": rowsum_linear}

    # ---- analytic costs -------------------------------------------------------------------------------------
    def analytic_params(self) -> int:
        cfg, D, H = self.cfg, self.d_model, self.n_heads
        widths = (D, *cfg.hidden_dims, self.out_dim)
        n = sum(i * o + o for i, o in zip(widths[:-1], widths[1:]))
        n += {"mlp": 0, "linear_comb": H**3, "bayesian": 2 * H**3, "separate_B": D * D}[cfg.off_diag_mode]
        if cfg.use_layer_bias:
            n += 2 * D * cfg.layer_bias_rank + self.n_layers * cfg.layer_bias_rank
        return n

    def calls(self, seq_len: int) -> int:
        """Generator calls per sequence: one context, or one per prefix when causal."""
        return seq_len if self.causal else 1

    def trunk_flops(self, batch: int, seq_len: int) -> int:
        widths = (self.d_model, *self.cfg.hidden_dims)
        return 2 * batch * self.calls(seq_len) * sum(i * o for i, o in zip(widths[:-1], widths[1:]))

    def head_flops(self, batch: int, seq_len: int) -> int:
        """Final layer (fused: D·dh outputs; explicit: D² or 2·D·r) plus compact product and α mixing."""
        cfg, D, H, dh = self.cfg, self.d_model, self.n_heads, self.head_dim
        plain_fused = self.fused and not cfg.compact_rank
        macs = self.last_width * (D * dh if plain_fused else self.out_dim)
        if cfg.compact_rank:  # U Vᵀ: contracted per head when fused (D·dh·r), full D×D otherwise (D²·r)
            macs += (D * dh if self.fused else D * D) * cfg.compact_rank
        if self.metric_mode in ("linear_comb", "bayesian"):
            macs += H * H * H * dh * dh
        return 2 * batch * self.calls(seq_len) * macs

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        """The once-per-stack call: trunk, plus the final layer when the metrics are precomputed (non-causal)."""
        if self.runs_per_layer:
            return 0  # each layer calls the generator itself; the layers count it
        head = self.head_flops(batch, seq_len) if not self.causal or self.stores_metrics else 0
        return self.trunk_flops(batch, seq_len) + head
