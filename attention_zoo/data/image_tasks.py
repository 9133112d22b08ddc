"""The two image tasks of Table 1 (docs/experiments.md §2) over the sets of ``data/images.py``.

Tasks:
- **patch** (the authors' code): pixels in [−1, 1]; each image is cut into p×p patches in raster order, one token
  per patch with the patch's (p, p, C) values flattened (64 tokens of 48 values at 32×32, p=4); per image 1–3
  consecutive patch *rows* are masked by zeroing the input; the loss is the MSE on the masked patches only.
  Batches are ``(inputs [B,N,P], mask [B,N] bool, targets [B,N,P])``; a model is called as ``model(inputs, mask)``.
- **pixel** (the paper's autoregressive generation, "1024 tokens per 32×32 image, 8-bit pixels"): the docs'
  numbers fit one token per pixel whose value is an 8-bit *colour*, so the default tokenisation is RGB332
  (3 bits red, 3 green, 2 blue: a 256-colour palette, 1,024 tokens at 32×32, lossy). ``gray`` (8-bit luminance,
  1,024 tokens) and ``channels`` (lossless, one 256-way token per channel value, raster order R,G,B per pixel,
  3,072 tokens) are the alternatives. Batches are ``(x, y)`` with ``x = [BOS, t_0 … t_{T-2}]`` and ``y = t``.

Samplers are position-addressable like the training loop expects: ``sampler(step)`` depends only on
``(seed, step)``; every epoch is a fresh seeded permutation. Evaluators yield fixed batches in dataset order
(``evaluator(limit)``: the first ``limit`` batches, as the authors' "first 51 validation batches").
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .sampling import IndexSampler

PIXEL_MODES = ("rgb332", "gray", "channels")


def to_unit_range(images: Tensor) -> Tensor:
    """uint8 0..255 -> float32 in [-1, 1]."""
    return images.float() / 127.5 - 1.0


def from_unit_range(x: Tensor) -> Tensor:
    """float in [-1, 1] -> uint8 0..255 (clamped, rounded)."""
    return ((x.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)


def patchify(x: Tensor, p: int) -> Tensor:
    """(B, C, H, W) -> (B, H/p · W/p, p·p·C), patches in raster order, values in (p, p, C) order."""
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p)  # (B, C, gh, p, gw, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)  # (B, gh·gw, p·p·C)


def unpatchify(tokens: Tensor, channels: int, height: int, width: int, p: int) -> Tensor:
    """Inverse of :func:`patchify`."""
    B = tokens.shape[0]
    x = tokens.reshape(B, height // p, width // p, p, p, channels)  # (B, gh, gw, p, p, C)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(B, channels, height, width)


class PatchTask:
    """Masked patch reconstruction over uint8 images (see the module docstring).

    Raises:
        ValueError: images not uint8 (N, C, H, W), H or W not divisible by ``patch``, or a bad row range.
    """

    def __init__(self, images: Tensor, patch: int = 4, min_rows: int = 1, max_rows: int = 3):
        if not torch.is_tensor(images) or images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images: expected a uint8 tensor (N, C, H, W), got {getattr(images, 'dtype', images)}")
        _, C, H, W = images.shape
        if patch < 1 or H % patch or W % patch:
            raise ValueError(f"patch: expected a positive divisor of H={H} and W={W}, got {patch}")
        self.grid = (H // patch, W // patch)
        if not 1 <= min_rows <= max_rows <= self.grid[0]:
            raise ValueError(f"max_rows: expected 1 <= min_rows <= max_rows <= {self.grid[0]} patch rows, got "
                             f"{min_rows}..{max_rows}")
        self.images, self.patch, self.min_rows, self.max_rows = images, patch, min_rows, max_rows
        self.n_tokens, self.patch_dim = self.grid[0] * self.grid[1], patch * patch * C

    def __len__(self) -> int:
        return len(self.images)

    def row_masks(self, rng: np.random.Generator, n: int) -> Tensor:
        """(n, N) bool: ``min_rows``..``max_rows`` consecutive patch rows per image, at a uniform start."""
        rows = rng.integers(self.min_rows, self.max_rows + 1, size=n)
        start = rng.integers(0, self.grid[0] - rows + 1)
        r = np.arange(self.grid[0])
        hit = (r >= start[:, None]) & (r < (start + rows)[:, None])  # (n, gh)
        return torch.from_numpy(np.repeat(hit, self.grid[1], axis=1))  # (n, gh·gw), raster token order

    def make_batch(self, idx, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        targets = patchify(to_unit_range(self.images[torch.as_tensor(idx)]), self.patch)  # (B, N, P)
        return targets.masked_fill(mask[..., None], 0.0), mask, targets

    def reconstruct(self, batch: tuple[Tensor, Tensor, Tensor], pred: Tensor, paste_visible: bool = True) -> Tensor:
        """Images in [-1, 1] from predicted patches; with ``paste_visible`` only masked patches come from ``pred``
        (the visible ones are the input itself and carry no loss)."""
        _, mask, targets = batch
        tokens = torch.where(mask[..., None], pred, targets) if paste_visible else pred
        C = self.images.shape[1]
        return unpatchify(tokens, C, *self.images.shape[2:], self.patch).clamp(-1, 1)


def masked_mse_per_sample(pred: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """(B,) mean squared error over the masked patches' values of each sample."""
    err = ((pred.float() - targets.float()) ** 2).mean(-1) * mask  # (B, N)
    return err.sum(-1) / mask.sum(-1).clamp_min(1)


def masked_patch_mse(batch: tuple[Tensor, Tensor, Tensor], output) -> Tensor:
    """Training loss of the patch task: MSE over all masked patch values of the batch."""
    pred = output.logits if hasattr(output, "logits") else output
    _, mask, targets = batch
    err = ((pred.float() - targets.float()) ** 2).mean(-1)  # (B, N)
    return (err * mask).sum() / mask.sum().clamp_min(1)


class PatchSampler(IndexSampler):
    """``sampler(step) -> (inputs, mask, targets)``; masks are drawn from ``(seed, step)``."""

    def __init__(self, task: PatchTask, batch_size: int, seed: int = 0):
        super().__init__(len(task), batch_size, seed)
        self.task = task

    def __call__(self, step: int):
        rng = np.random.default_rng([self.seed, step, 1])
        return self.task.make_batch(self.indices(step), self.task.row_masks(rng, self.batch_size))


class PatchEvaluator:
    """Fixed batches in dataset order with one fixed mask per image (drawn once from ``seed``)."""

    def __init__(self, task: PatchTask, batch_size: int, seed: int = 0):
        self.task, self.batch_size = task, batch_size
        self.masks = task.row_masks(np.random.default_rng([seed, 2**31]), len(task))

    def __call__(self, limit: int | None = None):
        n = len(self.task) if limit is None else min(len(self.task), limit * self.batch_size)
        for b in range(0, n, self.batch_size):
            idx = torch.arange(b, min(n, b + self.batch_size))
            yield self.task.make_batch(idx, self.masks[idx])


class PixelTokenizer:
    """8-bit pixel tokens (see the module docstring); ``bos_id = 256``, so a model needs ``vocab_size = 257``.

    Raises:
        ValueError: unknown ``mode``; images not uint8 (N, 3, H, W); tokens of the wrong length.
    """

    vocab_size, bos_id, model_vocab_size = 256, 256, 257

    def __init__(self, mode: str = "rgb332"):
        if mode not in PIXEL_MODES:
            raise ValueError(f"mode: expected one of {PIXEL_MODES}, got {mode!r}")
        self.mode = mode

    def tokens_per_image(self, height: int, width: int) -> int:
        return height * width * (3 if self.mode == "channels" else 1)

    def encode(self, images: Tensor) -> Tensor:
        if not torch.is_tensor(images) or images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images: expected a uint8 tensor (N, 3, H, W), got {getattr(images, 'shape', images)}")
        x = images.long()
        if self.mode == "channels":
            return x.permute(0, 2, 3, 1).reshape(len(x), -1)  # (N, H·W·3), R,G,B per pixel in raster order
        if self.mode == "gray":
            y = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]  # ITU-R BT.601 luma
            return y.round().clamp(0, 255).long().flatten(1)  # (N, H·W)
        levels = torch.tensor([7, 7, 3], dtype=torch.float64).view(1, 3, 1, 1)
        q = (x * levels / 255).round().long()  # (N, 3, H, W): 3, 3, 2 bits
        return ((q[:, 0] << 5) | (q[:, 1] << 2) | q[:, 2]).flatten(1)  # (N, H·W)

    def decode(self, tokens: Tensor, height: int, width: int) -> Tensor:
        if tokens.dim() != 2 or tokens.shape[1] != self.tokens_per_image(height, width):
            raise ValueError(f"tokens: expected (N, {self.tokens_per_image(height, width)}), got "
                             f"{tuple(tokens.shape)}")
        t = tokens.long().clamp(0, 255)
        if self.mode == "channels":
            return t.reshape(-1, height, width, 3).permute(0, 3, 1, 2).to(torch.uint8).contiguous()
        t = t.reshape(-1, height, width)  # (N, H, W)
        if self.mode == "gray":
            return t.to(torch.uint8)[:, None].expand(-1, 3, -1, -1).contiguous()
        q = torch.stack([t >> 5, (t >> 2) & 7, t & 3], 1).double()  # (N, 3, H, W)
        levels = torch.tensor([7, 7, 3], dtype=torch.float64).view(1, 3, 1, 1)
        return (q * 255 / levels).round().to(torch.uint8)


def _pixel_lm_batch(tokens: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
    bos = torch.full((len(tokens), 1), bos_id, dtype=torch.long)
    return torch.cat([bos, tokens[:, :-1]], 1), tokens  # (B, T) inputs, (B, T) next-token targets


class PixelSampler(IndexSampler):
    """``sampler(step) -> (x, y)`` over pre-tokenised images ``tokens`` (N, T)."""

    def __init__(self, tokens: Tensor, batch_size: int, seed: int = 0, bos_id: int = PixelTokenizer.bos_id):
        super().__init__(len(tokens), batch_size, seed)
        self.tokens, self.bos_id = tokens.long(), bos_id

    def __call__(self, step: int):
        return _pixel_lm_batch(self.tokens[torch.from_numpy(self.indices(step))], self.bos_id)


class PixelEvaluator:
    """Fixed batches of whole images in dataset order; ``evaluator(limit)`` keeps the first ``limit`` batches."""

    def __init__(self, tokens: Tensor, batch_size: int, bos_id: int = PixelTokenizer.bos_id):
        self.tokens, self.batch_size, self.bos_id = tokens.long(), batch_size, bos_id

    def __call__(self, limit: int | None = None):
        n = len(self.tokens) if limit is None else min(len(self.tokens), limit * self.batch_size)
        for b in range(0, n, self.batch_size):
            yield _pixel_lm_batch(self.tokens[b:b + self.batch_size], self.bos_id)
