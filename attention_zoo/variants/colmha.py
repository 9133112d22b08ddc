"""ColMHA: collaborative multi-head attention (Cordonnier, Loukas, Jaggi, "Multi-Head Attention: Collaborate
Instead of Concatenate", arXiv 2006.16362; reference code epfml/collaborative-attention). docs/variants.md §4.

``paper``: all heads share one query and one key projection W̃_Q, W̃_K ∈ R^{D×D̃} (no bias, as in the official
code); head i re-weights the shared D̃-dim space with a mixing vector m_i and adds a content bias x_s·c_i that
depends on the key only::

    score_i(t, s) = ((Q̃_t ⊙ m_i) · K̃_s + x_s · c_i) / √(D̃/H)

The shared projections carry no bias, yet MHA with biased q/k is still representable: the only key-dependent
bias term of MHA, b_q^i · (W_k^i x_s), is a content bias with c_i = W_k^iᵀ b_q^i; the query-only terms cancel
in the softmax. With D̃ = D, ``mixing_init="concatenate"`` and that content bias, ColMHA equals MHA exactly
(the scale √(D̃/H) is then √d_h).

``damcha_repo``: ``CollaborativeAttention`` of erwinmsmith/DAMCHA ``models/baselines.py`` — shared D→D q/k
projections without bias, split into H chunks and mixed across heads by H×H matrices C_q, C_k (init
I + 0.01·N(0,1)); scaled by 1/√d_h. A re-parametrisation of MHA (C = I gives MHA with bias-free q/k).

Compute (``paper``): the mixed queries Q̃ ⊙ m_i [B,H,T,D̃] meet the shared keys K̃ in one batched GEMM
[B, H·T, D̃] @ [B, D̃, S] (K̃ is never copied per head), the content bias is added as a [B,H,1,S] term and the
harness softmax path applies the masks. The per-head queries cost H× the memory of Q (docs/variants.md §4.4).
F.scaled_dot_product_attention with the content bias as a float mask gives the same values but is slower on
CPU: its fused CPU kernel needs equal q/v head dims (D̃ ≠ d_h here), so it falls back to the math path, which
copies K̃ per head and builds a [B,H,T,S] float mask on top of the logits (B=4, T=512, D=256, H=8, 2 threads,
fwd+bwd: 1.55–1.62 s vs 1.33 s explicit, on a loaded machine). Folding the content bias into the GEMM (H extra
one-hot columns) saved only 2–3 % and was not kept.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary, check_choice, check_positive_int
from .seed_axis import by_seed, seeds_of

_PAPER_ONLY = ("shared_dim", "mixing_init", "content_bias")


@register_attention("colmha")
class CollaborativeAttention(AttentionBase):
    """Collaborative multi-head attention: heads share q/k projections and differ by mixing (Cordonnier et al.).

    Args:
        shared_dim: D̃, the width of the shared q/k space (``paper``; default None = d_model; the paper's headline
            setting is d_model // 4). The resolved width is the attribute ``shared_dim`` (both flavours;
            ``damcha_repo``: d_model) and is shown by ``repr``.
        mixing_init: ``"uniform"`` (official default; actually N(0, 0.2²)) or ``"concatenate"`` (head i selects
            its ⌈D̃/H⌉-wide chunk, so the module starts as MHA) (``paper``).
        content_bias: add the key-only term x_s·c_i (``paper``, default True).

    Raises:
        ValueError: bad sizes or option values; a ``paper``-only option (shared_dim, mixing_init,
            content_bias) given with ``flavor="damcha_repo"``.
    """

    fused_kernel = False  # explicit core: faster than SDPA's math fallback on CPU (module docstring)
    rotary_ok = True
    flavors = ("paper", "damcha_repo")
    ensemble_parameters = ("mixing", "combine_q", "combine_k")  # may carry a seed axis (engine.ensemble)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        *,
        flavor: str = "paper",
        shared_dim: int | None = None,
        mixing_init: str | None = None,
        content_bias: bool | None = None,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        D, H = d_model, n_heads
        if flavor == "damcha_repo":
            given = [n for n, v in zip(_PAPER_ONLY, (shared_dim, mixing_init, content_bias)) if v is not None]
            if given:
                raise ValueError(f"{given[0]}: only the 'paper' flavor takes this option, got flavor='damcha_repo'")
            self.shared_dim = D  # the shared bases are D wide, split into H chunks of d_h
            self.q_proj = nn.Linear(D, D, bias=False)
            self.k_proj = nn.Linear(D, D, bias=False)
            self.combine_q = nn.Parameter(torch.eye(H) + 0.01 * torch.randn(H, H))  # [out head, in head]
            self.combine_k = nn.Parameter(torch.eye(H) + 0.01 * torch.randn(H, H))
        else:
            self.shared_dim = D if shared_dim is None else check_positive_int("shared_dim", shared_dim)
            self.mixing_init = check_choice(
                "mixing_init", "uniform" if mixing_init is None else mixing_init, ("uniform", "concatenate")
            )
            if content_bias is not None and not isinstance(content_bias, bool):
                raise ValueError(f"content_bias: expected a bool, got {content_bias!r}")
            Dt = self.shared_dim
            self.q_proj = nn.Linear(D, Dt, bias=False)  # W̃_Q, shared by all heads
            self.k_proj = nn.Linear(D, Dt, bias=False)  # W̃_K
            self.mixing = nn.Parameter(self._init_mixing(H, Dt, self.mixing_init))  # row i = m_i
            # row i = c_i; the score term x_s·c_i depends on the key only
            self.content_proj = nn.Linear(D, H, bias=False) if content_bias in (None, True) else None
            self.scale = 1.0 / math.sqrt(Dt / H)  # official code; D̃/H need not be an integer
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    @staticmethod
    def _init_mixing(n_heads: int, shared_dim: int, how: str) -> Tensor:
        if how == "uniform":
            return torch.randn(n_heads, shared_dim) * 0.2
        chunk = math.ceil(shared_dim / n_heads)  # the last head gets a smaller chunk when D̃ % H != 0
        return (torch.arange(shared_dim)[None, :] // chunk == torch.arange(n_heads)[:, None]).float()  # (H, D̃)

    def rotary_widths(self) -> tuple[int, ...]:
        """``paper``: RoPE acts in the shared D̃-wide key space (in head-wide blocks when D̃ is a multiple of d_h)."""
        return (self.shared_dim,) if self.flavor == "paper" else (self.head_dim,)

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        B, T, _ = x.shape
        H = self.n_heads
        v = self.split_heads(self.v_proj(x))  # (B, H, T, dh)
        if self.flavor == "damcha_repo":
            q = self.q_proj(x).view(B, T, H, self.head_dim)  # (B, T, H_in, dh)
            k = self.k_proj(x).view(B, T, H, self.head_dim)
            S = seeds_of(self.combine_q, 2)
            if S:  # a grouped ensemble: [S, H, H] per seed over a seed-major batch
                q = torch.einsum("soi,sbtid->sbotd", self.combine_q, by_seed(q, S)).flatten(0, 1)
                k = torch.einsum("soi,sbtid->sbotd", self.combine_k, by_seed(k, S)).flatten(0, 1)
            else:
                q = torch.einsum("oi,btid->botd", self.combine_q, q)  # (B, H_out, T, dh)
                k = torch.einsum("oi,btid->botd", self.combine_k, k)
            q, k = apply_rotary(q, k, rotary)  # on the mixed per-head queries and keys
            out = self.sdpa(q, k, v, masks)
        else:
            Dt = self.shared_dim
            q = self.q_proj(x)  # (B, T, D̃)
            k = self.k_proj(x)  # (B, T, D̃)
            # the scale is folded into the small operands instead of the [B,H,T,S] logits
            S = seeds_of(self.mixing, 2)
            if S:  # a grouped ensemble: one [H, D̃] mixing per seed over a seed-major batch
                qm = (by_seed(q, S)[:, :, None] * (self.mixing * self.scale)[:, None, :, None, :]).flatten(0, 1)
            else:
                qm = q[:, None] * (self.mixing * self.scale)[:, None, :]  # (B, H, T, D̃)
            if rotary is not None:  # each head's query Q̃ ⊙ m_i and the shared key K̃, so scores stay relative
                qm, k = rotary.rotate(qm), rotary.rotate(k, heads=False)
            scores = (qm.view(B, H * T, Dt) @ k.transpose(1, 2)).view(B, H, T, T)  # (B, H, T, S)
            if self.content_proj is not None:
                cb = self.content_proj(x) * self.scale  # (B, S, H)
                scores = scores + cb.transpose(1, 2)[:, :, None, :]  # (B, H, 1, S): masked with its key below
            out = self.softmax_attention(scores, v, masks)
        return self.out_proj(self.merge_heads(out))

    def analytic_params(self) -> int:
        D, H = self.d_model, self.n_heads
        if self.flavor == "damcha_repo":
            return 4 * D * D + 2 * H * H + 2 * D
        Dt = self.shared_dim
        content = D * H if self.content_proj is not None else 0
        return 2 * D * Dt + H * Dt + content + 2 * D * D + 2 * D

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        """Forward FLOPs at 2 per multiply-add.

        ``paper``: Q̃, K̃ 4TDD̃; V, O 4TD²; mixing Q̃ ⊙ m_i 2THD̃ (counted as T·H·D̃ MACs as in docs/variants.md §9,
        although it is an elementwise product); content bias 2TDH; scores 2HD̃TS; AV 2TSD.
        ``damcha_repo``: MHA (8TD² + 4TSD) plus the two chunk mixes 2·2T·H²·d_h = 4THD.
        """
        D, H, T = self.d_model, self.n_heads, seq_len
        if self.flavor == "damcha_repo":
            return batch * (8 * T * D * D + 4 * T * T * D + 4 * T * H * D)
        Dt = self.shared_dim
        content = 2 * T * D * H if self.content_proj is not None else 0
        proj = 4 * T * D * Dt + 4 * T * D * D + 2 * T * H * Dt + content
        return batch * (proj + 2 * H * Dt * T * T + 2 * T * T * D)

    def extra_repr(self) -> str:
        if self.flavor == "damcha_repo":
            return f"{super().extra_repr()}, shared_dim={self.shared_dim}"
        return (
            f"{super().extra_repr()}, shared_dim={self.shared_dim}, mixing_init={self.mixing_init!r}, "
            f"content_bias={self.content_proj is not None}"
        )
