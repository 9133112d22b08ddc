"""MHA: standard multi-head attention (Vaswani et al. 2017), the reference every variant is measured against.

Two knobs, off by default (docs/variants.md §1.1), for the controls of the baselines' claims: ``qk_dim``, the total
query/key width D_k apart from the value width D (each head's q and k are D_k/H wide: the "concatenated" arm of
Cordonnier et al.'s key-size sweep), and ``qk_norm``, a LayerNorm over each head's query and key before the logits
(the QK-norm that DCFormer++'s 405M configuration adds and its Transformer++ baseline lacks).
"""

from __future__ import annotations

from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary, check_positive_int


@register_attention("mha")
class MultiHeadAttention(AttentionBase):
    """Multi-head attention on F.scaled_dot_product_attention (``fused=False``: explicit math path).

    ``qk_dim`` (default None: d_model): the total query/key width D_k, a multiple of ``n_heads``; the logit scale is
    1/√(D_k/H). ``qk_norm`` (default False): LayerNorm (learned gain and bias, shared by the heads) over each head's
    query and key, before the rotary positions and the logits (qk-layernorm, Dehghani et al. 2023).

    Raises:
        ValueError: ``qk_dim`` not a positive multiple of ``n_heads``; and everything ``AttentionBase`` rejects.
    """

    fused_kernel = True
    rotary_ok = True
    flavors = ("paper",)  # the DAMCHA authors ran the same method (docs/variants.md §1)
    added_options = {"qk_dim": None, "qk_norm": False}  # knobs added later, off: cells keep their keys (registry)

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
        qk_dim: int | None = None,
        qk_norm: bool = False,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        self.bias, self.fused = bool(bias), bool(fused)
        self.qk_dim = d_model if qk_dim is None else check_positive_int("qk_dim", qk_dim)
        if self.qk_dim % n_heads:
            raise ValueError(f"qk_dim: expected a multiple of n_heads={n_heads}, got {qk_dim}")
        self.d_qk = self.qk_dim // n_heads
        # rows: [W_q; W_k; W_v] (D_k, D_k and D rows: the default 3D is the layout every adapter copies)
        self.qkv = nn.Linear(d_model, 2 * self.qk_dim + d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        # built after the projections, so the default draws the same initial weights as before the knob existed
        self.q_norm = nn.LayerNorm(self.d_qk) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.d_qk) if qk_norm else None

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        if self.qk_dim == self.d_model:
            q, k, v = self.split_qkv(self.qkv(x))  # (B, H, T, dh) each
        else:
            q, k, v = self.qkv(x).split((self.qk_dim, self.qk_dim, self.d_model), dim=-1)
            q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, H, T, D_k/H | dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, rotary)
        if self.fused:
            out = self.sdpa(q, k, v, masks)  # SDPA's default scale is 1/sqrt(q's width), D_k/H
        else:
            out = self.softmax_attention(q @ k.transpose(-2, -1) * self.d_qk**-0.5, v, masks)
        return self.out_proj(self.merge_heads(out))

    def rotary_widths(self) -> tuple[int, ...]:
        return (self.d_qk,)

    def analytic_params(self) -> int:
        D, Dk = self.d_model, self.qk_dim
        norms = 4 * self.d_qk if self.q_norm is not None else 0
        return 2 * D * Dk + 2 * D * D + (2 * Dk + 2 * D if self.bias else 0) + norms

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, Dk, T = self.d_model, self.qk_dim, seq_len
        return batch * (4 * T * D * Dk + 4 * T * D * D + 2 * T * T * Dk + 2 * T * T * D)  # projections, QK^T, AV
