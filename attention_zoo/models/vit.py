"""Vision Transformer (pre-LN, CLS token, learned positions) with any registered attention."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..checks import check_positive_int
from ..variants.seed_axis import by_seed, seeds_of
from .decoder import ModelOutput
from .stack import AttentionStack, StackConfig


class VisionTransformer(nn.Module):
    """ViT classifier. Attention is non-causal over [CLS] + patches, so DAMCHA's shared generator sees the
    full-sequence mean of the stack input (after the positional embedding), as in the authors' ViT.
    ``share_across_layers`` (alias ``share_mlp``; default True) as in ``Decoder``.

    ``forward(images [B,C,H,W]) -> ModelOutput(logits [B,num_classes], aux_loss)``.

    Raises:
        ValueError: non-positive sizes, image_size not divisible by patch_size, ``share_across_layers`` and
            ``share_mlp`` given with different values, images of the wrong shape, not floating-point (uint8
            pixels), or of another dtype than the parameters outside autocast (float64 into a float32 model).
    """

    ensemble_parameters = ("cls_token", "pos_emb")  # may carry a seed axis (engine.ensemble)

    def __init__(self, image_size: int, patch_size: int, num_classes: int, d_model: int, n_layers: int,
                 n_heads: int, attention: str = "mha", attention_options: dict | None = None,
                 share_across_layers: bool | None = None, in_chans: int = 3, d_ff: int | None = None,
                 dropout: float = 0.0, attn_dropout: float = 0.0, share_mlp: bool | None = None):
        super().__init__()
        for name, v in (("image_size", image_size), ("patch_size", patch_size), ("num_classes", num_classes),
                        ("in_chans", in_chans)):
            check_positive_int(name, v)
        if image_size % patch_size:
            raise ValueError(f"patch_size: image_size={image_size} is not divisible by patch_size={patch_size}")
        self.image_size, self.in_chans = image_size, in_chans
        n_patches = (image_size // patch_size) ** 2
        self.cfg = StackConfig(d_model, n_layers, n_heads, attention, dict(attention_options or {}),
                               share_across_layers, causal=False, d_ff=d_ff, dropout=dropout,
                               attn_dropout=attn_dropout, norm="pre", max_seq_len=n_patches + 1, share_mlp=share_mlp)
        self.patch_embed = nn.Conv2d(in_chans, d_model, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_emb = nn.Parameter(torch.zeros(1, n_patches + 1, d_model))
        nn.init.normal_(self.pos_emb, std=0.02)
        nn.init.normal_(self.cls_token, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.stack = AttentionStack(self.cfg)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, images: Tensor) -> ModelOutput:
        expected = (self.in_chans, self.image_size, self.image_size)
        if not torch.is_tensor(images) or images.dim() != 4 or tuple(images.shape[1:]) != expected:
            got = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
            raise ValueError(f"images: expected [B, {', '.join(map(str, expected))}], got {got}")
        dtype = self.patch_embed.weight.dtype
        if not images.is_floating_point():
            raise ValueError(f"images: expected floating-point pixels of dtype {dtype}, got {images.dtype} (convert "
                             f"and normalise them first, e.g. images.to({dtype}) / 255)")
        if images.dtype != dtype and not torch.is_autocast_enabled(images.device.type):
            raise ValueError(f"images: dtype {images.dtype} does not match the model's parameters ({dtype}); convert "
                             "the images or the model")
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, D)
        S = seeds_of(self.pos_emb, 3)
        if S:  # a grouped ensemble (engine.ensemble): [S, 1, …, D] per seed, over a seed-major batch
            cls = self.cls_token.expand(S, x.shape[0] // S, 1, -1).flatten(0, 1)  # (S·B, 1, D)
            x = (by_seed(torch.cat([cls, x], dim=1), S) + self.pos_emb).flatten(0, 1)  # (S·B, N+1, D)
        else:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_emb  # (B, N+1, D)
        h, aux = self.stack(self.drop(x))
        return ModelOutput(self.head(self.norm(h[:, 0])), aux)

    def get_M_matrices(self) -> list[tuple[str, Tensor]]:
        return [(f"stack.{name}", M) for name, M in self.stack.get_M_matrices()]
