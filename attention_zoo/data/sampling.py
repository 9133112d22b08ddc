"""Deterministic, resumable batch order shared by every data source."""

from __future__ import annotations

import numpy as np


class IndexSampler:
    """Batch ``step`` holds global positions ``step·B … step·B+B−1`` of an endless stream of epochs, each epoch a
    permutation seeded by ``(seed, epoch)``: the data position is the step, so resumption is exact."""

    # Every batch has one shape (a seed ensemble can stack its members' batches); a sampler whose batches are padded
    # to their own longest row says False, and its members train one at a time (``engine.members.check_samplers``).
    fixed_shape = True

    def __init__(self, n: int, batch_size: int, seed: int = 0):
        for arg, v in (("n", n), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{arg}: expected a positive int, got {v!r}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self._perm = (-1, None)

    def indices(self, step: int) -> np.ndarray:
        pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
        epochs, offsets = np.divmod(pos, self.n)
        out = np.empty(self.batch_size, dtype=np.int64)
        for e in np.unique(epochs):
            if self._perm[0] != e:
                self._perm = (int(e), np.random.default_rng([self.seed, int(e)]).permutation(self.n))
            sel = epochs == e
            out[sel] = self._perm[1][offsets[sel]]
        return out

    def state_dict(self) -> dict:
        return {"kind": type(self).__name__, "n": self.n, "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise ValueError(f"sampler: checkpoint was written with {state}, this sampler is {self.state_dict()}")
