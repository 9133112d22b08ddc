"""Multi-query associative recall (MQAR; Arora, Eyuboglu et al., "Zoology", ICLR 2024, arXiv 2312.04927).

A sequence of length T opens with n key–value pairs, then asks for every key once; the model must answer each query
with the value that followed that key. The rules, as the Zoology generator (``zoology/data/multiquery_ar.py``) sets
them:

- keys are drawn from ids 1 … V/2 − 1 and values from V/2 … V − 1, each without repetition inside one sequence
  (id 0 is the filler);
- the context is ``k₁ v₁ k₂ v₂ … kₙ vₙ`` (2n tokens); the remaining T − 2n positions form (T − 2n)/2 slots of two
  tokens, and the n queries go to n distinct slots chosen with probability ∝ a·i^(a−1) for slot i = 1, 2, … (a power
  law with ``power_a`` a = 0.01 by default: queries cluster near the context, with a long tail);
- a query puts the key at the first position of its slot; the target at that position is the key's value (the
  model answers as a next-token prediction); every other target is −100 (ignored); the other query positions hold
  the filler 0 (``random_non_queries=False``, Zoology's Figure-2 setting) or a random id.

Accuracy is the mean over the query positions. A model that knows only which values are in context, not which key
each follows, is right 1/n of the time: the task's chance level (``chance_accuracy``), the learned-at-all reference.
Zoology asserts V > T; nothing here needs it, so the CPU presets keep V small and T up to 256.

Batches are addressable: ``MQARSampler(spec, batch_size, seed)(step)`` depends only on (spec, seed, step), a fresh
batch per step (an endless training stream: no example repeats), and ``mqar_examples(spec, n, seed)`` gives fixed
validation and test sets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

IGNORE = -100


@dataclass(frozen=True)
class MQARSpec:
    """One rung of the ladder: vocabulary V, sequence length T, number of pairs n, the power law's a.

    Raises:
        ValueError: V < 4 or odd, n < 1, T < 4n (the context and one slot per query must fit), fewer than n keys
            or values in the vocabulary, ``power_a`` not in (0, 1].
    """

    vocab_size: int
    seq_len: int
    n_pairs: int
    power_a: float = 0.01
    random_non_queries: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_pairs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if self.vocab_size < 4 or self.vocab_size % 2:
            raise ValueError(f"vocab_size: expected an even size >= 4, got {self.vocab_size}")
        if self.seq_len < 4 * self.n_pairs or self.seq_len % 2:
            raise ValueError(f"seq_len: expected an even length >= 4·n_pairs = {4 * self.n_pairs}, got {self.seq_len}")
        if self.vocab_size // 2 - 1 < self.n_pairs:
            raise ValueError(f"n_pairs: {self.n_pairs} distinct keys need vocab_size >= {2 * self.n_pairs + 2}")
        if not (isinstance(self.power_a, (int, float)) and 0 < self.power_a <= 1):
            raise ValueError(f"power_a: expected a number in (0, 1], got {self.power_a!r}")

    @property
    def n_slots(self) -> int:
        return (self.seq_len - 2 * self.n_pairs) // 2

    @property
    def chance_accuracy(self) -> float:
        """Right 1/n of the time: a value from the context, picked without knowing the key's."""
        return 1.0 / self.n_pairs

    def as_dict(self) -> dict:
        return asdict(self)


def _distinct(rng: np.random.Generator, n: int, pool: np.ndarray, k: int, logp: np.ndarray | None = None
              ) -> np.ndarray:
    """[n, k] draws without repetition per row from ``pool`` (uniform, or ∝ exp(logp) by the Gumbel top-k trick,
    which samples without replacement exactly as sequential draws renormalised after each pick do)."""
    scores = rng.random((n, len(pool))) if logp is None else logp - np.log(-np.log(rng.random((n, len(pool)))))
    return pool[np.argsort(-scores, axis=1, kind="stable")[:, :k]]


def mqar_batch(spec: MQARSpec, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences: (inputs [n, T], targets [n, T]) int64, targets −100 except at the query positions."""
    V, T, p = spec.vocab_size, spec.seq_len, spec.n_pairs
    keys = _distinct(rng, n, np.arange(1, V // 2), p)
    values = _distinct(rng, n, np.arange(V // 2, V), p)
    slot = np.arange(1, spec.n_slots + 1, dtype=np.float64)
    logp = np.log(spec.power_a) + (spec.power_a - 1) * np.log(slot)  # ∝ a·i^(a−1)
    gaps = _distinct(rng, n, np.arange(spec.n_slots), p, logp)  # [n, p] slot of each key's query
    inputs = np.zeros((n, T), dtype=np.int64)
    inputs[:, 0:2 * p:2], inputs[:, 1:2 * p:2] = keys, values
    if spec.random_non_queries:
        tail = inputs[:, 2 * p:]
        tail[:] = rng.integers(0, V, size=tail.shape)
    pos = 2 * p + 2 * gaps  # [n, p]
    rows = np.arange(n)[:, None]
    inputs[rows, pos] = keys
    targets = np.full((n, T), IGNORE, dtype=np.int64)
    targets[rows, pos] = values
    return torch.from_numpy(inputs), torch.from_numpy(targets)


class MQARSampler:
    """Training batches addressable by step: ``sampler(step)`` depends only on (spec, seed, step)."""

    def __init__(self, spec: MQARSpec, batch_size: int, seed: int):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        self.spec, self.batch_size, self.seed = spec, batch_size, seed

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return mqar_batch(self.spec, self.batch_size, np.random.default_rng([0x4D51, self.seed, step]))

    def state_dict(self) -> dict:
        return {"spec": self.spec.as_dict(), "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise ValueError(f"sampler: checkpoint was written with {state}, this sampler is {self.state_dict()}")


def mqar_examples(spec: MQARSpec, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed set of ``n`` sequences (validation, test), the same for every arm and training seed."""
    return mqar_batch(spec, n, np.random.default_rng([0x4D52, seed]))


def batches(data: tuple[torch.Tensor, torch.Tensor], batch_size: int, limit: int | None = None):
    """``data`` in batches of ``batch_size`` (``limit``: that many batches' worth, evenly spread)."""
    x, y = data
    idx = np.arange(len(x))
    if limit is not None and limit * batch_size < len(idx):
        idx = np.unique(np.linspace(0, len(idx) - 1, limit * batch_size).round().astype(np.int64))
    for i in range(0, len(idx), batch_size):
        sel = torch.from_numpy(idx[i:i + batch_size])
        yield x[sel], y[sel]


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(correct, scored) over the positions whose target is not −100."""
    keep = targets != IGNORE
    return int((logits.argmax(-1)[keep] == targets[keep]).sum()), int(keep.sum())


__all__ = ["IGNORE", "MQARSampler", "MQARSpec", "accuracy", "batches", "mqar_batch", "mqar_examples"]
