"""THA: Talking-Heads Attention (Shazeer et al. 2020, arXiv 2003.02436; docs/variants.md §2)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary, check_choice, check_positive_int
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
    -> out_proj. Both mixes are bias-free: a post-mix bias would put weight on masked (future) keys.

    Knobs (docs/variants.md §2.6; all off by default, and then the module computes exactly what it did before them):
    ``pre_mix`` / ``post_mix`` (default True) drop the pre-softmax (logits) or the post-softmax (weights) mix, the
    paper's ablation; ``logit_heads`` (h_k) and ``value_heads`` (h_v) set the numbers of query/key and of value heads
    apart from the ``n_heads`` softmax heads (h): q/k are split into h_k heads of D/h_k, v into h_v heads of D/h_v, the
    pre-mix is h_k → h and the post-mix h → h_v (default None: h). Unequal head counts run an explicit core
    (``_general_core``) on the full [B,h,T,S] tensor.

    Flavours: ``paper`` (Mesh-TF ``TalkingHeadsSelfAttention``; ``mix_init="random"``, N(0, 1/H)) and
    ``damcha_repo`` (the DAMCHA authors' ``THAAttention``: identity init, so it starts as MHA; their code
    has no guard for fully masked rows, this one keeps them finite in both flavours). ``pre_proj`` /
    ``post_proj`` are ``Linear(H, H, bias=False)`` in both, weight[o, i] mixing head i into head o.

    Raises:
        ValueError: bad ``flavor``, ``mix_init``, sizes or dropout (see ``AttentionBase``); both mixes off;
            ``logit_heads``/``value_heads`` not a positive divisor of d_model, or different from ``n_heads`` with the
            mix that would map them turned off.
    """

    needs_full_logits = True
    rotary_ok = True
    flavors = ("paper", "damcha_repo")
    # knobs added later, off: cells keep their keys (registry.resolved_options)
    added_options = {"pre_mix": True, "post_mix": True, "logit_heads": None, "value_heads": None}
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
        pre_mix: bool = True,
        post_mix: bool = True,
        logit_heads: int | None = None,
        value_heads: int | None = None,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        if mix_init is None:  # each flavour's published default
            mix_init = "random" if flavor == "paper" else "identity"
        self.mix_init = check_choice("mix_init", mix_init, ("identity", "random"))
        if not (pre_mix or post_mix):
            raise ValueError("pre_mix: at least one of pre_mix and post_mix must be True (with neither this is MHA)")
        self.h_k = _head_count("logit_heads", logit_heads, d_model, n_heads, pre_mix, "pre_mix")
        self.h_v = _head_count("value_heads", value_heads, d_model, n_heads, post_mix, "post_mix")
        self.d_k, self.d_v = d_model // self.h_k, d_model // self.h_v
        self.bias = bool(bias)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W_q; W_k; W_v] (mha.py layout)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.pre_proj = nn.Linear(self.h_k, n_heads, bias=False) if pre_mix else None  # P_l^T
        self.post_proj = nn.Linear(n_heads, self.h_v, bias=False) if post_mix else None  # P_w^T
        self.workspace = Workspace()  # the CPU core's memory kept between steps (not state: not saved or moved)
        self.reset_mixing()

    @property
    def square(self) -> bool:
        """h_k = h = h_v: the blocked head-mix core applies (the default)."""
        return self.h_k == self.n_heads == self.h_v

    def reset_mixing(self) -> None:
        """Identity (rectangular: ones on the diagonal), or Mesh-TF's variance-scaling normal N(0, 1/fan-in) (fan-in:
        the heads mixed from, H by default)."""
        with torch.no_grad():
            for lin in (m for m in (self.pre_proj, self.post_proj) if m is not None):
                if self.mix_init == "identity":
                    lin.weight.copy_(torch.eye(*lin.weight.shape))
                else:
                    lin.weight.normal_(0.0, lin.in_features**-0.5)

    def rotary_widths(self) -> tuple[int, ...]:
        return (self.d_k,)  # queries and keys are h_k heads of D/h_k (the head width by default)

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        if not self.square:
            return self.out_proj(self._general_core(x, masks, rotary))
        q, k, v = self.split_qkv(self.qkv(x))  # (B, H, T, dh) each
        q, k = apply_rotary(q, k, rotary)  # before the logits: each head's logits are relative, so are their mixes
        # The chunked core (headmix.py) runs logits -> pre-mix -> mask (finite negative, after the mix: never -inf
        # in a mix) -> softmax -> post-mix -> re-zero -> dropout -> ·V and keeps one [B,H,T,S] tensor for backward
        # (on the CPU; other devices run the same pipeline batched, headmix_batched.py).
        # The 1/sqrt(dh) scale is folded into the H x H pre-mix instead of a pass over [B,H,T,S]; without a pre-mix
        # (the post-only ablation) it multiplies q.
        pre = None if self.pre_proj is None else self.pre_proj.weight * self.head_dim**-0.5
        post = None if self.post_proj is None else self.post_proj.weight
        if pre is None:
            q = q * self.head_dim**-0.5
        if (pre if pre is not None else post).dim() == 2:
            return self.out_proj(self.merge_heads(self._core(q, k, v, masks, pre, post)))
        # a grouped ensemble (engine.ensemble): [S, H, H] mixes, one per seed's slice of the seed-major batch
        S = (pre if pre is not None else post).shape[0]
        n = q.shape[0] // S
        out = torch.cat([self._core(q[i * n:(i + 1) * n], k[i * n:(i + 1) * n], v[i * n:(i + 1) * n],
                                    masks.for_batch(slice(i * n, (i + 1) * n)), None if pre is None else pre[i],
                                    None if post is None else post[i])
                         for i in range(S)])
        return self.out_proj(self.merge_heads(out))

    def _core(self, q: Tensor, k: Tensor, v: Tensor, masks: Masks, pre: Tensor | None, post: Tensor | None
              ) -> Tensor:
        """The blocked head-mix core with the static mixes that are on (None: that stage left out)."""
        return mixed_attention(q, k, v, masks, None if pre is None else _STATIC_MIX, [] if pre is None else [pre],
                               None if post is None else _STATIC_MIX, [] if post is None else [post],
                               chunk=self.query_chunk, dropout=self.dropout_p if self.training else 0.0,
                               mix=mix_heads, rezero_fn=rezero,  # this module's names, looked up per call
                               workspace=self.workspace)

    def _general_core(self, x: Tensor, masks: Masks, rotary: Rotary | None) -> Tensor:
        """Unequal head counts: logits of h_k heads -> pre-mix to h -> mask -> softmax -> post-mix to h_v -> re-zero
        -> dropout -> ·V of h_v heads; [B,T,D] before out_proj. Autograd keeps the [B,·,T,S] tensors (an option for
        the ablation runs, where the blocked core's memory savings do not matter)."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k = (t.view(B, T, self.h_k, self.d_k).transpose(1, 2) for t in (q, k))  # (B, h_k, T, d_k)
        v = v.view(B, T, self.h_v, self.d_v).transpose(1, 2)  # (B, h_v, T, d_v)
        q, k = apply_rotary(q, k, rotary)
        logits = q @ k.transpose(-1, -2) * self.d_k**-0.5  # (B, h_k, T, S)
        if self.pre_proj is not None:
            logits = _mix_rect(self.pre_proj.weight, logits)  # (B, h, T, S)
        w = softmax_fp32(masks.apply(logits, torch.finfo(logits.dtype).min))  # finite negative: nothing -inf mixed
        if self.post_proj is not None:
            w = _mix_rect(self.post_proj.weight, w)  # (B, h_v, T, S)
        if self.h_v != self.n_heads and masks.keep is not None and masks.keep.shape[1] != 1:
            # per-head masks of the h softmax heads: a value head keeps a key that some softmax head sees
            masks = Masks(masks.keep.any(1, keepdim=True), None, masks.dead, masks.padding, masks.causal,
                          masks.causal_only)
        w = masks.zero_invisible(w)
        return self.merge_heads(self.attn_drop(w) @ v)

    def compute_path(self, device: torch.device, dtype: torch.dtype) -> str:
        if not self.square:
            return "explicit core (unequal head counts)"
        return "batched head-mix core" if use_batched(torch.device(device)) else "blocked head-mix core (CPU)"

    def analytic_params(self) -> int:
        D, H = self.d_model, self.n_heads
        mixes = (self.h_k * H if self.pre_proj is not None else 0) + (H * self.h_v if self.post_proj is not None else 0)
        return 4 * D * D + (4 * D if self.bias else 0) + mixes

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, H, T = self.d_model, self.n_heads, seq_len
        mha = 8 * T * D * D + 4 * T * T * D  # projections + QK^T and UV
        mixes = (self.h_k * H if self.pre_proj is not None else 0) + (H * self.h_v if self.post_proj is not None else 0)
        return batch * (mha + 2 * T * T * mixes)  # + pre-mix and post-mix (h_k·h and h·h_v MACs per (t, s))


def _mix_rect(weight: Tensor, a: Tensor) -> Tensor:
    """out[b,o,t,s] = Σ_i weight[o,i] a[b,i,t,s] for a possibly rectangular mix; a grouped ensemble's [S, out, in]
    weights mix each seed's slice of the seed-major batch with its own matrix."""
    if weight.dim() == 2:
        return torch.einsum("oi,bits->bots", weight, a)
    S = weight.shape[0]
    return torch.einsum("goi,gbits->gbots", weight, a.unflatten(0, (S, a.shape[0] // S))).flatten(0, 1)


def _head_count(name: str, value, d_model: int, n_heads: int, mix_on: bool, mix_name: str) -> int:
    """A THA head count (h_k or h_v): ``n_heads`` when None; else a positive divisor of d_model that differs from
    ``n_heads`` only when the mix mapping it is on."""
    if value is None:
        return n_heads
    check_positive_int(name, value)
    if d_model % value:
        raise ValueError(f"{name}: d_model={d_model} is not divisible by {name}={value}")
    if value != n_heads and not mix_on:
        raise ValueError(f"{name}: {value} heads differ from n_heads={n_heads}, which needs {mix_name}=True (the mix "
                         "maps one head count onto the other)")
    return value
