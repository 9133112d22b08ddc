"""MMA: mixed multi-head self-attention (Cui, Iida, Hung, Utsuro, Nagata, "Mixed Multi-Head Self-Attention for
Neural Machine Translation", WNGT 2019, ACL Anthology D19-5622). docs/variants.md §5.

Plain MHA weights (same ``qkv``/``out_proj`` layout as mha.py, so weights copy); each head belongs to one of four
groups with a fixed visibility mask over query i and key j (the diagonal j = i is always visible):

============  ==============================  ==================================  ============================
group         ``paper``                       ``damcha_repo``                     under ``causal=True`` (∩ j≤i)
============  ==============================  ==================================  ============================
global        all j                           all j                               j ≤ i
local         |i − j| ≤ window                i − window < j ≤ i                  paper i−window ≤ j ≤ i;
                                                                                  repo i−window < j ≤ i
forward       j ≤ i  (past, DiSAN style)      j ≤ i                               j ≤ i  (= global)
backward      j ≥ i  (future)                 j ≥ i                               j = i  (self only)
============  ==============================  ==================================  ============================

Direction convention: "forward" heads read the past and the current token, "backward" heads the current token and
the future (DiSAN); the paper does not fix this, nor the diagonal, window or head allocation (docs/variants.md §5.1).
Head allocation: ``paper`` gives H/4 contiguous heads to each group in the order global, local, forward, backward;
``damcha_repo`` assigns head h to group h mod 4 (round robin) and uses the repository's one-sided window
j ∈ [i − 7, i] for ``window=8``. The repository's module hard-codes causality for its global and forward heads
(it is a decoder); with ``causal=False`` this harness applies the same group masks without the causal
intersection, so global heads see everything there.

The group masks enter through ``extra_keep`` and are intersected with causality, padding and ``attn_mask`` by the
base class; all heads then run in one F.scaled_dot_product_attention call with a per-head mask (on CUDA the
flash kernel takes no mask, so SDPA picks the memory-efficient kernel; the CPU flash kernel accepts it). Query
rows with no visible key (e.g. a padded query in a self-only head) give zero output; the repository instead made
them uniform over all keys (harmless there: such rows are padded queries).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..registry import register_attention
from .base import AttentionBase, Masks, Rotary, apply_rotary, check_positive_int

GROUPS = ("global", "local", "forward", "backward")


@register_attention("mma")
class MixedMultiHeadAttention(AttentionBase):
    """Mixed multi-head self-attention: heads with fixed global/local/forward/backward masks (Cui et al. 2019).

    Args:
        groups: head allocation, either 4 head counts (global, local, forward, backward; contiguous heads in that
            order) or a string with one letter per head from ``g l f b``. Default: H/4 contiguous heads per
            group (``paper``), round robin h mod 4 (``damcha_repo``).
        window: local window size (``paper``: |i − j| ≤ window; ``damcha_repo``: i − window < j ≤ i).
        all_global: every head global, i.e. exactly MHA (same as ``groups=(H, 0, 0, 0)``).

    Raises:
        ValueError: bad sizes or option values; ``groups`` counts that are not 4 non-negative ints summing to
            n_heads, a letter string not of length n_heads or with letters outside ``glfb``; the default
            ``paper`` split with n_heads not divisible by 4; ``all_global`` combined with ``groups``.
    """

    fused_kernel = True
    rotary_ok = True
    flavors = ("paper", "damcha_repo")

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        causal: bool = False,
        dropout: float = 0.0,
        *,
        flavor: str = "paper",
        groups: tuple[int, int, int, int] | str | None = None,
        window: int = 8,
        all_global: bool = False,
        max_seq_len: int | None = None,
    ):
        super().__init__(d_model, n_heads, causal, dropout, flavor, max_seq_len)
        self.window = check_positive_int("window", window)
        if not isinstance(all_global, bool):
            raise ValueError(f"all_global: expected a bool, got {all_global!r}")
        if all_global and groups is not None:
            raise ValueError("all_global: cannot be combined with groups (use groups=(n_heads, 0, 0, 0))")
        self.head_groups = ("global",) * n_heads if all_global else self._parse_groups(groups, n_heads, flavor)
        self.qkv = nn.Linear(d_model, 3 * d_model)  # rows: [W_q; W_k; W_v], as mha.py
        self.out_proj = nn.Linear(d_model, d_model)
        self._keep_cache: dict[tuple[int, str], Tensor] = {}

    @staticmethod
    def _parse_groups(groups, n_heads: int, flavor: str) -> tuple[str, ...]:
        if groups is None:
            if flavor == "damcha_repo":
                return tuple(GROUPS[h % 4] for h in range(n_heads))
            if n_heads % 4:
                raise ValueError(f"n_heads: the default paper split needs n_heads divisible by 4, got {n_heads}")
            groups = (n_heads // 4,) * 4
        if isinstance(groups, str):
            letters = groups.lower()
            if len(letters) != n_heads or set(letters) - set("glfb"):
                raise ValueError(f"groups: expected {n_heads} letters from 'glfb' (one per head), got {groups!r}")
            return tuple(next(g for g in GROUPS if g[0] == c) for c in letters)
        counts = tuple(groups) if isinstance(groups, (tuple, list)) else ()
        ok = len(counts) == 4 and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts)
        if not ok or sum(counts) != n_heads:
            raise ValueError(
                f"groups: expected 4 non-negative head counts (global, local, forward, backward) summing to "
                f"n_heads={n_heads}, or a string of {n_heads} letters from 'glfb'; got {groups!r}"
            )
        return tuple(g for g, c in zip(GROUPS, counts) for _ in range(c))

    def extra_keep(self, seq_len: int, device: torch.device) -> Tensor | None:
        """Per-head group masks, bool [1, H, T, S] (True = visible), cached per (T, device); None if all global."""
        if all(g == "global" for g in self.head_groups):
            return None  # exactly MHA, keeps the is_causal fast path
        key = (seq_len, str(device))
        if key not in self._keep_cache:
            if len(self._keep_cache) >= 8:  # bound the cache when many lengths are seen
                self._keep_cache.clear()
            pos = torch.arange(seq_len, device=device)
            d = pos[None, :] - pos[:, None]  # (T, S): j - i
            w = self.window
            local = d.abs() <= w if self.flavor == "paper" else (d <= 0) & (d > -w)
            by_group = torch.stack([torch.ones_like(local), local, d <= 0, d >= 0])  # (4, T, S) in GROUPS order
            gid = torch.tensor([GROUPS.index(g) for g in self.head_groups], device=device)  # (H,)
            self._keep_cache[key] = by_group[gid][None]  # (1, H, T, S)
        return self._keep_cache[key]

    def _attend(self, x: Tensor, masks: Masks, stack_context, rotary: Rotary | None = None) -> Tensor:
        q, k, v = self.split_qkv(self.qkv(x))  # (B, H, T, dh) each
        q, k = apply_rotary(q, k, rotary)  # the group masks are relative (j - i): RoPE keeps them meaningful
        return self.out_proj(self.merge_heads(self.sdpa(q, k, v, masks)))

    def analytic_params(self) -> int:
        D = self.d_model
        return 4 * D * D + 4 * D

    def analytic_flops(self, batch: int, seq_len: int) -> int:
        D, T = self.d_model, seq_len
        return batch * (8 * T * D * D + 4 * T * T * D)  # as MHA: the masks do not make the kernels sparser

    def extra_repr(self) -> str:
        counts = {g: self.head_groups.count(g) for g in GROUPS}
        return f"{super().extra_repr()}, groups={counts}, window={self.window}"
