"""Long CSV -> wide tables (CSV + markdown) -> seaborn plots; paper | ours | delta comparisons.

Tables are generated, never hand-edited; rounding happens only here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from .io import atomic_write_csv, atomic_write_json, atomic_write_text


def table_blocks(lines: list[str]) -> list[str]:
    """[heading, "", table] with the table's rows as one block, so a report that joins its parts as paragraphs (a
    blank line between them) keeps the table whole; one that joins lines renders the same."""
    return [*lines[:2], "\n".join(lines[2:])] if len(lines) > 2 else lines


def setting_note(df: pd.DataFrame, arms: tuple[str, ...] = ("variant", "flavor")) -> str | None:
    """A figure's caption line for a tuned preset: the learning rate and weight decay each arm (the ``arms``
    columns, e.g. with ``dataset`` where each dataset tunes its own) ran at, its own choice on validation; None where
    the rows carry no tuned setting."""
    cols = [*arms, "lr", "weight_decay"]
    if not set(cols + ["phase"]) <= set(df):
        return None
    rows = df.loc[df["phase"] == "tuned", cols].dropna()
    if rows.empty:
        return None
    rows = rows.drop_duplicates().sort_values(cols)
    arms_text = "; ".join(f"{'/'.join(str(r[a]) for a in arms)} lr {r['lr']:g}, wd {r['weight_decay']:g}"
                          for _, r in rows.iterrows())
    return f"Each arm at its own setting, chosen on validation before its seeds ran: {arms_text}."


def wide_table(df: pd.DataFrame, index: list[str], columns: list[str], value: str = "value") -> pd.DataFrame:
    """Pivot a long frame; repeated entries (seeds, repeats) are averaged. An empty frame (e.g. a store whose cells all
    failed: error rows carry no metric) gives an empty table that still has the ``index`` columns."""
    if df.empty:
        return pd.DataFrame(columns=index)
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
    - a delta of two percentages (``unit`` "%", or ``what`` ending in "%)") is in percentage points, never a
      relative %;
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
    percent = (unit == "%") | df["what"].astype(str).str.contains(r"%\s*\)", regex=True)  # "(%)", "(test loss %)"
    ours, paper = pd.to_numeric(df["ours"], errors="coerce"), pd.to_numeric(df["paper"], errors="coerce")
    df["delta"] = (ours - paper).where(comparable)
    df["delta_unit"] = percent.map({True: "pp", False: ""}).where(comparable & df["delta"].notna(), "")
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
                 md_df: pd.DataFrame | None = None, main_table: bool = True) -> dict[str, Path]:
    """Write ``<stem>_long.csv``, ``<stem>_raw.csv`` (per-repeat rows, if any), ``<stem>.env.json``,
    ``<stem>_wide.csv`` and ``<stem>.md`` atomically, in one schema: the column is ``flavor`` everywhere and
    every long row has a ``unit``. ``md_df`` (default ``wide_df``) is what the markdown shows, e.g. with marks;
    ``main_table=False`` leaves it out (the notes hold the tables).

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
    if main_table:
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


# ---- 95 % intervals -------------------------------------------------------------------------------------------
def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval mean ± t_{(1+c)/2, n−1}·s/√n over the finite values; NaN bounds
    for fewer than two values."""
    import numpy as np
    from scipy import stats

    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if v.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf((1 + confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


def t_band(values) -> tuple[float, float]:
    """seaborn ``errorbar`` callable: the 95 % Student-t interval of the values (nothing drawn for one value)."""
    _, lo, hi = t_interval(values)
    return lo, hi


def ci_table(df: pd.DataFrame, index: list[str], columns: list[str], value: str = "value",
             floatfmt: str = ".4g") -> pd.DataFrame:
    """Wide table of "mean [low, high] (n)" strings: the 95 % Student-t interval over the repeated entries (seeds)
    of each index × columns cell; one entry shows "mean (n=1)"."""
    if df.empty:
        return pd.DataFrame()
    rows = {}
    for key, g in df.groupby(index + columns, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        mean, lo, hi = t_interval(g[value])
        if math.isnan(mean):
            text = "–"
        elif math.isnan(lo):
            text = f"{format(mean, floatfmt)} (n={len(g)})"
        else:
            text = f"{format(mean, floatfmt)} [{format(lo, floatfmt)}, {format(hi, floatfmt)}] (n={len(g)})"
        rows.setdefault(key[:len(index)], {})[": ".join(map(str, key[len(index):]))] = text
    out = pd.DataFrame([{**dict(zip(index, k)), **v} for k, v in rows.items()])
    return out.fillna("–")


def interval_kind(deltas: pd.DataFrame) -> str:
    """What a ``claims.paired.delta_frame``'s brackets are, from its ``method`` column: "t" (a 95 % t interval, from
    5 seeds), "range" (the seeds' min and max, below 5 seeds: not a confidence interval) or "mixed"."""
    methods = set(deltas["method"].dropna()) - {"none"} if "method" in deltas else {"t"}
    return "t" if "range" not in methods else "range" if methods == {"range"} else "mixed"


def interval_heading(deltas: pd.DataFrame) -> str:
    """A delta table's heading words for its brackets (``interval_kind``)."""
    return {"t": "mean [95 % interval] (n seeds)",
            "range": "mean (range of the seeds [min, max]; below 5 seeds no interval) (n seeds)",
            "mixed": "mean [95 % t interval from 5 seeds; below, (range of the seeds [min, max])] (n seeds)"
            }[interval_kind(deltas)]
