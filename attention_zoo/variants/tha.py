"""THA: Talking-Heads Attention (Shazeer et al. 2020, arXiv 2003.02436; docs/variants.md §2)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary, check_choice
from .headmix import MixStage, mix_heads, mixed_attention, rezero, softmax_fp32
from .headmix_batched import use_batched
from .headmix_workspace import Workspace

__all__ = ["TalkingHeadsAttention", "mix_heads", "rezero", "softmax_fp32"]
_STATIC_MIX = MixStage(identity=False, static=True, query=False, key=False)


@register_attention("tha")
class TalkingHeadsAttention(AttentionBase):
    """Talking-heads attention: heads are mixed before the softmax (logits) and after it (weights).

    Pipeline: J = QK^T/sqrt(dh) -> L = P_l J (mix over heads) -> mask (finite negative, AFTER the mix)
    -> softmax (fp32) -> U = P_w W (mix over heads) -> re-zero masked entries / dead rows -> dropout -> U V
    -> out_proj. Only the h_k = h = h_v = H case is built (the paper allows different head counts).
    Both mixes are bias-free: a post-mix bias would put weight on masked (future) keys.

    Flavours: ``paper`` (Mesh-TF ``TalkingHeadsSelfAttention``; ``mix_init="random"``, N(0, 1/H)) and
    ``damcha_repo`` (the DAMCHA authors' ``THAAttention``: identity init, so it starts as MHA; their code
    has no guard for fully masked rows, this one keeps them finite in both flavours). ``pre_proj`` /
    ``post_proj`` are ``Linear(H, H, bias=False)`` in both, weight[o, i] mixing head i into head o.

    Raises:
        ValueError: bad ``flavor``, ``mix_init``, sizes or dropout (see ``AttentionBase``).
    """

    needs_full_logits = True
    rotary_ok = True
    flavors = ("paper", "damcha_repo")
    flop_count_note = (
        "causal, the chunked CPU core computes only the key blocks at or below the diagonal (query blocks of "
        "`query_chunk` = 64 rows), so FlopCounterMode and fvcore see (n + 1)/2n of the T x T work (logits, both "
        "head mixes, A·V; n = T/64 blocks), while analytic_flops counts the method's full T x T cost")
    memory_note = (
        "with attention dropout, MHA's SDPA call takes PyTorch's unfused math path on CPU, which keeps the logits, "
        "the softmax, the dropout mask and the dropped weights of every layer for backward, while THA's chunked "
        "CPU core keeps one weights tensor and its dropout mask, and (causal) only the key blocks at or below the "
        "diagonal (tests/test_table2.py measures both with saved-tensor hooks)")
    query_chunk = 64  # rows per block of the chunked core: exact for any value, 4 MiB blocks at H=8, S=512

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        *,
        flavor: str = "paper",
        bias: bool = True,
        mix_init: str | None = None,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        if mix_init is None:  # each flavour's published default
            mix_init = "random" if flavor == "paper" else "identity"
        self.mix_init = check_choice("mix_init", mix_init, ("identity", "random"))
        self.bias = bool(bias)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W_q; W_k; W_v] (mha.py layout)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.pre_proj = nn.Linear(n_heads, n_heads, bias=False)  # P_l^T
        self.post_proj = nn.Linear(n_heads, n_heads, bias=False)  # P_w^T
        self.workspace = Workspace()  # the CPU core's memory kept between steps (not state: not saved or moved)
        self.reset_mixing()

    def reset_mixing(self) -> None:
        """Identity, or Mesh-TF's variance-scaling normal N(0, 1/H) (fan-in = H)."""
        with torch.no_grad():
            for lin in (self.pre_proj, self.post_proj):
                if self.mix_init == "identity":
                    lin.weight.copy_(torch.eye(self.n_heads))
                else:
                    lin.weight.normal_(0.0, self.n_heads**-0.5)

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        q, k, v = self.split_qkv(self.qkv(x))  # (B, H, T, dh) each
        q, k = apply_rotary(q, k, rotary)  # before the logits: each head's logits are relative, so are their mixes
        # The chunked core (headmix.py) runs logits -> pre-mix -> mask (finite negative, after the mix: never -inf
        # in a mix) -> softmax -> post-mix -> re-zero -> dropout -> ·V and keeps one [B,H,T,S] tensor for backward
        # (on the CPU; other devices run the same pipeline batched, headmix_batched.py).
        # The 1/sqrt(dh) scale is folded into the H x H pre-mix instead of a pass over [B,H,T,S].
        pre = self.pre_proj.weight * self.head_dim**-0.5
        post = self.post_proj.weight
        if pre.dim() == 2:
            return self.out_proj(self.merge_heads(self._core(q, k, v, masks, pre, post)))
        # a grouped ensemble (engine.ensemble): [S, H, H] mixes, one per seed's slice of the seed-major batch
        n = q.shape[0] // pre.shape[0]
        out = torch.cat([self._core(q[i * n:(i + 1) * n], k[i * n:(i + 1) * n], v[i * n:(i + 1) * n],
                                    masks.for_batch(slice(i * n, (i + 1) * n)), pre[i], post[i])
                         for i in range(pre.shape[0])])
        return self.out_proj(self.merge_heads(out))

    def _core(self, q: Tensor, k: Tensor, v: Tensor, masks: Masks, pre: Tensor, post: Tensor) -> Tensor:
        return mixed_attention(q, k, v, masks, _STATIC_MIX, [pre], _STATIC_MIX, [post],
                               chunk=self.query_chunk, dropout=self.dropout_p if self.training else 0.0,
                               mix=mix_heads, rezero_fn=rezero,  # this module's names, looked up per call
                               workspace=self.workspace)

    def compute_path(self, device: torch.device, dtype: torch.dtype) -> str:
        return "batched head-mix core" if use_batched(torch.device(device)) else "blocked head-mix core (CPU)"

    def analytic_params(self) -> int:
        D, H = self.d_model, self.n_heads
        return 4 * D * D + (4 * D if self.bias else 0) + 2 * H * H

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, H, T = self.d_model, self.n_heads, seq_len
        mha = 8 * T * D * D + 4 * T * T * D  # projections + QK^T and UV
        return batch * (mha + 2 * (2 * T * T * H * H))  # + pre-mix and post-mix (H^2 MACs per (t, s) each)
