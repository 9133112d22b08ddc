"""MHA: standard multi-head attention (Vaswani et al. 2017), the reference every variant is measured against."""

from __future__ import annotations

from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary


@register_attention("mha")
class MultiHeadAttention(AttentionBase):
    """Multi-head attention on F.scaled_dot_product_attention (``fused=False``: explicit math path)."""

    fused_kernel = True
    rotary_ok = True
    flavors = ("paper",)  # the DAMCHA authors ran the same method (docs/variants.md §1)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        *,
        flavor: str = "paper",
        bias: bool = True,
        fused: bool = True,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        self.bias, self.fused = bool(bias), bool(fused)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W_q; W_k; W_v]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        q, k, v = self.split_qkv(self.qkv(x))  # (B, H, T, dh) each
        q, k = apply_rotary(q, k, rotary)
        if self.fused:
            out = self.sdpa(q, k, v, masks)
        else:
            out = self.softmax_attention(q @ k.transpose(-2, -1) * self.head_dim**-0.5, v, masks)
        return self.out_proj(self.merge_heads(out))

    def analytic_params(self) -> int:
        D = self.d_model
        return 4 * D * D + (4 * D if self.bias else 0)

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, T = self.d_model, seq_len
        return batch * (8 * T * D * D + 4 * T * T * D)  # projections + QK^T and AV
