"""Long CSV -> wide tables (CSV + markdown) -> seaborn plots; paper | ours | delta comparisons.

Tables are generated, never hand-edited; rounding happens only here.
"""

from __future__ import annotations

import json
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


UNSTABLE_MARK = "†"  # beside a timing the noise guard marked unstable


def mark_values(wide: pd.DataFrame, marks: dict[tuple, set[str]], index: list[str], floatfmt: str = ".4g"
                ) -> pd.DataFrame:
    """A display copy of ``wide`` where the cells named in ``marks`` ({index tuple: {column}}) read "value†"."""
    out = wide.copy()
    for col in {c for cols in marks.values() for c in cols}:
        if col not in out:
            continue
        out[col] = out[col].astype(object)
        for i, row in out.iterrows():
            if col in marks.get(tuple(row[k] for k in index), ()) and isinstance(row[col], float | int):
                out.at[i, col] = f"{format(row[col], floatfmt)} {UNSTABLE_MARK}"
    return out


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


NOT_COMPARABLE = "not comparable"  # a comparison row whose note starts with this gets no delta


def comparison_frame(entries: list[dict]) -> pd.DataFrame:
    """Rows ``{"what", "paper", "ours", "note"?, "unit"?, "source"?}`` -> frame with ``delta`` (ours − paper),
    ``delta_unit`` and ``delta_pct``, under three honesty rules:
    - a row whose note starts with "not comparable" gets no delta (the note says why);
    - a delta of two percentages (``unit`` "%" or "(%)" in ``what``) is in percentage points, never a relative %;
    - one measured value (same ``source`` key) is compared with one paper number only: later rows that would
      set it beside a different paper number are dropped.
    """
    seen, kept = {}, []
    for e in entries:
        src = e.get("source")
        if src is not None:
            key = json.dumps(src, sort_keys=True, default=str)
            if key in seen and seen[key] != e["paper"]:
                continue
            seen.setdefault(key, e["paper"])
        kept.append({k: v for k, v in e.items() if k != "source"})
    df = pd.DataFrame(kept)
    if df.empty:
        return df
    note = df["note"].fillna("").astype(str) if "note" in df else pd.Series("", index=df.index)
    unit = df["unit"].fillna("").astype(str) if "unit" in df else pd.Series("", index=df.index)
    comparable = ~note.str.startswith(NOT_COMPARABLE)
    percent = (unit == "%") | df["what"].astype(str).str.contains("(%)", regex=False)
    ours, paper = pd.to_numeric(df["ours"], errors="coerce"), pd.to_numeric(df["paper"], errors="coerce")
    df["delta"] = (ours - paper).where(comparable)
    df["delta_unit"] = percent.map({True: "pp", False: ""}).where(comparable, "")
    df["delta_pct"] = (100.0 * (ours - paper) / paper.abs()).where(comparable & ~percent)
    return df


def format_comparison(df: pd.DataFrame, floatfmt: str = ".4f") -> str:
    """Plain-text ``paper | ours | delta`` lines for the console (pp = percentage points; notes beside)."""
    if df.empty:
        return "(no paper numbers for this table)"
    lines = [f"{'what':<48} {'paper':>12} {'ours':>12} {'delta':>14}"]
    for _, r in df.iterrows():
        unit = r.get("delta_unit") if isinstance(r.get("delta_unit"), str) and pd.notna(r["delta"]) else ""
        delta = _fmt(r["delta"], floatfmt) + (f" {unit}" if unit else "")
        note = r.get("note") if isinstance(r.get("note"), str) and r.get("note") else ""
        lines.append(f"{str(r['what']):<48} {_fmt(r['paper'], floatfmt):>12} {_fmt(r['ours'], floatfmt):>12} "
                     f"{delta:>14}" + (f"  ({note})" if note else ""))
    return "\n".join(lines)


def _runs_header(env: dict) -> list[str]:
    """Markdown lines naming the run(s) behind the rows; several runs are flagged as mixed."""
    runs = env.get("runs") or []
    if len(runs) <= 1:
        return []
    lines = [f"**Mixed runs: these rows were measured by {len(runs)} runs** (same device model, torch, threads and "
             "settings; see `run_id` in the long CSV):", ""]
    for r in runs:
        dirty = " (dirty)" if r.get("git_dirty") else ""
        lines.append(f"- `{r.get('run_id')}`: git {str(r.get('git_commit'))[:10]}{dirty}"
                     f", host {r.get('host', '?')}, {r.get('device_name')}, threads {r.get('torch_threads')}, "
                     f"{r.get('time_utc')}")
    return lines + [""]


def write_tables(out_dir: str | Path, stem: str, long_df: pd.DataFrame, wide_df: pd.DataFrame, env: dict,
                 title: str, notes: str = "", best: dict[str, str] | None = None,
                 comparison: pd.DataFrame | None = None, floatfmt: str = ".4f",
                 md_df: pd.DataFrame | None = None) -> dict[str, Path]:
    """Write ``<stem>_long.csv``, ``<stem>_raw.csv`` (per-repeat rows, if any), ``<stem>.env.json``,
    ``<stem>_wide.csv`` and ``<stem>.md`` atomically, in one schema: the column is ``flavor`` everywhere and
    every long row has a ``unit``. ``md_df`` (default ``wide_df``) is what the markdown shows, e.g. with marks.

    Raises:
        ValueError: ``long_df`` has rows but no ``unit`` column.
    """
    out = Path(out_dir)
    long_df, wide_df = (d.rename(columns={"flavour": "flavor"}) for d in (long_df, wide_df))
    if not long_df.empty and "unit" not in long_df:
        raise ValueError(f"long_df: {stem} rows need a 'unit' column")
    paths = {}
    if "repeat" in long_df:  # raw repeats live apart from the summary rows
        raw = long_df["repeat"].notna()
        paths["raw"] = atomic_write_csv(long_df[raw].dropna(axis=1, how="all"), out / f"{stem}_raw.csv")
        long_df = long_df[~raw].drop(columns="repeat")
    paths.update({
        "long": atomic_write_csv(long_df, out / f"{stem}_long.csv"),
        "env": atomic_write_json(out / f"{stem}.env.json", env),
        "wide": atomic_write_csv(wide_df, out / f"{stem}_wide.csv"),
    })
    md = [f"# {title}", ""] + _runs_header(env)
    if notes:
        md += [notes.strip(), ""]
    shown = wide_df if md_df is None else md_df.rename(columns={"flavour": "flavor"})
    md += [markdown_table(shown, floatfmt=floatfmt, best=best)]
    if comparison is not None and not comparison.empty:
        md += ["## Paper vs ours", "", markdown_table(comparison)]
    md += [
        "## Environment",
        "",
        f"device: {env.get('device_name')} ({env.get('device')}), torch {env.get('torch')}, "
        f"threads {env.get('torch_threads')}, git {str(env.get('git_commit'))[:10]}"
        f"{' (dirty)' if env.get('git_dirty') else ''}, {env.get('time_utc')}"
        + (f", run `{env['run_id']}`" if env.get("run_id") else ""),
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
              log: bool = False, flag: str | None = None) -> Path:
    """Horizontal bars (one row per category of ``y``): readable with many long labels such as variant/flavour.
    Bars whose boolean column ``flag`` is true (e.g. ``unstable`` timings) are hatched and faded."""
    plt, sns = _plt()
    order, hue_order = list(dict.fromkeys(df[y])), list(dict.fromkeys(df[hue]))
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.35 * len(order) * max(1, len(hue_order)) ** 0.5))
    sns.barplot(data=df, x=x, y=y, hue=hue, order=order, hue_order=hue_order, ax=ax, errorbar=None, orient="h")
    if flag is not None and flag in df:
        flagged = {(r[y], r[hue]) for _, r in df.iterrows() if str(r[flag]).lower() == "true"}
        for container, level in zip(ax.containers, hue_order):
            for bar, cat in zip(container, order):
                if (cat, level) in flagged:
                    bar.set_hatch("///")
                    bar.set_alpha(0.45)
        if flagged:
            ax.text(1.0, -0.08, "hatched, faded: unstable timing", transform=ax.transAxes, ha="right", va="top",
                    fontsize=7)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("")
    if log:
        ax.set_xscale("log")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    out = atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
    return out
