"""Rotary position embeddings (RoPE; Su et al., "RoFormer", arXiv 2104.09864) as attentions receive them.

A backbone (``models.Decoder(positions="rope")``) or a host (a Llama-family model's ``position_embeddings``) computes
``cos``/``sin`` once per forward and hands them to every layer as ``rotary``; each variant with the ``rotary_ok``
capability rotates the vectors whose dot products form its logits (docs/variants.md §0.4). The layout is Hugging
Face's: ``rotate(t) = t·cos + rotate_half(t)·sin``, where ``rotate_half`` pairs dimension j with j + r/2, so the
rotation of query t and key s leaves their dot product a function of s − t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import _err

ROPE_BASE = 10000.0  # RoFormer's and Llama's default theta


@dataclass(frozen=True)
class Rotary:
    """``cos``, ``sin`` [B or 1, T, r] (r even): the rotation of every position, r wide.

    A vector wider than r (a multiple of it, e.g. ColMHA's shared D̃-wide key space) is rotated in r-wide blocks, each
    as one head of width r would be.
    """

    cos: Tensor
    sin: Tensor

    @classmethod
    def standard(cls, seq_len: int, width: int, *, base: float = ROPE_BASE, device=None,
                 dtype: torch.dtype = torch.float32) -> Rotary:
        """RoPE at positions 0..seq_len-1 with frequencies base^(-2j/width) (RoFormer, Llama's default); the angles
        are computed in float32 (as Llama's) or float64 when that is the dtype asked for."""
        exact = torch.float64 if dtype == torch.float64 else torch.float32
        inv_freq = 1.0 / base ** (torch.arange(0, width, 2, device=device, dtype=exact) / width)  # (r/2,)
        freqs = torch.arange(seq_len, device=device, dtype=exact)[:, None] * inv_freq  # (T, r/2)
        angles = torch.cat((freqs, freqs), dim=-1)[None]  # (1, T, r): dimension j and j + r/2 share an angle
        return cls(angles.cos().to(dtype), angles.sin().to(dtype))

    @property
    def width(self) -> int:
        return self.cos.shape[-1]

    def rotate(self, t: Tensor, heads: bool = True) -> Tensor:
        """t [B, h, T, w] (``heads``) or [B, T, w], w a multiple of ``width`` -> the rotated t, same shape."""
        cos, sin = self.cos.to(t.dtype), self.sin.to(t.dtype)  # (B|1, T, r)
        if heads:
            cos, sin = cos[:, None], sin[:, None]  # (B|1, 1, T, r)
        r, w = self.width, t.shape[-1]
        if w != r:
            t = t.unflatten(-1, (w // r, r))  # (..., T, w/r, r): r-wide blocks
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (..., T, 1, r)
        x1, x2 = t.chunk(2, dim=-1)
        out = t * cos + torch.cat((-x2, x1), dim=-1) * sin
        return out if w == r else out.flatten(-2)

    @classmethod
    def check(cls, rotary, batch: int, seq_len: int, widths: tuple[int, ...], device) -> Rotary | None:
        """``rotary`` as handed to an attention's forward (a Rotary or a ``(cos, sin)`` pair), validated against
        the batch, the sequence length and the ``widths`` of the vectors the attention rotates; cos/sin of shape
        [T, r] gain a batch axis.

        Raises:
            ValueError: not a Rotary or a pair of tensors; cos and sin of different shapes, not floating, not
                [T, r] / [B, T, r] with this T and B (or 1), r odd, or r not dividing every rotated width.
        """
        if rotary is None:
            return None
        if isinstance(rotary, (tuple, list)) and len(rotary) == 2:
            rotary = cls(*rotary)
        if not isinstance(rotary, cls) or not (torch.is_tensor(rotary.cos) and torch.is_tensor(rotary.sin)):
            raise _err("rotary", f"expected a Rotary or a (cos, sin) pair of tensors, got {type(rotary).__name__}")
        cos, sin = rotary.cos, rotary.sin
        if cos.shape != sin.shape or not (cos.is_floating_point() and sin.is_floating_point()):
            raise _err("rotary", f"cos and sin must be floating tensors of one shape, got {cos.dtype} "
                                 f"{tuple(cos.shape)} and {sin.dtype} {tuple(sin.shape)}")
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]  # (1, T, r)
        r = cos.shape[-1]
        if cos.dim() != 3 or cos.shape[1] != seq_len or cos.shape[0] not in (1, batch) or r == 0 or r % 2:
            raise _err("rotary", f"expected cos/sin of shape [T, r] or [B, T, r] with T={seq_len}, B={batch} (or "
                                 f"1) and an even r, got {tuple(rotary.cos.shape)}")
        bad = [w for w in widths if w % r]
        if bad:
            raise _err("rotary", f"width {r} does not divide the width {bad[0]} of the vectors this attention "
                                 "rotates (its rotary_widths())")
        return cls(cos.to(device), sin.to(device))


def apply_rotary(q: Tensor, k: Tensor, rotary: Rotary | None, heads: bool = True) -> tuple[Tensor, Tensor]:
    """Queries and keys rotated by ``rotary`` (unchanged when None); [B, h, T, w] with ``heads``, else [B, T, w]."""
    if rotary is None:
        return q, k
    return rotary.rotate(q, heads), rotary.rotate(k, heads)
