"""Figures: the plot helpers the reports share (seaborn/matplotlib, a separate step that reads the long frames), drawn
in the palette of ``plots_style`` (one colour per arm across every figure), which this module re-exports."""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import atomic_savefig
from ..report import interval_kind, t_band
from .style import (  # noqa: F401
    CONTROL_HATCH,
    CONTROL_LINESTYLE,
    CONTROL_STYLES,
    EXTRA_COLOURS,
    FLAVOUR_HATCH,
    FLAVOUR_LINESTYLE,
    OPTION_HATCH,
    OPTION_LINESTYLE,
    OTHER_COLOURS,
    REFERENCE_COLOUR,
    UNSTABLE_HATCH,
    VARIANT_COLOURS,
    SeriesStyle,
    parse_label,
    series_styles,
    sort_labels,
    variant_colour,
    variant_palette,
)


# ---- plots (seaborn, a separate step that reads the long frame) -------------------------------------------
class _Figures:
    """``pyplot.subplots`` on a plain ``Figure``: nothing registers with the caller's pyplot (its backend, its list
    of open figures), and the figure is freed with its last reference (no ``close``)."""

    @staticmethod
    def subplots(*args, figsize=None, **kwargs):
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
        return fig, fig.subplots(*args, **kwargs)


def _plt():
    """(figure maker, seaborn) for a plotting function decorated with ``themed``."""
    import seaborn as sns

    return _Figures, sns


def themed(fn):
    """Run a plotting function under the package's seaborn theme inside ``matplotlib.rc_context``: the caller's
    rcParams are restored on return (a library is a guest in the user's process)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import matplotlib
        import seaborn as sns

        with matplotlib.rc_context():
            sns.set_theme(style="whitegrid", context="paper")
            return fn(*args, **kwargs)

    return wrapper


def legend_outside(ax, handles=None, labels=None, title: str | None = None) -> None:
    """The legend to the right of the axes, outside the data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, title=title, fontsize=7, title_fontsize=7, bbox_to_anchor=(1.02, 1),
                  loc="upper left", borderaxespad=0.0, frameon=False)


def _patch_handles(styles: dict[str, SeriesStyle], order: list[str]) -> list:
    from matplotlib.patches import Patch

    return [Patch(facecolor=styles[k]["color"], hatch=styles[k]["hatch"], edgecolor="white", label=k) for k in order]


@themed
def bar_plot(df: pd.DataFrame, x: str, y: str, hue: str, path: str | Path, title: str, ylabel: str,
             log: bool = False, errorbar=t_band, xlabel: str | None = None) -> Path:
    """Grouped vertical bars, colour by variant, hatch by flavour; error bars = ``errorbar`` over the repeated rows
    (default: 95 % Student-t interval over seeds)."""
    plt, sns = _plt()
    hue_order = sort_labels(df[hue].astype(str))
    styles = series_styles(hue_order)
    fig, ax = plt.subplots(figsize=(7.5, 4))
    sns.barplot(data=df.assign(**{hue: df[hue].astype(str)}), x=x, y=y, hue=hue, hue_order=hue_order,
                palette={k: s["color"] for k, s in styles.items()}, saturation=1.0, errorbar=errorbar, capsize=0.1,
                err_kws={"linewidth": 1.0}, ax=ax)
    for container, level in zip(ax.containers, hue_order):
        for bar in container:
            bar.set_hatch(styles[level]["hatch"])
            bar.set_edgecolor("white")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel if xlabel is not None else x)
    if log:
        ax.set_yscale("log")
    legend_outside(ax, _patch_handles(styles, hue_order), hue_order)
    out = atomic_savefig(fig, path, dpi=120)
    return out


def suptitle(fig, title: str, fontsize: float = 10) -> None:
    """The figure title above the panels' own titles: each line wrapped to the figure's width (a one-line title
    wider than the panels would widen the saved image and shrink them), and the panels move down by the title's
    lines, so a long title never overlaps them."""
    width = max(40, int(fig.get_figwidth() * 72 / (0.65 * fontsize)))  # characters: ≈ 0.6 em each, a margin
    title = "\n".join(textwrap.fill(line, width) for line in title.split("\n"))
    height = fig.get_figheight()
    lines = title.count("\n") + 1
    fig.subplots_adjust(top=max(0.45, 1 - (0.2 * lines + 0.38) / height))
    fig.suptitle(title, fontsize=fontsize, y=1 - 0.08 / height)


def caption(fig, text: str | None, fontsize: float = 7) -> None:
    """A caption line under the figure (e.g. the tuned setting of each arm); the saved box grows to hold it."""
    if text:
        fig.text(0.01, -0.02, "\n".join(textwrap.wrap(text, 150)), ha="left", va="top", fontsize=fontsize)


@themed
def line_plot(df: pd.DataFrame, x: str, y: str, hue: str, path: str | Path, title: str, ylabel: str,
              loglog: bool = False, errorbar=t_band, xlabel: str | None = None, panel: str | None = None,
              panel_title: str = "{}", ref_slopes: dict[str, float] | None = None, nested: bool = False,
              note: str | None = None) -> Path:
    """One line per ``hue`` series (mean over repeated rows, e.g. seeds, with an ``errorbar`` band: default the
    95 % Student-t interval), colour by variant, dashed for ``damcha_repo``, dotted for option rows; ``panel`` makes
    one subplot per value (shared y); ``loglog``: log2 x, log10 y. ``ref_slopes`` ({"∝ T²": 2, …}, log-log only)
    draws grey reference power laws through each panel's smallest x; ``nested`` draws the series as open markers
    shrinking in drawing order, so series that coincide show as concentric rings instead of hiding each other.
    The legend sits outside the data; ``note``: a caption line."""
    plt, sns = _plt()
    labels = sort_labels(df[hue].astype(str))
    styles = series_styles(labels)
    panels = list(dict.fromkeys(df[panel])) if panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.8, 3.8), squeeze=False, sharey=True)
    data = df.assign(**{hue: df[hue].astype(str)})
    n = max(1, len(labels) - 1)
    for ax, pv in zip(axes[0], panels):
        part = data if panel is None else data[data[panel] == pv]
        for i, lab in enumerate(labels):
            sub = part[part[hue] == lab]
            if sub.empty:
                continue
            extra = ({"markersize": 3.5 + 8.0 * (n - i) / n, "fillstyle": "none", "markeredgewidth": 1.2,
                      "markeredgecolor": styles[lab]["color"], "linewidth": 0.8 + 1.4 * (n - i) / n}
                     if nested else {"markersize": 4})
            sns.lineplot(data=sub, x=x, y=y, errorbar=errorbar, label=lab, ax=ax, **styles[lab].line, **extra)
        if ref_slopes and loglog and not part.empty:
            means = part.groupby(x)[y].mean()
            xs = means.index.to_numpy(float)
            y0 = float(np.exp(np.log(part[part[x] == xs.min()][y].clip(lower=1e-30)).mean()))
            dashes = [(0, (1, 2)), (0, (5, 2, 1, 2)), (0, (6, 3))]
            for j, (name, k) in enumerate(ref_slopes.items()):
                ax.plot(xs, y0 * (xs / xs.min()) ** k, color="#888888", linestyle=dashes[j % len(dashes)],
                        linewidth=1.0, label=name, zorder=0)
        if panel is not None:
            ax.set_title(panel_title.format(pv), fontsize=9)
        ax.set_xlabel(xlabel if xlabel is not None else x)
        ax.set_ylabel(ylabel)
        if loglog:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    handles, names = {}, []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                names.append(lab)
    legend_outside(axes[0][-1], [handles[n] for n in names], names)
    suptitle(fig, title)
    caption(fig, note)
    return atomic_savefig(fig, path, dpi=120)


@themed
def barh_plot(df: pd.DataFrame, y: str, x: str, path: str | Path, title: str, xlabel: str, panel: str | None = None,
              flag: str | None = None, lo: str | None = None, hi: str | None = None, log: bool = False,
              panel_title: str = "{}", sharex: bool = False) -> Path:
    """Horizontal bars, one per ``y`` label (variant/flavour rows: readable with many long labels), colour by
    variant, hatch by flavour; ``panel`` gives one subplot per value (same unit, shared rows); ``lo``/``hi``
    columns draw error bars (e.g. q25/q75); bars whose boolean column ``flag`` is true (``unstable`` timings) are
    faded and cross-hatched; ``sharex`` puts the panels on one x scale (counts of the same quantity)."""
    plt, _ = _plt()
    order = sort_labels(df[y].astype(str))
    styles = series_styles(order)
    panels = list(dict.fromkeys(df[panel])) if panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 2.6, 1.2 + 0.28 * len(order)),
                             squeeze=False, sharey=True, sharex=sharex)
    pos = {lab: i for i, lab in enumerate(order)}
    any_flag = False
    for ax, pv in zip(axes[0], panels):
        part = df if panel is None else df[df[panel] == pv]
        for _, r in part.iterrows():
            lab = str(r[y])
            flagged = flag is not None and flag in part and str(r[flag]).lower() == "true"
            any_flag |= flagged
            s = styles[lab]
            xerr = None
            if lo and hi and pd.notna(r.get(lo)) and pd.notna(r.get(hi)):
                xerr = [[max(0.0, r[x] - r[lo])], [max(0.0, r[hi] - r[x])]]
            ax.barh(pos[lab], r[x], color=s["color"], hatch=UNSTABLE_HATCH if flagged else s["hatch"],
                    alpha=0.45 if flagged else 1.0, edgecolor="white", xerr=xerr,
                    error_kw={"elinewidth": 1.0, "capsize": 2, "ecolor": "black"})
        ax.set_yticks(range(len(order)), order, fontsize=7)
        ax.set_xlabel(xlabel)
        if panel is not None:
            ax.set_title(panel_title.format(pv), fontsize=9)
        if log:
            ax.set_xscale("log")
    axes[0][0].invert_yaxis()  # first row on top (the axes share y)
    from matplotlib.patches import Patch

    key = [Patch(facecolor="#bbbbbb", edgecolor="white", label="paper flavour"),
           Patch(facecolor="#bbbbbb", hatch=FLAVOUR_HATCH["damcha_repo"], edgecolor="white",
                 label="damcha_repo flavour")]
    if any(parse_label(lab)[2] for lab in order):
        key.append(Patch(facecolor="#bbbbbb", hatch=OPTION_HATCH, edgecolor="white", label="extra options"))
    if any_flag:
        key.append(Patch(facecolor="#bbbbbb", hatch=UNSTABLE_HATCH, alpha=0.45, edgecolor="white",
                         label="unstable timing (faded)"))
    if lo and hi:
        key.append(Patch(facecolor="none", edgecolor="none", label="error bars: q25–q75"))
    legend_outside(axes[0][-1], key, [k.get_label() for k in key])
    suptitle(fig, title)
    out = atomic_savefig(fig, path, dpi=120)
    return out


def kde_plot(ax, df: pd.DataFrame, x: str, hue: str, non_negative: bool = False,
             bounds: tuple[float | None, float | None] | None = None, counts: bool = False) -> None:
    """One Gaussian KDE per ``hue`` series (each normalised on its own), colour by variant, dashed for
    ``damcha_repo``; ``bounds`` (lo, hi), e.g. (0, None) for a non-negative score or (0, 1) for an F1, keep every
    density inside the metric's range (``clip``, no mass drawn outside; ``non_negative`` is (0, None)). The x axis
    follows the data, not the bound. ``counts`` puts each curve's n in its legend label."""
    _, sns = _plt()
    bounds = bounds if bounds is not None else ((0.0, None) if non_negative else None)
    labels = sort_labels(df[hue].astype(str))
    styles = series_styles(labels)
    for lab in labels:
        vals = df.loc[df[hue].astype(str) == lab, x].dropna()
        if len(vals) < 2:
            continue
        sns.kdeplot(x=vals.to_numpy(float), ax=ax, color=styles[lab]["color"], linestyle=styles[lab]["linestyle"],
                    label=f"{lab} (n = {len(vals)})" if counts else lab, warn_singular=False,
                    clip=bounds, cut=0 if bounds is not None else 3)


@themed
def interval_plot(df: pd.DataFrame, x: str, hue: str, path: str | Path, title: str, ylabel: str, xlabel: str,
                  mean: str = "mean", lo: str = "low", hi: str = "high", paper: dict | None = None,
                  ref_lines: dict | None = None, zero: bool | str = True, integer_x: bool = False,
                  note: str | None = None) -> Path:
    """Per-series points with interval bars (already computed: ``mean``, ``lo``, ``hi`` columns) joined by lines,
    dodged a little along x so no series hides another; a zero line (paired differences); ``paper``: {label: {x: y}}
    drawn as black stars beside ours; ``ref_lines``: {label: y} horizontal reference lines in their own style;
    ``zero`` a string: the zero line's legend label (the reference arm); ``note``: a caption line."""
    plt, _ = _plt()
    labels = sort_labels(df[hue].astype(str))
    styles = series_styles(labels)
    xs = sorted(df[x].astype(float).unique())
    span = (xs[-1] - xs[0]) or 1.0
    gap = min(b - a for a, b in zip(xs, xs[1:])) if len(xs) > 1 else span
    step = min(0.3 * gap, 0.05 * span) / max(1, len(labels) - 1)  # a small dodge: no series hides another
    fig, ax = plt.subplots(figsize=(7.8, 4.2))
    for i, lab in enumerate(labels):
        part = df[df[hue].astype(str) == lab].sort_values(x)
        off = (i - (len(labels) - 1) / 2) * step
        xv, yv = part[x].astype(float) + off, part[mean].astype(float)
        err = [(yv - part[lo]).clip(lower=0).fillna(0), (part[hi] - yv).clip(lower=0).fillna(0)]
        s = styles[lab]
        ax.errorbar(xv, yv, yerr=err, color=s["color"], linestyle=s["linestyle"], marker=s["marker"], markersize=4,
                    capsize=2, linewidth=1.2, label=lab)
    if zero:
        ax.axhline(0.0, color="black", lw=0.8, **({"label": zero} if isinstance(zero, str) else {}))
    for j, (name, y) in enumerate((ref_lines or {}).items()):
        ax.axhline(y, color=REFERENCE_COLOUR, lw=1.0, linestyle=(":", "-.", "--")[j % 3], label=name)
    for name, points in (paper or {}).items():
        ax.scatter(list(points), list(points.values()), marker="*", s=150, color=REFERENCE_COLOUR, zorder=5,
                   label=name)
    if integer_x:
        ax.set_xticks(xs)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    legend_outside(ax)
    caption(fig, note)
    out = atomic_savefig(fig, path, dpi=120)
    return out


def interval_words(df: pd.DataFrame) -> str:
    """What the whiskers of a ``claims.paired.delta_frame`` are (``interval_kind``): a 95 % t interval from 5 seeds,
    below it the range of the seeds (not a confidence interval, so never labelled as one)."""
    return {"t": "95 % t interval", "range": "range of the seeds (n < 5: no interval)",
            "mixed": "95 % t interval (n ≥ 5); range of the seeds (n < 5)"}[interval_kind(df)]


def interval_title(df: pd.DataFrame) -> str:
    """A delta figure's title words for what it shows: "mean and 95 % interval", or the range below 5 seeds."""
    return "mean and 95 % interval" if interval_kind(df) == "t" else f"mean and {interval_words(df)}"


@themed
def delta_plot(df: pd.DataFrame, panel: str, path: str | Path, title: str, xlabel: str, arm: str = "arm",
               paper: dict | None = None, panel_title: str = "{}", paper_label: str = "paper",
               reference: str | None = None, interval: str | None = None, note: str | None = None) -> Path:
    """Seed-paired differences vs the reference arm: one dot with its interval whisker per arm (rows, shared across
    panels), one panel per ``panel`` value, a zero line; ``paper`` {(panel value, arm): x} as black stars. ``df``:
    ``delta_frame`` output (``mean``, ``low``, ``high``, ``n``). A single seed has no whisker (its n says so). With
    ``reference`` (the reference arm's name) a legend says what the dot, the whisker (``interval``, over n seeds;
    by default ``interval_words``) and the zero line are; ``note``: a caption line."""
    plt, _ = _plt()
    order = sort_labels(df[arm].astype(str))
    styles = series_styles(order)
    panels = list(dict.fromkeys(df[panel]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels) + 2.8, 1.3 + 0.32 * len(order)),
                             squeeze=False, sharey=True)
    pos = {lab: i for i, lab in enumerate(order)}
    for ax, pv in zip(axes[0], panels):
        part = df[df[panel] == pv]
        for _, r in part.iterrows():
            s = styles[str(r[arm])]
            y = pos[str(r[arm])]
            if pd.notna(r["low"]):
                ax.plot([r["low"], r["high"]], [y, y], color=s["color"], linestyle=s["linestyle"], lw=1.4)
            ax.plot([r["mean"]], [y], marker=s["marker"], color=s["color"], markersize=5, linestyle="none")
        for (pp, parm), x in (paper or {}).items():
            if pp == pv and parm in pos:
                ax.plot([x], [pos[parm]], marker="*", color=REFERENCE_COLOUR, markersize=11, linestyle="none")
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_yticks(range(len(order)), order, fontsize=7)
        ax.set_title(panel_title.format(pv), fontsize=8)
        ax.set_xlabel(xlabel, fontsize=8)
    axes[0][0].invert_yaxis()
    from matplotlib.lines import Line2D

    handles, labels = [], []
    if reference:
        n = f"n = {int(df['n'].max())} seeds" if "n" in df and df["n"].notna().any() else "seeds"
        handles += [Line2D([], [], marker="o", color="grey", linestyle="none"), Line2D([], [], color="grey"),
                    Line2D([], [], color="black", lw=0.8)]
        labels += [f"mean paired difference ({n})", interval or interval_words(df), f"0 = {reference} (reference)"]
    if paper:
        handles.append(Line2D([], [], marker="*", color=REFERENCE_COLOUR, linestyle="none"))
        labels.append(paper_label)
    if handles:
        legend_outside(axes[0][-1], handles, labels)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    caption(fig, note)
    out = atomic_savefig(fig, path, dpi=120)
    return out
