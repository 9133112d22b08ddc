"""Mask resolution shared by every attention (docs/variants.md §0.1).

Everything is resolved once into a boolean ``keep`` mask plus a finite additive ``bias``; query rows with no visible
key ("dead" rows) get zero logits before the softmax and zero output after it, so they stay finite.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Masks:
    """Resolved masks. Tensors broadcast against [B,H,T,S]; ``None`` means "no constraint"."""

    keep: Tensor | None  # bool, True = key visible to the query
    bias: Tensor | None  # float, finite, added to the logits
    dead: Tensor | None  # bool [.,.,T,1], query rows with no visible key
    padding: Tensor | None  # bool [B,T], True = real token
    causal: bool
    causal_only: bool  # the only constraint is causality (SDPA is_causal fast path)

    def apply(self, scores: Tensor, neg: float | None = None) -> Tensor:
        """Add the bias and mask invisible logits with ``neg`` (-inf by default); dead rows become 0."""
        if self.bias is not None:
            scores = scores + self.bias
        if self.keep is not None:
            scores = scores.masked_fill(~self.keep, float("-inf") if neg is None else neg)
        if self.dead is not None:
            scores = scores.masked_fill(self.dead, 0.0)
        return scores

    def zero_invisible(self, weights: Tensor) -> Tensor:
        """Re-zero weights of invisible keys and of dead rows (after a post-softmax head mix)."""
        if self.keep is not None:
            weights = weights.masked_fill(~self.keep, 0.0)
        if self.dead is not None:
            weights = weights.masked_fill(self.dead, 0.0)
        return weights

    def zero_dead(self, out: Tensor) -> Tensor:
        """Zero the per-head outputs [B,H,T,d] of dead query rows."""
        return out if self.dead is None else out.masked_fill(self.dead, 0.0)

    def sdpa_args(self, dtype: torch.dtype) -> dict:
        """Keyword arguments for F.scaled_dot_product_attention (mask with dead rows opened)."""
        if self.causal_only:
            return {"attn_mask": None, "is_causal": True}
        if self.keep is None and self.bias is None:
            return {"attn_mask": None, "is_causal": False}
        keep = self.keep if self.dead is None else self.keep | self.dead
        if self.bias is None:
            return {"attn_mask": keep, "is_causal": False}
        mask = self.bias.to(dtype)
        if keep is not None:
            mask = mask.masked_fill(~keep, float("-inf"))
        return {"attn_mask": mask, "is_causal": False}

    def for_heads(self, heads: slice | Tensor) -> Masks:
        """The masks restricted to a subset of heads (head axis 1, broadcast axes kept)."""

        def pick(t):
            return t if t is None or t.shape[1] == 1 else t[:, heads]

        return Masks(pick(self.keep), pick(self.bias), pick(self.dead), self.padding, self.causal, self.causal_only)

    def for_batch(self, rows: slice) -> Masks:
        """The masks restricted to a block of batch rows (batch axis 0, broadcast axes kept): one seed's slice of a
        grouped ensemble's seed-major batch."""

        def pick(t):
            return t if t is None or t.shape[0] == 1 else t[rows]

        return Masks(pick(self.keep), pick(self.bias), pick(self.dead), pick(self.padding), self.causal,
                     self.causal_only)


@functools.lru_cache(maxsize=16)
def _causal_keep(seq_len: int, device: torch.device) -> Tensor:
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]


def resolve_masks(
    batch: int,
    seq_len: int,
    n_heads: int,
    causal: bool,
    padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    device: torch.device,
    extra_keep: Tensor | None = None,
) -> Masks:
    """Combine causality, padding, ``attn_mask`` and a variant's own mask into one ``Masks``."""
    keep = None

    def conj(a, b):
        return b if a is None else a & b

    if causal:
        keep = _causal_keep(seq_len, device)  # [1,1,T,S]
    if extra_keep is not None:
        keep = conj(keep, extra_keep)
    # The tests below only skip work when a mask constrains nothing. They read the mask on the host where that is
    # free (a CPU tensor, through NumPy); on an accelerator a read-back would stall every layer until the device is
    # idle, and under torch.compile it would be a data-dependent graph break, so there the (then no-op) masks stay.
    def constrains(t: Tensor) -> bool:  # t: bool "visible" tensor; False = every entry visible
        if t.device.type != "cpu" or torch.compiler.is_compiling():
            return True
        return not t.detach().numpy().all()

    padded = padding_mask is not None and constrains(padding_mask)
    if padded:
        keep = conj(keep, padding_mask[:, None, None, :])  # [B,1,1,S]
    bias = None
    only_causal = causal and extra_keep is None and not padded
    if attn_mask is not None:
        only_causal = False
        m = attn_mask.reshape((1, 1) + attn_mask.shape) if attn_mask.dim() == 2 else attn_mask
        m = m[:, None] if m.dim() == 3 else m  # [B,T,S] -> [B,1,T,S]
        if m.is_floating_point():
            visible = ~torch.isneginf(m)  # -inf entries are invisible keys, the rest is a finite bias
            bias = m.masked_fill(~visible, 0.0)
            if constrains(visible):
                keep = conj(keep, visible)
        else:
            keep = conj(keep, m.bool())
    dead = None
    if keep is not None and not only_causal:
        dead_rows = ~keep.any(dim=-1, keepdim=True)  # [.,.,T,1]
        dead = dead_rows if constrains(~dead_rows) else None
    return Masks(keep, bias, dead, padding_mask, causal, only_causal)
