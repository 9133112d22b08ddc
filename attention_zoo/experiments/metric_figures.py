"""Figures of DAMCHA's metric (Appendices F, G, H): metric heatmaps and block-wise gradient norms.

- App. F / H: heatmaps of ``model.get_M_matrices()`` (one panel per layer, diverging colormap, symmetric limits).
- App. G: the H×H grid of ‖∂L/∂M_ij‖_F, taken on the explicit (non-fused) path: the generator's D² outputs are
  the metric M before RowSum, so their gradient, cut into d_h×d_h blocks, is ∂L/∂M_ij.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from pathlib import Path

from torch import Tensor, nn

from ..io import atomic_savefig
from ..report import _plt
from ..variants.damcha_generator import StructuredMLPForM


def generators(model: nn.Module) -> list[tuple[str, StructuredMLPForM]]:
    return [(n or "generator", m) for n, m in model.named_modules() if isinstance(m, StructuredMLPForM)]


@contextlib.contextmanager
def explicit_rowsum(model: nn.Module):
    """Temporarily route every generator through the explicit D×D path (same values and gradients), without
    activation checkpointing, so that the generator outputs M stay in the autograd graph."""
    saved = [(g, g.cfg) for _, g in generators(model)]
    try:
        for g, cfg in saved:
            g.cfg = replace(cfg, fused_rowsum=False)
            g.checkpoint_chunks = False
        yield
    finally:
        for g, cfg in saved:
            g.cfg = cfg
            g.checkpoint_chunks = True


def block_gradient_norms(model: nn.Module, loss_fn) -> dict[str, Tensor]:
    """{generator name: [H, H] grid of ‖∂L/∂M_ij‖_F} for one evaluation of ``loss_fn(model) -> scalar``.

    Summed over the batch (and positions for causal prefix metrics). Needs mlp-mode generators without compact rank
    (where the generator output *is* M). Raises ValueError otherwise.
    """
    outputs: dict[str, list[Tensor]] = {}
    hooks = []
    for name, gen in generators(model):
        if gen.cfg.compact_rank or gen.metric_mode != "mlp" or gen.collapsed:
            raise ValueError(f"model: generator {name} does not output M directly (mlp mode, full D² output needed)")

        def keep(_mod, _inp, out, name=name):
            out.retain_grad()
            outputs.setdefault(name, []).append(out)

        hooks.append(gen.out.register_forward_hook(keep))
    try:
        with explicit_rowsum(model):
            model.zero_grad(set_to_none=True)
            loss_fn(model).backward()
    finally:
        for h in hooks:
            h.remove()
    grids = {}
    for name, outs in outputs.items():
        gen = dict(generators(model))[name]
        H, dh = gen.n_heads, gen.head_dim
        # A causal shared generator applies its last layer once per layer to the same M: gradients add up first.
        grad = sum(o.grad for o in outs).unflatten(-1, (H, dh, H, dh)).flatten(0, -5)  # (N, H, dh, H, dh)
        grids[name] = grad.square().sum((0, 2, 4)).sqrt()  # (H, H)
    return grids


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
