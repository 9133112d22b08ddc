"""Figures of DAMCHA's metric (Appendices F, G, H): metric heatmaps and block-wise gradient norms.

- App. F / H: heatmaps of ``model.get_M_matrices()`` (one panel per layer, diverging colormap, symmetric limits).
- App. G: the H×H grid of ‖∂L/∂M_ij‖_F, taken on the explicit (non-fused) path: the generator's D² outputs are
  the metric M before RowSum, so their gradient, cut into d_h×d_h blocks, is ∂L/∂M_ij. DAMCHA computes the grid
  itself (``variants.damcha.block_gradient_norms``, re-exported here); this module draws it.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch import Tensor

from ..io import atomic_savefig
from ..plots import _plt
from ..variants.damcha import block_gradient_norms, explicit_rowsum, metric_generators

__all__ = ["block_gradient_norms", "explicit_rowsum", "gradient_grid_plot", "metric_generators", "metric_heatmaps"]


def metric_heatmaps(matrices: list[tuple[str, Tensor]], path: str | Path, title: str, n_heads: int | None = None,
                    max_panels: int = 12) -> Path:
    """One heatmap per (layer, M), shared symmetric colour limits, head-block grid lines."""
    plt, sns = _plt()
    mats = matrices[:max_panels]
    if not mats:
        raise ValueError("matrices: nothing to plot (baselines have no metric)")
    cols = min(4, len(mats))
    rows = math.ceil(len(mats) / cols)
    vmax = max(float(M.abs().max()) for _, M in mats) or 1.0
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (name, M) in zip(axes.flat, mats):
        sns.heatmap(M.detach().cpu().numpy(), ax=ax, cmap="RdBu_r", vmin=-vmax, vmax=vmax, center=0.0, square=True,
                    xticklabels=False, yticklabels=False, cbar=ax is axes.flat[len(mats) - 1])
        if n_heads:
            step = M.shape[0] // n_heads
            for k in range(1, n_heads):
                ax.axhline(k * step, color="k", lw=0.3)
                ax.axvline(k * step, color="k", lw=0.3)
        ax.set_title(name, fontsize=7)
    for ax in list(axes.flat)[len(mats):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    out = atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return out


def gradient_grid_plot(grids: dict[str, Tensor], path: str | Path, title: str) -> Path:
    plt, sns = _plt()
    names = list(grids)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), squeeze=False)
    for ax, name in zip(axes.flat, names):
        g = grids[name].detach().cpu().numpy()
        sns.heatmap(g, ax=ax, cmap="viridis", square=True)
        ax.set_xlabel("block column j")
        ax.set_ylabel("block row i")
        ax.set_title(name, fontsize=7)
    fig.suptitle(title, fontsize=9)
    out = atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return out
