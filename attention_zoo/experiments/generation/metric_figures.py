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

from ...io import atomic_savefig
from ...plots import _plt, themed
from ...variants.damcha import block_gradient_norms, explicit_rowsum, metric_generators

__all__ = ["block_gradient_norms", "explicit_rowsum", "gradient_grid_plot", "metric_generators", "metric_heatmaps"]


def _dedupe(mats: list[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
    """Identical metrics (pure sharing without a layer bias: every layer's M is the same) become one panel."""
    out: list[tuple[str, Tensor]] = []
    for name, M in mats:
        for i, (other, N) in enumerate(out):
            if M.shape == N.shape and bool((M == N).all()):
                out[i] = (f"{other} = {name}", N)
                break
        else:
            out.append((name, M))
    return out


@themed
def metric_heatmaps(matrices: list[tuple[str, Tensor]], path: str | Path, title: str, n_heads: int | None = None,
                    max_panels: int = 12) -> Path:
    """One equal-sized heatmap per distinct (layer, M), each with its own symmetric colour limits and colour bar
    (so a small layer is not washed out by a large one), head-block grid lines."""
    plt, sns = _plt()
    mats = _dedupe(matrices)[:max_panels]
    if not mats:
        raise ValueError("matrices: nothing to plot (baselines have no metric)")
    cols = min(4, len(mats))
    rows = math.ceil(len(mats) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, M) in zip(axes.flat, mats):
        vmax = float(M.abs().max()) or 1.0
        sns.heatmap(M.detach().cpu().numpy(), ax=ax, cmap="RdBu_r", vmin=-vmax, vmax=vmax, center=0.0, square=True,
                    xticklabels=False, yticklabels=False, cbar_kws={"shrink": 0.75})
        if n_heads:
            step = M.shape[0] // n_heads
            for k in range(1, n_heads):
                ax.axhline(k * step, color="k", lw=0.3)
                ax.axvline(k * step, color="k", lw=0.3)
        ax.set_title(f"{name}\n(colour limits ±{vmax:.3g})", fontsize=7)
    for ax in list(axes.flat)[len(mats):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = atomic_savefig(fig, path, dpi=110)
    return out


@themed
def gradient_grid_plot(grids: dict[str, Tensor], path: str | Path, title: str) -> Path:
    """The H×H grids of ‖∂L/∂M_ij‖_F on one shared colour scale (so a gap between layers shows), each panel's own
    maximum in its title."""
    plt, sns = _plt()
    names = list(grids)
    vmax = max(float(grids[n].max()) for n in names) or 1.0
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names) + 0.8, 3.4), squeeze=False)
    for k, (ax, name) in enumerate(zip(axes.flat, names)):
        g = grids[name].detach().cpu().numpy()
        sns.heatmap(g, ax=ax, cmap="viridis", square=True, vmin=0.0, vmax=vmax, cbar=k == len(names) - 1,
                    cbar_kws={"label": "‖∂L/∂M_ij‖_F (shared scale)", "shrink": 0.75})
        ax.set_xlabel("block column j", fontsize=8)
        ax.set_ylabel("block row i", fontsize=8)
        ax.set_title(f"{name} (max {float(g.max()):.3g})", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = atomic_savefig(fig, path, dpi=110)
    return out
