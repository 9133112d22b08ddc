"""Long CSV -> wide tables (CSV + markdown) -> seaborn plots; paper | ours | delta comparisons.

Tables are generated, never hand-edited; rounding happens only here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .io import atomic_savefig, atomic_write_csv, atomic_write_json, atomic_write_text


def wide_table(df: pd.DataFrame, index: list[str], columns: list[str], value: str = "value") -> pd.DataFrame:
    """Pivot a long frame; repeated entries (seeds, repeats) are averaged."""
    if df.empty:
        return pd.DataFrame()
    wide = df.pivot_table(index=index, columns=columns, values=value, aggfunc="mean", dropna=False)
    if isinstance(wide.columns, pd.MultiIndex):
        wide.columns = [" / ".join(str(c) for c in col) for col in wide.columns]
    return wide.reset_index()


def _fmt(v, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return format(v, floatfmt)
    return str(v)


def markdown_table(df: pd.DataFrame, floatfmt: str = ".4f", best: dict[str, str] | None = None) -> str:
    """Render a DataFrame as a GitHub markdown table. ``best`` maps column -> "min"/"max" to bold the best."""
    if df.empty:
        return "_(no rows)_\n"
    cols = list(df.columns)
    bold = {}
    for col, how in (best or {}).items():
        if col in df and pd.api.types.is_numeric_dtype(df[col]) and df[col].notna().any():
            bold[col] = df[col].min() if how == "min" else df[col].max()
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            text = _fmt(row[c], floatfmt)
            if c in bold and row[c] == bold[c]:
                text = f"**{text}**"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparison_frame(entries: list[dict]) -> pd.DataFrame:
    """Rows ``{"what", "paper", "ours", ...}`` -> frame with ``delta`` and ``delta_pct`` (ours − paper)."""
    df = pd.DataFrame(entries)
    if df.empty:
        return df
    df["delta"] = df["ours"] - df["paper"]
    df["delta_pct"] = 100.0 * df["delta"] / df["paper"].abs()
    return df


def format_comparison(df: pd.DataFrame, floatfmt: str = ".4f") -> str:
    """Plain-text ``paper | ours | delta`` lines for the console."""
    if df.empty:
        return "(no paper numbers for this table)"
    lines = [f"{'what':<48} {'paper':>12} {'ours':>12} {'delta':>12}"]
    for _, r in df.iterrows():
        lines.append(
            f"{str(r['what']):<48} {_fmt(r['paper'], floatfmt):>12} {_fmt(r['ours'], floatfmt):>12} "
            f"{_fmt(r['delta'], floatfmt):>12}"
        )
    return "\n".join(lines)


def write_tables(out_dir: str | Path, stem: str, long_df: pd.DataFrame, wide_df: pd.DataFrame, env: dict,
                 title: str, notes: str = "", best: dict[str, str] | None = None,
                 comparison: pd.DataFrame | None = None, floatfmt: str = ".4f") -> dict[str, Path]:
    """Write ``<stem>_long.csv``, ``<stem>.env.json``, ``<stem>_wide.csv`` and ``<stem>.md`` atomically."""
    out = Path(out_dir)
    paths = {
        "long": atomic_write_csv(long_df, out / f"{stem}_long.csv"),
        "env": atomic_write_json(out / f"{stem}.env.json", env),
        "wide": atomic_write_csv(wide_df, out / f"{stem}_wide.csv"),
    }
    md = [f"# {title}", ""]
    if notes:
        md += [notes.strip(), ""]
    md += [markdown_table(wide_df, floatfmt=floatfmt, best=best)]
    if comparison is not None and not comparison.empty:
        md += ["## Paper vs ours", "", markdown_table(comparison)]
    md += [
        "## Environment",
        "",
        f"device: {env.get('device_name')} ({env.get('device')}), torch {env.get('torch')}, "
        f"threads {env.get('torch_threads')}, git {str(env.get('git_commit'))[:10]}"
        f"{' (dirty)' if env.get('git_dirty') else ''}, {env.get('time_utc')}",
        "",
    ]
    paths["md"] = atomic_write_text(out / f"{stem}.md", "\n".join(md))
    return paths


# ---- plots (seaborn, a separate step that reads the long frame) -------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def bar_plot(df: pd.DataFrame, x: str, y: str, hue: str, path: str | Path, title: str, ylabel: str,
             log: bool = False) -> Path:
    plt, sns = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.barplot(data=df, x=x, y=y, hue=hue, ax=ax, errorbar=None)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    out = atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
    return out


def line_plot(df: pd.DataFrame, x: str, y: str, hue: str, path: str | Path, title: str, ylabel: str,
              loglog: bool = False, errorbar=("ci", 95)) -> Path:
    plt, sns = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=df, x=x, y=y, hue=hue, marker="o", errorbar=errorbar, ax=ax)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if loglog:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    out = atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
    return out


def barh_plot(df: pd.DataFrame, y: str, x: str, hue: str, path: str | Path, title: str, xlabel: str,
              log: bool = False) -> Path:
    """Horizontal bars (one row per category of ``y``): readable with many long labels such as variant/flavour."""
    plt, sns = _plt()
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.35 * df[y].nunique() * max(1, df[hue].nunique()) ** 0.5))
    sns.barplot(data=df, x=x, y=y, hue=hue, ax=ax, errorbar=None, orient="h")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("")
    if log:
        ax.set_xscale("log")
    ax.legend(fontsize=7)
    out = atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
    return out
