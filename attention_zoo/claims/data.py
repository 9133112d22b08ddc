"""Read result stores without writing to them: every ``<results>/<folder>/<store>.jsonl``, flattened to long rows.

A store holds the cells of every run context that wrote it (``results.ResultStore``). For a claim at a preset the
rows are those of one context: the one whose latest run is the newest among the contexts of that preset (the run
that last wrote the report); older contexts of the same preset (other settings, older code) are left out and the
verdict names the context it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import scan_jsonl
from .spec import RUNNER_UP, SHARED

# Derived metrics a claim may name: value = a − b of two stored metrics of the same cell.
DERIVED = {"mse_iqr": ("mse_q75", "mse_q25"), "nll_iqr": ("nll_q75", "nll_q25")}


@dataclass
class StoreRows:
    """One store's rows for one preset (one context), with what it took to make them."""

    frame: pd.DataFrame
    path: Path
    context_id: str
    run_ids: list[str]
    commits: list[str]
    gate_checked: bool = True  # False: no cell carried a trivial-predictor reference (``gate``)


def _preset_of(context: dict, cell: dict) -> str | None:
    opts = context.get("options") or {}
    return opts.get("preset") or cell.get("preset")


def read_store(path: str | Path) -> dict[str, StoreRows]:
    """{preset: StoreRows} of one JSONL store (malformed lines are skipped; the store itself repairs them)."""
    path = Path(path)
    good, _ = scan_jsonl(path)
    runs, cells, order = {}, {}, []
    for _, rec in good:
        if rec.get("kind") == "run" and "run_id" in rec:
            runs[rec["run_id"]] = rec
            order.append(rec["run_id"])
        elif rec.get("kind") == "cell" and isinstance(rec.get("rows"), list):
            cells.pop(rec.get("cell_id"), None)
            cells[rec.get("cell_id")] = rec
    by_preset: dict[str, dict[str, list[dict]]] = {}
    for rec in cells.values():
        run = runs.get(rec.get("run_id"), {})
        preset = _preset_of(run.get("context") or {}, rec.get("cell") or {})
        if preset is not None:
            by_preset.setdefault(preset, {}).setdefault(rec.get("context_id"), []).append(rec)
    latest = {rid: i for i, rid in enumerate(order)}
    out = {}
    for preset, contexts in by_preset.items():
        def newest(cid, contexts=contexts):
            return max(latest.get(r.get("run_id"), -1) for r in contexts[cid])

        cid = max(contexts, key=newest)
        recs = contexts[cid]
        flat = [{**r["cell"], **row, "run_id": r["run_id"]} for r in recs for row in r["rows"]]
        df = pd.DataFrame(flat).rename(columns={"flavour": "flavor"})  # one spelling, as the reports write it
        if not df.empty and "status" not in df:
            df["status"] = "ok"
        if "value" in df:  # a value stored as text ("0.31") is read as a number; one that is none is missing
            df["value"] = pd.to_numeric(df["value"], errors="coerce")
        rids = sorted({r["run_id"] for r in recs})
        commits = sorted({str((runs.get(rid, {}).get("env") or {}).get("git_commit", "?"))[:10] for rid in rids})
        out.update({name: StoreRows(part, path, cid, rids, commits) for name, part in by_phase(df, preset).items()})
    return out


def by_phase(df: pd.DataFrame, preset: str) -> dict[str, pd.DataFrame]:
    """A tuned preset's rows by what they decide: ``tuned`` cells (each arm at its own best setting; and cells of
    presets that do not tune) under the preset's name, ``shared`` cells (every arm at the one shared setting) as
    "<preset>, shared setting", ``runner_up`` cells (every arm at its second-best setting) as "<preset>, runner-up
    setting" (read only for the robustness column); ``tune`` cells (the grid, validation only) decide nothing."""
    if df.empty or "phase" not in df:
        return {preset: df}
    phase = df["phase"].fillna("tuned").astype(str)
    out = {preset: df[phase == "tuned"]}
    if (phase == "shared").any():
        out[f"{preset}, {SHARED}"] = df[phase == "shared"]
    if (phase == "runner_up").any():
        out[f"{preset}, {RUNNER_UP}"] = df[phase == "runner_up"]
    return out


def load_results(results: str | Path) -> dict[tuple[str, str], StoreRows]:
    """{(store name, preset): rows} over every store under ``results`` (one folder level deep)."""
    found: dict[tuple[str, str], StoreRows] = {}
    for path in sorted(Path(results).glob("*/*.jsonl")):
        for preset, rows in read_store(path).items():
            key = (path.stem, preset)
            if key not in found or len(rows.frame) > len(found[key].frame):
                found[key] = rows
    return found


def matches(df: pd.DataFrame, where: dict) -> pd.Series:
    """Rows whose columns equal the filters (floats compared with isclose; a missing column matches nothing)."""
    keep = pd.Series(True, index=df.index)
    for col, want in where.items():
        if col not in df:
            return pd.Series(False, index=df.index)
        vals = df[col]
        if isinstance(want, float) or (isinstance(want, int) and not isinstance(want, bool)
                                       and pd.api.types.is_float_dtype(vals)):
            num = pd.to_numeric(vals, errors="coerce")
            keep &= pd.Series(np.isclose(num.astype(float), float(want)), index=df.index) & num.notna()
        else:
            keep &= vals.astype(str) == str(want)
    return keep


def run_facts(df: pd.DataFrame) -> str:
    """What the rows behind a verdict are, read from the stored cells (never from the preset's description): seeds,
    steps actually run, data."""
    if df.empty:
        return ""
    facts = []
    if "seed" in df:
        facts.append(f"{df['seed'].nunique()} seeds")
    steps = df.loc[df["metric"] == "steps_run", "value"] if "metric" in df else pd.Series(dtype=float)
    if not steps.empty:
        lo, med, hi = (int(x) for x in np.nanpercentile(steps.astype(float), [0, 50, 100]))
        facts.append(f"{hi} steps" if lo == hi else f"{lo}–{hi} steps run (median {med}; early stopping)")
    else:
        for col in ("train_steps", "max_steps", "steps"):
            if col in df and df[col].notna().any():
                vals = sorted({int(v) for v in pd.to_numeric(df[col], errors="coerce").dropna()})
                if vals:
                    facts.append(f"{'/'.join(map(str, vals))} steps")
                    break
    if "dataset" in df and df["dataset"].notna().any():
        facts.append("data " + ", ".join(sorted(map(str, df["dataset"].dropna().unique()))))
    if {"lr", "weight_decay", "variant"} <= set(df) and df["lr"].notna().any():  # the setting each arm ran at
        arms = df.dropna(subset=["lr"]).groupby("variant")[["lr", "weight_decay"]].first()
        facts.append("settings " + ", ".join(f"{v} lr {r.lr:g} wd {r.weight_decay:g}" for v, r in arms.iterrows()))
    return "; ".join(facts)


DIVERGED = "nan"  # the status a training loop writes for a non-finite loss or gradient norm (docs/conventions.md)


def diverged_units(rows: pd.DataFrame, pair_on: tuple[str, ...]) -> tuple[int, int]:
    """(units of an arm, units in which it diverged) over the arm's rows of a metric, of every status: a unit
    (a seed) diverged when one of its rows has the status ``nan`` (its training stopped on a non-finite loss) or an
    infinite value. Such a seed is a failure of the arm, not a missing measurement (docs/claims.md §5)."""
    if rows.empty or any(k not in rows for k in pair_on):
        return 0, 0
    status = rows["status"].fillna("ok").astype(str) if "status" in rows else pd.Series("ok", index=rows.index)
    value = pd.to_numeric(rows["value"], errors="coerce") if "value" in rows else pd.Series(np.nan, index=rows.index)
    bad = rows[(status == DIVERGED) | np.isinf(value.astype(float))]
    return rows.groupby(list(pair_on)).ngroups, (bad.groupby(list(pair_on)).ngroups if not bad.empty else 0)


def metric_inputs(metric: str) -> tuple[str, ...]:
    """The stored metrics ``metric`` is computed from (itself, or a ``DERIVED`` metric's two)."""
    return DERIVED.get(metric, (metric,))


def metric_rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The ok rows of ``metric`` (a stored metric, or a ``DERIVED`` difference of two computed per cell)."""
    if df.empty or "metric" not in df:
        return df.iloc[0:0]
    ok = df[df["status"].fillna("ok") == "ok"] if "status" in df else df
    if metric not in DERIVED:
        return ok[ok["metric"] == metric]
    a, b = DERIVED[metric]
    keys = [c for c in ok.columns if c not in ("metric", "value", "unit", "status", "message", "run_id")
            and not c.startswith("_")]
    keys = [c for c in keys if ok[c].map(lambda v: isinstance(v, (str, int, float, bool)) or v is None).all()]
    # groupby, not pivot_table(dropna=False): that reindexes to the product of every key's values (GiBs)
    wide = (ok[ok["metric"].isin([a, b])].groupby([*keys, "metric"], dropna=False)["value"].mean()
            .unstack("metric"))
    if a not in wide or b not in wide:
        return ok.iloc[0:0]
    out = (wide[a] - wide[b]).rename("value").reset_index().dropna(subset=["value"])
    return out.assign(metric=metric, status="ok")
