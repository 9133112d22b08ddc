"""Per-seed effects of one comparison, its units, its training cost and its budget curve (plain pandas, no rules).

Every effect is oriented so that positive means "the treatment is better" on the claim's metric, in the claim's
unit: ``relative`` — % of the comparison's reference arm's value, ``difference`` — metric units, ``points`` —
100 × a fraction. A control's gain and the treatment's gap to it are expressed in the same unit, against the same
reference, so the three numbers of a row can be added and subtracted.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import stats
from .data import matches
from .gate import CELL_KEYS
from .spec import Arm, Claim, Comparison, resolve

METRIC_NAMES = {"test_mse": "test MSE", "test_acc": "test accuracy", "fid_top50": "FID@Top-50",
                "bertscore_f1": "BERTScore F1", "bartscore": "BARTScore", "val_loss": "validation loss",
                "test_loss": "test loss", "mse": "MSE", "mse_iqr": "IQR of per-sample MSE", "nll": "NLL",
                "top1": "top-1 accuracy",
                "block_norm_cv": "CV of block norms", "grad_grid_cv": "CV of block gradient norms",
                "metric_drift": "metric drift"}
SETTING_NAMES = {"lam": "λ", "d_e": "dₑ"}
COST_KEYS = tuple(k for k in CELL_KEYS if k != "inference")  # one trained model, however many evaluations


def metric_name(metric: str) -> str:
    return METRIC_NAMES.get(metric, metric)


def unit_of(claim: Claim, comp: Comparison, preset: str) -> str:
    """The unit of ``comp``'s per-seed effects (and of its controls' gains and gaps)."""
    if claim.unit and claim.rule != "slope":
        return claim.unit
    metric = metric_name(resolve(claim.metric, preset))
    if claim.rule == "slope" and comp.reference is None:
        base = f"{metric} points" if claim.effect == "points" else metric
    elif claim.effect == "relative":
        base = f"% of {comp.reference.label}'s {metric}" if comp.reference else f"% of {metric}"
    elif claim.effect == "points":
        base = f"{metric} points"
    else:
        base = f"{metric} (difference)"
    return f"{base} per unit {SETTING_NAMES.get(claim.over, claim.over)}" if claim.rule == "slope" else base


def arm_values(df: pd.DataFrame, arm: Arm, pair_on: tuple[str, ...], better: str) -> pd.Series:
    """One value per pairing unit (mean of duplicates; ``reduce`` over ``arm.over`` first)."""
    part = df[matches(df, arm.where)]
    if part.empty:
        return pd.Series(dtype=float)
    if arm.reduce is None:
        return part.groupby(list(pair_on))["value"].mean()
    per = part.groupby([*pair_on, arm.over])["value"].mean().reset_index()
    if arm.reduce in ("first", "last"):
        pick = per.groupby(list(pair_on))[arm.over].transform("max" if arm.reduce == "last" else "min")
        return per[per[arm.over] == pick].groupby(list(pair_on))["value"].mean()
    best = (better == "lower") == (arm.reduce == "best")
    return per.groupby(list(pair_on))["value"].min() if best else per.groupby(list(pair_on))["value"].max()


def oriented_effect(treat: pd.Series, ref: pd.Series, claim: Claim) -> pd.Series:
    """Per-unit effect of ``treat`` over ``ref``, positive = ``treat`` better, in the claim's unit."""
    sign = 1.0 if claim.better == "higher" else -1.0
    diff = sign * (treat - ref)
    if claim.effect == "relative":
        return 100.0 * diff / ref.abs()
    if claim.effect == "points":
        return 100.0 * diff
    return diff


def paired_effects(df: pd.DataFrame, claim: Claim, treatment: Arm, reference: Arm) -> pd.Series:
    """Per-unit effect of one arm over another on ``df``'s rows, indexed by the pairing unit."""
    t = arm_values(df, treatment, claim.pair_on, claim.better)
    r = arm_values(df, reference, claim.pair_on, claim.better)
    if t.empty or r.empty:
        return pd.Series(dtype=float)
    both = t.index.intersection(r.index)
    return oriented_effect(t[both], r[both], claim)


def comparison_effects(df: pd.DataFrame, claim: Claim, comp: Comparison) -> np.ndarray:
    rows = df[matches(df, comp.where)]
    if claim.rule == "slope":
        return slope_effects(rows, claim, comp)
    return paired_effects(rows, claim, comp.treatment, comp.reference).to_numpy(float)


def slope_effects(rows: pd.DataFrame, claim: Claim, comp: Comparison) -> np.ndarray:
    """Per seed: the least-squares slope over ``claim.over`` of the effect (or of the treatment's metric)."""
    keys = (*claim.pair_on, claim.over)
    t = arm_values(rows, comp.treatment, keys, claim.better)
    if t.empty:
        return np.array([])
    if comp.reference is None:
        series = t * (100.0 if claim.effect == "points" else 1.0)
    else:
        r = arm_values(rows, comp.reference, keys, claim.better)
        if r.empty:
            return np.array([])
        both = t.index.intersection(r.index)
        series = oriented_effect(t[both], r[both], claim)
    if series.empty:
        return np.array([])
    frame = series.rename("e").reset_index()
    out = [stats.slope(g[claim.over], g["e"]) for _, g in frame.groupby(list(claim.pair_on))
           if g[claim.over].nunique() > 1]
    return np.array([s for s in out if math.isfinite(s)])


def budget_curve(df: pd.DataFrame, claim: Claim, comp: Comparison, metric: str) -> list[tuple[float, float, int]]:
    """[(budget fraction, mean paired effect, n)] from the ``<metric>@budget`` rows (test metric of the best
    checkpoint so far, read at fractions of the step budget): does the answer move with training?"""
    if claim.rule == "slope" or comp.reference is None or "metric" not in df or "budget" not in df:
        return []
    rows = df[(df["metric"] == f"{metric}@budget") & matches(df, comp.where)]
    rows = rows[rows["status"].fillna("ok") == "ok"] if "status" in rows else rows
    out = []
    for frac, g in rows.groupby("budget"):
        e = paired_effects(g, claim, comp.treatment, comp.reference)
        if len(e):
            out.append((float(frac), float(e.mean()), len(e)))
    return out


def budget_movement(df: pd.DataFrame, claim: Claim, comp: Comparison, metric: str) -> tuple | None:
    """(fraction before, last fraction, per-seed change of the paired effect between them) from the
    ``<metric>@budget`` rows, on the seeds both fractions have; None with fewer than two fractions."""
    if claim.rule == "slope" or comp.reference is None or "metric" not in df or "budget" not in df:
        return None
    rows = df[(df["metric"] == f"{metric}@budget") & matches(df, comp.where)]
    rows = rows[rows["status"].fillna("ok") == "ok"] if "status" in rows else rows
    fracs = sorted(float(f) for f in rows["budget"].dropna().unique())
    if len(fracs) < 2:
        return None
    f0, f1 = fracs[-2], fracs[-1]
    e0, e1 = (paired_effects(rows[np.isclose(rows["budget"].astype(float), f)], claim, comp.treatment,
                             comp.reference) for f in (f0, f1))
    both = e0.index.intersection(e1.index)
    return (f0, f1, (e1[both] - e0[both]).to_numpy(float)) if len(both) else None


def cell_costs(df: pd.DataFrame) -> dict[tuple, tuple[float, str]]:
    """{cell: (training seconds, "CPU" or "wall")} of the cells behind ``df``'s rows, each cell once: its
    ``train_cpu_s`` row, else its ``train_time_s`` row or column (wall time)."""
    keys = [k for k in COST_KEYS if k in df]
    if df.empty or not keys:
        return {}
    out = {}
    for cell, g in df.groupby(keys, dropna=False, sort=False):
        # NaN keys (a setting a cell does not have) compare unequal: None, so that each cell counts once
        cell = tuple(None if isinstance(k, float) and math.isnan(k) else k
                     for k in (cell if isinstance(cell, tuple) else (cell,)))
        metric = g["metric"] if "metric" in g else pd.Series(dtype=str)
        if (metric == "train_cpu_s").any():
            out[cell] = (float(g.loc[metric == "train_cpu_s", "value"].mean()), "CPU")
        elif (metric == "train_time_s").any():
            out[cell] = (float(g.loc[metric == "train_time_s", "value"].mean()), "wall")
        elif "train_time_s" in g and g["train_time_s"].notna().any():
            out[cell] = (float(g["train_time_s"].dropna().iloc[0]), "wall")
    return out


def arms_rows(df: pd.DataFrame, comp: Comparison, arms: tuple[Arm | None, ...]) -> pd.DataFrame:
    """Rows (every metric and status) of the given arms under ``comp``'s filter."""
    rows = df[matches(df, comp.where)]
    mask = pd.Series(False, index=rows.index)
    for arm in arms:
        if arm is not None:
            mask |= matches(rows, arm.where)
    return rows[mask]


__all__ = ["arm_values", "arms_rows", "budget_curve", "cell_costs", "comparison_effects", "metric_name",
           "oriented_effect", "paired_effects", "slope_effects", "unit_of"]
