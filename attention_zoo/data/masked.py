"""A masked character LM on a character corpus (``data.text``): the bidirectional stand-in for the masked-LM claims of
Talking-Heads Attention and MoA, and the encoder-side task for MMA.

Random masking, BERT style without the 80/10/10 split: in every window of T characters exactly ⌈rate·T⌉ positions
are chosen uniformly without repetition and replaced by one extra id, ``mask_id`` (= the corpus vocabulary size, so
the model's vocabulary is one larger); the targets are the original characters there and −100 elsewhere. The loss
(masked-character cross-entropy, nats) is read only at the masked positions, so the split's replacements matter
only for what the model sees. Span corruption is not used: one masked character at a time keeps the targets
independent given the context and the trivial reference exact.

Training windows and their masks are addressable by step (``MaskedSampler(step)`` depends on (seed, step) only);
the evaluation windows are the split's non-overlapping windows with masks drawn from a fixed seed, the same for
every arm and training seed. The trivial predictor is the unigram model of the training characters (add-one
smoothed), scored on exactly the masked targets it is compared on (``unigram_loss``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

IGNORE = -100


def n_masked(context: int, rate: float) -> int:
    """Masked positions per window: ⌈rate·T⌉, at least 1.

    Raises:
        ValueError: ``rate`` not in (0, 1) or ``context`` < 2.
    """
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ValueError(f"context: expected an int >= 2, got {context!r}")
    if not (isinstance(rate, (int, float)) and 0 < rate < 1):
        raise ValueError(f"mask_rate: expected a fraction in (0, 1), got {rate!r}")
    return max(1, math.ceil(rate * context))


def mask_windows(windows: np.ndarray, k: int, mask_id: int, rng: np.random.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, T] character ids -> (inputs with ``k`` positions per row set to ``mask_id``, targets −100 except there)."""
    n, T = windows.shape
    pos = np.argsort(rng.random((n, T)), axis=1, kind="stable")[:, :k]
    rows = np.arange(n)[:, None]
    x = windows.astype(np.int64)
    y = np.full((n, T), IGNORE, dtype=np.int64)
    y[rows, pos] = x[rows, pos]
    x[rows, pos] = mask_id
    return torch.from_numpy(x), torch.from_numpy(y)


class MaskedSampler:
    """Random training windows of one stream, masked; ``sampler(step)`` depends only on (seed, step)."""

    def __init__(self, stream: np.ndarray, context: int, batch_size: int, rate: float, mask_id: int, seed: int = 0):
        self.k = n_masked(context, rate)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if len(stream) < context:
            raise ValueError(f"stream: {len(stream)} characters, shorter than one window of {context}")
        self.stream, self.context, self.batch_size, self.rate = stream, context, batch_size, rate
        self.mask_id, self.seed = mask_id, seed
        self._offsets = np.arange(context)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([0x4D4C, self.seed, step])
        starts = rng.integers(0, len(self.stream) - self.context + 1, size=self.batch_size)
        return mask_windows(self.stream[starts[:, None] + self._offsets], self.k, self.mask_id, rng)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "context": self.context, "batch_size": self.batch_size, "rate": self.rate,
                "mask_id": self.mask_id, "stream_length": len(self.stream)}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise ValueError(f"sampler: checkpoint was written with {state}, this sampler is {self.state_dict()}")


class MaskedEvaluator:
    """A split's non-overlapping windows with fixed masks; ``evaluator(limit)`` yields (x, y) batches (``limit``:
    that many batches' worth of windows, evenly spread)."""

    def __init__(self, data: np.ndarray, context: int, batch_size: int, rate: float, mask_id: int,
                 mask_seed: int = 0):
        k = n_masked(context, rate)
        n = len(data) // context
        if n < 1:
            raise ValueError(f"data: {len(data)} characters, shorter than one window of {context}")
        windows = data[: n * context].reshape(n, context)
        self.x, self.y = mask_windows(windows, k, mask_id, np.random.default_rng([0x4D45, mask_seed]))
        self.batch_size = batch_size

    @property
    def n_targets(self) -> int:
        return int((self.y != IGNORE).sum())

    def __call__(self, limit: int | None = None):
        idx = np.arange(len(self.x))
        if limit is not None and limit * self.batch_size < len(idx):
            idx = np.unique(np.linspace(0, len(idx) - 1, limit * self.batch_size).round().astype(np.int64))
        for i in range(0, len(idx), self.batch_size):
            sel = torch.from_numpy(idx[i:i + self.batch_size])
            yield self.x[sel], self.y[sel]


def unigram_loss(train_streams: list[np.ndarray], vocab_size: int, batches) -> float:
    """Cross-entropy (nats) of the training characters' add-one-smoothed frequencies on the masked targets of
    ``batches``: the trivial predictor a masked LM must beat."""
    counts = sum(np.bincount(t, minlength=vocab_size) for t in train_streams).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for _, y in batches:
        t = y[y != IGNORE].numpy()
        total += float(-logp[t].sum())
        n += len(t)
    return total / max(n, 1)


__all__ = ["IGNORE", "MaskedEvaluator", "MaskedSampler", "mask_windows", "n_masked", "unigram_loss"]
