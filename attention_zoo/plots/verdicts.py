"""The report's forest plot (``results/verdicts.png``): one row per decided claim, its deciding comparison's effect
and interval, the paper's quoted effect beside it, the zero line, colour by verdict. It draws a plain frame
(``claims.summary.forest_frame``), so this layer imports nothing of ``claims``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..io import atomic_savefig
from . import _plt, themed
from .style import VERDICT_COLOURS

COLUMNS = ("label", "kind", "effect", "low", "high", "unit", "mde", "relative", "paper")
CLIP = 100.0  # % of the reference: an interval reaching past it is drawn to the edge, its numbers written there
WIDTH_IN, DPI = 8.6, 100  # 900 px: GitHub's page width, so the figure is shown at its own size
ROW_IN = 0.27  # inches per row: a 9-pt label and its interval bar


def _panels(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str]]:
    """(title, rows in plotted units, x label): relative effects in their own unit; the others divided by their
    MDE, the one scale on which a slope in accuracy points and a difference in CV can sit together."""
    rel = frame[frame["relative"].astype(bool)].copy()
    other = frame[~frame["relative"].astype(bool)].copy()
    for col in ("effect", "low", "high", "paper"):
        other[col] = other[col] / other["mde"].abs()
    finite = ["effect", "low", "high"]  # a row without finite numbers has no place on an axis
    rel, other = (f[np.isfinite(f[finite].to_numpy(float)).all(axis=1)] for f in (rel, other))
    out = []
    if not rel.empty:
        out.append(("effects in % of the reference arm's metric", rel,
                    "effect in the paper's direction, % of the reference arm's metric (positive: as the paper claims)"))
    if not other.empty:
        out.append(("other units (points, slopes, differences), standardised", other,
                    "effect in the paper's direction ÷ its MDE (±1: the smallest effect the run could detect)"))
    return out


@themed
def forest_plot(frame: pd.DataFrame, path: str | Path) -> Path:
    """Draw ``frame`` (columns ``COLUMNS``: one row per claim) to ``path``; the figure grows with the rows."""
    if not isinstance(frame, pd.DataFrame) or frame.empty:
        raise ValueError("frame: expected a non-empty DataFrame of decided claims")
    missing = [c for c in COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"frame: missing columns {missing}")
    figures, _ = _plt()
    panels = _panels(frame)
    if not panels:
        raise ValueError("frame: no row with a finite effect and interval")
    heights = [len(p[1]) + 2.5 for p in panels]
    fig, axes = figures.subplots(len(panels), 1, figsize=(WIDTH_IN, ROW_IN * sum(heights) + 0.8),
                                 gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (title, rows, xlabel) in zip(axes[:, 0], panels):
        _panel(ax, rows.reset_index(drop=True), title, xlabel, clip=CLIP if title.startswith("effects in %") else None)
    from matplotlib.lines import Line2D

    kinds = [k for k in VERDICT_COLOURS if k in set(frame["kind"])]
    handles = [Line2D([], [], color=VERDICT_COLOURS[k], marker="o", lw=2.5, label=k) for k in kinds]
    if frame["paper"].notna().any():
        handles.append(Line2D([], [], color="black", marker="D", markerfacecolor="white", lw=0,
                              label="the paper's effect (its own task)"))
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 4), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    return atomic_savefig(fig, path, dpi=DPI)


def _panel(ax, rows: pd.DataFrame, title: str, xlabel: str, clip: float | None) -> None:
    y = np.arange(len(rows))[::-1]  # the first claim on top, as in the summary table
    lo_all = np.nanmin(rows[["low", "paper"]].to_numpy(float))
    hi_all = np.nanmax(rows[["high", "paper"]].to_numpy(float))
    left, right = min(lo_all, 0.0), max(hi_all, 0.0)
    if clip is not None:
        left, right = max(left, -clip), min(right, clip)
    pad = 0.06 * (right - left or 1.0)
    left, right = left - pad, right + pad
    for yi, r in zip(y, rows.itertuples()):
        colour = VERDICT_COLOURS.get(r.kind, "#000000")
        lo, hi, mid = (float(np.clip(v, left, right)) for v in (r.low, r.high, r.effect))
        ax.plot([lo, hi], [yi, yi], color=colour, lw=2.5, solid_capstyle="butt")
        ax.plot([mid], [yi], "o", color=colour, ms=6)
        if lo > r.low or hi < r.high:  # clipped: an arrow at the edge, the true numbers written inside the axes
            right_cut = hi < r.high
            ax.plot([right if right_cut else left], [yi], ">" if right_cut else "<", color=colour, ms=8)
            ax.annotate(f"{r.effect:+.0f} [{r.low:+.0f}, {r.high:+.0f}]", (hi if right_cut else lo, yi),
                        xytext=(-10 if right_cut else 10, 0), textcoords="offset points", fontsize=9, va="center",
                        ha="right" if right_cut else "left", color=colour)
        if np.isfinite(r.paper):
            ax.plot([float(np.clip(r.paper, left, right))], [yi], "D", color="black", markerfacecolor="white", ms=6)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_xlim(left, right)
    ax.set_yticks(y, rows["label"], fontsize=9)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.tick_params(axis="x", labelsize=9)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(axis="y", visible=False)


__all__ = ["forest_plot"]
