"""The seed axis of a grouped ensemble (``engine.ensemble``), as the modules that hold raw parameters read it.

A grouped model holds S seeds' parameters stacked on a new leading axis and takes the S seeds' batches concatenated
along the batch axis, seed-major ([S·B, ...]). A module that lists a raw parameter in its ``ensemble_parameters``
finds the seed count from that parameter (``seeds_of``) and views its batch per seed (``by_seed``); everything else
works on the folded batch unchanged. With no seed axis (S = 1 and the parameter's own shape) the module takes its
ordinary path, so a model that is not grouped computes exactly what it did before.
"""

from __future__ import annotations

from torch import Tensor


def seeds_of(param: Tensor, base_dim: int) -> int:
    """How many seeds ``param`` holds: its leading axis when it has one more dimension than ``base_dim`` (its shape
    in one model), else 0 (not grouped)."""
    return param.shape[0] if param.dim() == base_dim + 1 else 0


def by_seed(x: Tensor, n_seeds: int) -> Tensor:
    """A seed-major batch [S·B, ...] viewed as [S, B, ...]."""
    return x.unflatten(0, (n_seeds, x.shape[0] // n_seeds))


__all__ = ["by_seed", "seeds_of"]
