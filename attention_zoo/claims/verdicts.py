"""Verdicts, computed from stored rows: supported, contradicted, inconclusive (MDE …), not run, explained by a control.

For each claim at each preset with rows (docs/claims.md):
1. every comparison gives per-unit (seed) effects, oriented so that positive means "treatment better"
   (``relative``: % of the reference, ``difference``: metric units, ``points``: 100 × fraction), and a seed-paired
   test (``stats.paired_test``);
2. within a family (one table or sweep, one preset) the p-values are Holm-adjusted; each interval is drawn at its
   comparison's Holm level, and the MDE is taken at that level;
3. with e = direction × effect (positive: as the paper says): **supported** when the adjusted p < α and e's interval
   lies above 0; **contradicted** when it lies below 0, or — where the rows are the paper's own task and the paper
   quotes an effect — when the whole interval lies below the paper's effect; **inconclusive** otherwise, with the
   MDE; **not run** without rows;
4. a claim's comparisons combine: contradicted if any is, supported if all are, else inconclusive;
5. **explained by a control**: a supported DAMCHA-vs-reference claim whose effect a control arm (``controls``) matches
   — the treatment-vs-control difference is not distinguishable from 0 at the family's level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import stats
from .analytic import ANALYTIC
from .data import StoreRows, matches, metric_rows
from .ledger import CLAIMS
from .spec import Arm, Claim, Comparison, resolve

ALPHA = 0.05


@dataclass
class Result:
    """One comparison's numbers (effects oriented: positive = treatment better)."""

    name: str
    effects: np.ndarray
    test: stats.PairedResult
    direction: int = 1
    paper_effect: float | None = None
    level: float = ALPHA  # Holm level of this comparison
    p_adj: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)
    mde: float = math.nan
    verdict: str = "not run"
    cost_s: float = 0.0


@dataclass
class Verdict:
    claim: Claim
    preset: str
    verdict: str
    results: list[Result] = field(default_factory=list)
    ours: str = "–"
    note: str = ""
    control: str = "–"
    n: int = 0
    cost_s: float = 0.0
    context: str = ""
    runs: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    n_needed: str = ""


# ---- one comparison --------------------------------------------------------------------------------------------
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
    """Per-unit effect, positive = treatment better, in the claim's unit."""
    sign = 1.0 if claim.better == "higher" else -1.0
    diff = sign * (treat - ref)
    if claim.effect == "relative":
        return 100.0 * diff / ref.abs()
    if claim.effect == "points":
        return 100.0 * diff
    return diff


def comparison_effects(df: pd.DataFrame, claim: Claim, comp: Comparison) -> np.ndarray:
    rows = df[matches(df, comp.where)]
    if claim.rule == "slope":
        return slope_effects(rows, claim, comp)
    t = arm_values(rows, comp.treatment, claim.pair_on, claim.better)
    r = arm_values(rows, comp.reference, claim.pair_on, claim.better)
    if t.empty or r.empty:
        return np.array([])
    both = t.index.intersection(r.index)
    return oriented_effect(t[both], r[both], claim).to_numpy(float)


def slope_effects(rows: pd.DataFrame, claim: Claim, comp: Comparison) -> np.ndarray:
    """Per seed: the least-squares slope over ``claim.over`` of the effect (or of the treatment's metric)."""
    keys = [*claim.pair_on, claim.over]
    t = arm_values(rows, comp.treatment, tuple(keys), claim.better)
    if t.empty:
        return np.array([])
    if comp.reference is None:
        series = t * (100.0 if claim.effect == "points" else 1.0)
    else:
        r = arm_values(rows, comp.reference, tuple(keys), claim.better)
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


def cell_cost(df: pd.DataFrame) -> float:
    """Training seconds of the cells behind ``df``'s rows: one ``train_cpu_s`` (else ``train_time_s``) per cell."""
    for metric in ("train_cpu_s", "train_time_s"):
        if "metric" in df and (df["metric"] == metric).any():
            return float(df.loc[df["metric"] == metric, "value"].sum())
    if "train_time_s" in df:
        keys = [c for c in ("variant", "flavor", "dataset", "setting", "seed", "row", "depth") if c in df]
        return float(df.drop_duplicates(keys)["train_time_s"].fillna(0).sum()) if keys else 0.0
    return 0.0


# ---- verdict rules ---------------------------------------------------------------------------------------------
def comparison_verdict(res: Result, claim: Claim, paper_task: bool) -> str:
    if res.test.n == 0:
        return "not run"
    lo, hi = res.interval
    e_lo, e_hi = sorted((res.direction * lo, res.direction * hi))
    decided = math.isfinite(res.p_adj) and res.p_adj < ALPHA
    quoted = res.paper_effect is not None and paper_task
    if decided and e_hi < 0:
        return "contradicted"
    if quoted and res.test.n >= stats.BOOTSTRAP_BELOW and math.isfinite(e_hi) \
            and e_hi < res.direction * res.paper_effect:
        return "contradicted"  # the whole interval lies short of the paper's effect
    if decided and e_lo > 0:
        return "supported"
    return "inconclusive"


def noninferior_verdict(res: Result, margin: float) -> str:
    """One-sided: supported when e's lower bound (at the comparison's level) exceeds −margin with p < α."""
    if res.test.n == 0:
        return "not run"
    e = res.direction * res.effects
    one = stats.paired_test(e + margin, 1 - 2 * res.level)
    p_one = one.p / 2 if one.mean > 0 else 1 - one.p / 2
    res.interval = (one.low - margin, one.high - margin)
    res.p_adj = p_one
    if math.isfinite(p_one) and p_one < res.level:
        return "supported"
    worse = stats.paired_test(-(e + margin), 1 - 2 * res.level)
    p_worse = worse.p / 2 if worse.mean > 0 else 1 - worse.p / 2
    return "contradicted" if math.isfinite(p_worse) and p_worse < res.level else "inconclusive"


def combine(verdicts: list[str]) -> str:
    if not verdicts or all(v == "not run" for v in verdicts):
        return "not run"
    if "contradicted" in verdicts:
        return "contradicted"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "inconclusive"


def _fmt(v: float, digits: int = 2) -> str:
    return "–" if not math.isfinite(v) else f"{v:+.{digits}f}"


def describe(res: Result, unit: str) -> str:
    lo, hi = res.interval
    if res.test.n == 0:
        return f"{res.name}: no rows"
    ci = f" [{_fmt(lo)}, {_fmt(hi)}]" if math.isfinite(lo) else ""
    return f"{res.name}: {_fmt(res.test.mean)}{ci} {unit} (n={res.test.n})"


def seeds_needed(res: Result, paper_task: bool) -> str:
    """Seeds for the MDE at this SD to reach the paper's effect (paper task) or the observed one."""
    target = abs(res.paper_effect) if (res.paper_effect is not None and paper_task) else abs(res.test.mean)
    if not (math.isfinite(res.test.sd) and res.test.sd > 0 and math.isfinite(target) and target > 0):
        return ""
    for n in (5, 10, 20, 40, 80, 160, 320, 640):
        if stats.mde(n, res.test.sd, res.level) <= target:
            what = "the paper's effect" if res.paper_effect is not None and paper_task else "the observed effect"
            return f"≈ {n} seeds at this SD detect {what} ({target:.2g})"
    return f"> 640 seeds at this SD for an effect of {target:.2g}"


# ---- one claim -------------------------------------------------------------------------------------------------
def claim_results(claim: Claim, preset: str, rows: StoreRows) -> list[Result]:
    metric = resolve(claim.metric, preset)
    where = {k: resolve(v, preset) for k, v in claim.where.items()}
    df = metric_rows(rows.frame, metric)
    df = df[matches(df, where)] if where else df
    out = []
    for comp in claim.comparisons:
        eff = comparison_effects(df, claim, comp)
        used = rows.frame[matches(rows.frame, {**where, **comp.where})]
        out.append(Result(comp.name, eff, stats.paired_test(eff), comp.direction, comp.paper_effect,
                          cost_s=cell_cost(used)))
    return out


def control_check(claim: Claim, preset: str, rows: StoreRows, res: Result, level: float) -> tuple[str, bool]:
    """(text, explained): the strongest control's effect vs the reference, and the treatment minus it."""
    metric = resolve(claim.metric, preset)
    where = {k: resolve(v, preset) for k, v in claim.where.items()}
    df = metric_rows(rows.frame, metric)
    df = df[matches(df, where)] if where else df
    comp = claim.comparisons[0]
    best, text, explained = -math.inf, "–", False
    for name in claim.controls:
        ctrl = Arm(name, {"variant": name})
        sub = df[matches(df, comp.where)]
        c = arm_values(sub, ctrl, claim.pair_on, claim.better)
        r = arm_values(sub, comp.reference, claim.pair_on, claim.better)
        t = arm_values(sub, comp.treatment, claim.pair_on, claim.better)
        if c.empty or r.empty or t.empty:
            continue
        idx = c.index.intersection(r.index).intersection(t.index)
        if len(idx) < 2:
            continue
        c_eff = comp.direction * oriented_effect(c[idx], r[idx], claim)
        gap = comp.direction * oriented_effect(t[idx], c[idx], claim)
        ctest, gtest = stats.paired_test(c_eff, 1 - level), stats.paired_test(gap, 1 - level)
        if ctest.mean > best:
            best = ctest.mean
            unit = claim.effect_unit(preset)
            text = (f"{name}: {_fmt(ctest.mean)} [{_fmt(ctest.low)}, {_fmt(ctest.high)}] vs {comp.reference.label}; "
                    f"treatment − {name}: {_fmt(gtest.mean)} [{_fmt(gtest.low)}, {_fmt(gtest.high)}] {unit}")
        if not (math.isfinite(gtest.p) and gtest.p < level and gtest.mean > 0):
            explained = True
    return text, explained


def decide(stores: dict[tuple[str, str], StoreRows], claims: tuple[Claim, ...] = CLAIMS) -> list[Verdict]:
    """Every claim at every preset that has rows (a claim without any: one "not run" row)."""
    todo: list[tuple[Claim, str, StoreRows]] = []
    verdicts: list[Verdict] = []
    for claim in claims:
        if not claim.needs_rows:
            verdicts.append(ANALYTIC[claim.analytic](claim, "any", StoreRows(pd.DataFrame(), None, "", [], []),
                                                     Verdict))
            continue
        presets = sorted(p for (store, p) in stores if store == claim.store_name)
        if not presets:
            first = next(iter(claim.scope))
            verdicts.append(Verdict(claim, first if first != "*" else "smoke", "not run",
                                    note=f"no rows in any `{claim.store_name}.jsonl`"))
            continue
        todo += [(claim, p, stores[(claim.store_name, p)]) for p in presets]
    families: dict[tuple[str, str], list[Result]] = {}
    partial: list[tuple[Claim, str, StoreRows, list[Result]]] = []
    for claim, preset, rows in todo:
        if claim.rule == "analytic":
            verdicts.append(ANALYTIC[claim.analytic](claim, preset, rows, Verdict))
            continue

        results = claim_results(claim, preset, rows)
        if claim.rule != "noninferior":
            families.setdefault((claim.family, preset), []).extend(results)
        partial.append((claim, preset, rows, results))
    for fam in families.values():
        p_adj, levels = stats.holm([r.test.p for r in fam], ALPHA)
        for r, p, lvl in zip(fam, p_adj, levels):
            r.p_adj, r.level = p, (lvl if math.isfinite(lvl) else ALPHA)
    for claim, preset, rows, results in partial:
        verdicts.append(finish(claim, preset, rows, results))
    order = {c.id: i for i, c in enumerate(claims)}
    return sorted(verdicts, key=lambda v: (order.get(v.claim.id, 0), v.preset))


def finish(claim: Claim, preset: str, rows: StoreRows, results: list[Result]) -> Verdict:
    paper_task = preset in claim.paper_task
    unit = claim.effect_unit(preset)
    for r in results:
        if claim.rule == "noninferior":
            r.verdict = noninferior_verdict(r, claim.margin)
        else:
            t = stats.paired_test(r.effects, 1 - r.level)
            r.interval = (t.low, t.high)
            r.verdict = comparison_verdict(r, claim, paper_task)
        r.mde = stats.mde(r.test.n, r.test.sd, r.level)
    verdict = combine([r.verdict for r in results])
    n = min((r.test.n for r in results if r.test.n), default=0)
    v = Verdict(claim, preset, verdict, results, n=n, cost_s=sum(r.cost_s for r in results), context=rows.context_id,
                runs=rows.run_ids, commits=rows.commits)
    v.ours = describe(results[0], unit) if results else "–"
    others = [describe(r, unit) + f" → {r.verdict}" for r in results[1:]]
    if verdict == "inconclusive":
        mdes = [r.mde for r in results if r.verdict == "inconclusive" and math.isfinite(r.mde)]
        why = f"MDE {max(mdes):.2g} {unit}" if mdes else "n < 2"
        if any(r.test.method == "bootstrap+sign-flip" for r in results):
            why += f"; n < {stats.BOOTSTRAP_BELOW}: the exact sign-flip test cannot reach p < {ALPHA}"
        v.verdict = f"inconclusive ({why})"
    if claim.rule == "noninferior":
        others.append(f"non-inferiority margin {claim.margin:g} {unit}")
    if claim.controls and results and results[0].test.n:
        v.control, explained = control_check(claim, preset, rows, results[0], results[0].level)
        if verdict == "supported" and explained:
            v.verdict = "explained by a control"
    v.note = "; ".join(others)
    needed = [seeds_needed(r, paper_task) for r in results if r.verdict.startswith("inconclusive")]
    v.n_needed = next((s for s in needed if s), "")
    return v


__all__ = ["ALPHA", "Result", "Verdict", "decide"]
