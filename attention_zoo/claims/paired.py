"""Seed-paired differences of every arm against a reference arm, as the tables and figures show them
(docs/claims.md §2)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..report import interval_heading, interval_kind  # noqa: F401 - re-exported: the tables' name for them
from .data import DIVERGED
from .stats import paired_test


def delta_frame(df: pd.DataFrame, columns: list[str], reference: dict, arm_cols: tuple[str, ...] = ("variant",
                "flavor"), pair_on: tuple[str, ...] = ("seed",), relative: bool = True) -> pd.DataFrame:
    """Long frame: one row per arm (not the reference) × combination of ``columns`` (e.g. dataset, metric) with the
    mean seed-paired difference arm − reference (in % of |reference| when ``relative``), its 95 % interval
    (Student-t for n ≥ 5; below, the range of the seeds: ``stats.paired_test``) and n. ``df``: rows with ``value``;
    the ok ones are compared, and ``diverged`` counts the seeds of the arm or the reference whose rows there say
    they diverged (status ``nan`` or an infinite value; docs/claims.md §5), which the table then names."""
    if df.empty:
        return pd.DataFrame()
    ok = df[df["status"].fillna("ok") == "ok"] if "status" in df else df
    status = df["status"].fillna("ok").astype(str) if "status" in df else pd.Series("ok", index=df.index)
    gone = df[(status == DIVERGED) | np.isinf(pd.to_numeric(df["value"], errors="coerce").astype(float))].copy()
    if len(gone):  # the diverged rows, with their arm and whether they are the reference's
        gone["_ref"] = True
        for k, v in reference.items():
            gone["_ref"] &= gone[k].astype(str) == str(v)
        gone["arm"] = gone[[c for c in arm_cols if c in gone]].astype(str).agg("/".join, axis=1)
    ref_mask = pd.Series(True, index=ok.index)
    for k, v in reference.items():
        ref_mask &= ok[k].astype(str) == str(v)
    ref = ok[ref_mask].groupby([*columns, *pair_on])["value"].mean()
    arms = ok[~ref_mask].copy()
    if arms.empty or ref.empty:
        return pd.DataFrame()
    arms["arm"] = arms[[c for c in arm_cols if c in arms]].astype(str).agg("/".join, axis=1)
    rows = []
    for (arm, *keys), g in arms.groupby(["arm", *columns], sort=False):
        vals = g.groupby([*columns, *pair_on])["value"].mean()
        both = vals.index.intersection(ref.index)
        if not len(both):
            continue
        d = vals[both] - ref[both]
        if relative:
            d = 100.0 * d / ref[both].abs()
        t = paired_test(d.to_numpy(float))
        here = gone[(gone["arm"] == arm) | gone["_ref"]] if len(gone) else gone
        for c, k in zip(columns, keys):
            here = here[here[c].astype(str) == str(k)] if len(here) else here
        rows.append({"arm": arm, **dict(zip(columns, keys)), "mean": t.mean, "low": t.low, "high": t.high, "n": t.n,
                     "method": t.method,
                     "diverged": int(len(here.drop_duplicates(list(pair_on)))) if len(here) else 0})
    return pd.DataFrame(rows)


def delta_table(deltas: pd.DataFrame, columns: list[str], better: dict | None = None, digits: int = 2
                ) -> pd.DataFrame:
    """``delta_frame`` as a wide table of "mean [low, high] (n)" texts: rows arms, one column per ``columns``
    combination; ``better`` {metric: "lower"|"higher"} adds ↓/↑ after the column's last key."""
    if deltas.empty:
        return pd.DataFrame()
    out: dict[str, dict[str, str]] = {}
    for _, r in deltas.iterrows():
        keys = [str(r[c]) for c in columns]
        arrow = {"lower": " ↓", "higher": " ↑"}.get((better or {}).get(keys[-1], ""), "")
        ci = "" if not math.isfinite(r["low"]) else f" [{r['low']:+.{digits}f}, {r['high']:+.{digits}f}]"
        ci = f" (range of the seeds{ci})" if r.get("method") == "range" and ci else ci
        lost = f"; {int(r['diverged'])} diverged" if r.get("diverged", 0) else ""  # seeds lost to divergence
        out.setdefault(r["arm"], {})[": ".join(keys) + arrow] = f"{r['mean']:+.{digits}f}{ci} (n={int(r['n'])}{lost})"
    return pd.DataFrame([{"arm": a, **v} for a, v in out.items()]).fillna("–")


__all__ = ["delta_frame", "delta_table", "interval_heading", "interval_kind"]
