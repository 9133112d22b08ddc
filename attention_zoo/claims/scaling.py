"""The scale axis's rules (docs/claims.md §5, "Compute multipliers"): ``multiplier`` and ``gap_trend``, decided from a
ladder store (rows with ``d_model``, ``n_layers``, a compute metric and the test loss per final seed).

- ``multiplier``: the treatment's compute multiplier over the reference at the largest rung both ran —
  ``C_ref(L_treatment) / C_treatment`` read off the reference's fitted loss-vs-compute curve
  (``scaling_fit``) — against the claim's ``margin`` (the multiplier it claims; 1: "reaches the reference's loss
  with less compute"). Its seed-stratified bootstrap gives a two-sided p-value of the multiplier being that value
  and a percentile interval; Holm within the claim's family (every multiplier and gap-trend claim of the family at
  one preset), each interval at its Holm level. **Supported** when the adjusted p < α and the interval lies above
  the margin; **contradicted** when it lies below (the treatment is worth less compute than claimed);
  **inconclusive** otherwise.
- ``gap_trend``: the slope, per decade of compute, of the treatment's gap to the reference (its mean test loss minus
  the reference curve's loss at the treatment's own compute, rung by rung); the claim is that the gap closes (the
  slope is negative): **supported** / **contradicted** when the slope's interval lies below / above 0 with the
  adjusted p < α. The verdict also states where the line reaches 0, or that no crossing within 100× the largest
  rung's compute is left at 95 % (under 5 % of the replicates cross there).

Both are **not decidable** with fewer than five final seeds of either arm at a rung, with a diverged seed (status
``nan``) or a cell that did not beat its trivial predictor (the gate). The ``ours`` text gives the multiplier at
every rung and the same reading with CPU-seconds in place of FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import stats
from .data import StoreRows, matches, run_facts
from .scaling_fit import (
    Curve,
    bootstrap_weights,
    fit_curve,
    fit_many,
    inverse,
    percentile_interval,
    slope_and_crossing,
    two_sided_p,
    weighted_means,
)
from .spec import Arm, Claim, resolve

RULES = ("multiplier", "gap_trend")
ALPHA = 0.05
N_BOOT = 2000
MIN_SEEDS = stats.DECIDABLE_N
RUNG = ("d_model", "n_layers")
READINGS = {"train_flops": "FLOPs", "best_cpu_s": "CPU-s"}  # both up to the best checkpoint
CROSS_REACH = 100.0  # "no crossing within 100× the largest rung"


@dataclass
class Ladder:
    """Per arm and rung, the per-seed test loss and compute (NaN where a seed is missing); rungs in ladder order."""

    rungs: list[tuple]
    seeds: list[list]
    loss: dict[str, np.ndarray]  # arm label -> [R, max seeds]
    compute: dict[str, dict[str, np.ndarray]]  # reading -> arm label -> [R, max seeds]
    status: dict[str, str] = field(default_factory=dict)  # arm label -> why it cannot be decided ("" if it can)


def _values(df: pd.DataFrame, arm: Arm, metric: str) -> pd.Series:
    rows = df[(df["metric"] == metric) & matches(df, arm.where)]
    if "dataset" in rows and "eval_set" in rows:  # a split's own figure (the mix: its mean), not its parts
        rows = rows[rows["eval_set"].isna() | (rows["eval_set"] == rows["dataset"])]
    return rows.groupby([*RUNG, "seed"])["value"].mean()


def ladder(frame: pd.DataFrame, arms: list[Arm], metric: str = "test_loss") -> Ladder:
    """The ladder of ``arms`` from a store's rows (its final cells); rungs ordered by width then depth."""
    ok = frame[frame["status"].fillna("ok") == "ok"] if "status" in frame else frame
    if ok.empty or not set(RUNG) <= set(ok):
        return Ladder([], [], {}, {r: {} for r in READINGS})
    per = {a.label: _values(ok, a, metric) for a in arms}
    rungs = sorted({k[:2] for s in per.values() for k in s.index})
    seeds = [sorted({k[2] for s in per.values() for k in s.index if k[:2] == r}) for r in rungs]
    width = max((len(s) for s in seeds), default=0)

    def grid(series: pd.Series) -> np.ndarray:
        out = np.full((len(rungs), width), np.nan)
        for (d, n, seed), v in series.items():
            r = rungs.index((d, n))
            out[r, seeds[r].index(seed)] = v
        return out

    loss = {k: grid(v) for k, v in per.items()}
    compute = {reading: {a.label: grid(_values(ok, a, reading)) for a in arms} for reading in READINGS}
    status = {}
    for a in arms:
        part = frame[matches(frame, a.where) & (frame["metric"] == metric)] if "metric" in frame else frame.iloc[:0]
        bad = part[part["status"].fillna("ok") != "ok"] if "status" in part else part.iloc[:0]
        if not bad.empty:
            kinds = ", ".join(sorted(set(bad["status"].astype(str))))
            status[a.label] = f"{bad['seed'].nunique()} seed(s) of {a.label} failed ({kinds})"
    return Ladder(rungs, seeds, loss, compute, status)


@dataclass
class Reading:
    """One arm against the reference on one compute reading (FLOPs or CPU-seconds)."""

    rungs: list[tuple]
    multiplier: np.ndarray  # [R] point estimates (NaN where the arm has no rung)
    samples: np.ndarray  # [B, R] bootstrap multipliers
    extrapolated: np.ndarray  # [R] the reference reaches the arm's loss outside its measured compute
    curve: Curve | None
    ref_curve: Curve | None
    slope: float = math.nan
    slope_samples: np.ndarray = field(default_factory=lambda: np.array([]))
    cross: float = math.nan  # log10 compute where the gap line reaches 0
    cross_samples: np.ndarray = field(default_factory=lambda: np.array([]))
    top_compute: float = math.nan
    n: int = 0  # the fewest seeds the arm or the reference has at a rung they share


def _means(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.nanmean(np.where(np.isfinite(x), x, np.nan), axis=-1)


def compare(lad: Ladder, treat: str, ref: str, reading: str = "train_flops", n_boot: int = N_BOOT,
            seed: int = 0) -> Reading | None:
    """The treatment's multipliers and gap trend against the reference on ``reading``; None without two shared
    rungs (three for the reference's power form)."""
    L, C = lad.loss, lad.compute[reading]
    if treat not in L or ref not in L:
        return None
    have = [r for r in range(len(lad.rungs)) if np.isfinite(L[ref][r]).any() and np.isfinite(C[ref][r]).any()]
    mine = [r for r in have if np.isfinite(L[treat][r]).any() and np.isfinite(C[treat][r]).any()]
    if len(have) < 2 or len(mine) < 2:
        return None
    ref_curve = fit_curve(_means(C[ref][have]), _means(L[ref][have]))
    curve = fit_curve(_means(C[treat][mine]), _means(L[treat][mine]), c_ref=ref_curve.c_ref)
    lx, cx = _means(L[treat][mine]), _means(C[treat][mine])
    point = np.full(len(lad.rungs), np.nan)
    point[mine] = ref_curve.compute(lx) / cx
    ref_c = _means(C[ref][have])
    reach = ref_curve.compute(lx)
    extrap = np.zeros(len(lad.rungs), bool)
    extrap[mine] = (reach < ref_c.min()) | (reach > ref_c.max())
    weights = bootstrap_weights([len(s) for s in lad.seeds], n_boot, np.random.default_rng(seed))

    def boot(arr, rungs):
        return np.stack([weighted_means(arr[r, :len(lad.seeds[r])], weights[r]) for r in rungs], axis=1)

    bl_ref, bc_ref = boot(L[ref], have), boot(C[ref], have)
    bl, bc = boot(L[treat], mine), boot(C[treat], mine)
    good = np.isfinite(bl_ref).all(1) & np.isfinite(bc_ref).all(1) & np.isfinite(bl).all(1) & np.isfinite(bc).all(1)
    bl_ref, bc_ref, bl, bc = bl_ref[good], bc_ref[good], bl[good], bc[good]
    E, a, alpha = fit_many(bc_ref, bl_ref, ref_curve.form, ref_curve.c_ref)
    samples = np.full((len(bl), len(lad.rungs)), np.nan)
    samples[:, mine] = inverse(bl, E[:, None], a[:, None], alpha[:, None], ref_curve.c_ref) / bc
    gap = lx - ref_curve.loss(cx)
    slope, cross = slope_and_crossing(np.log10(cx)[None], gap[None])
    bgap = bl - (E[:, None] + a[:, None] * (bc / ref_curve.c_ref) ** (-alpha[:, None]))
    bslope, bcross = slope_and_crossing(np.log10(bc), bgap)
    n = int(min(min(np.isfinite(L[x][r]).sum() for r in mine) for x in (treat, ref)))
    return Reading(lad.rungs, point, samples, extrap, curve, ref_curve, float(slope[0]), bslope, float(cross[0]),
                   bcross, float(cx[-1]), n)


def _fmt(v: float) -> str:
    return "∞" if math.isinf(v) else f"{v:.3g}"


def multiplier_text(res: Reading, label: str, level: float = 0.95) -> str:
    """Every rung's multiplier with its interval: "d64×2: 0.71 [0.62, 0.80]; …"."""
    parts = []
    for r, rung in enumerate(res.rungs):
        if not math.isfinite(res.multiplier[r]) and not math.isinf(res.multiplier[r]):
            continue
        lo, hi = percentile_interval(res.samples[:, r], level)
        flag = " (extrapolated)" if res.extrapolated[r] else ""
        parts.append(f"D{rung[0]}×{rung[1]}: {_fmt(res.multiplier[r])} [{_fmt(lo)}, {_fmt(hi)}]{flag}")
    return f"{label}: " + "; ".join(parts)


def _failures(lad: Ladder, labels: tuple[str, ...], n: int) -> str:
    why = [lad.status[x] for x in labels if lad.status.get(x)]
    if why:
        return "; ".join(why)
    return f"at n = {n} (fewer than {MIN_SEEDS} seeds at a rung)" if n < MIN_SEEDS else ""


def decide_claims(jobs: list[tuple[Claim, str, StoreRows]], Verdict, n_boot: int = N_BOOT) -> list:
    """The verdicts of the ``multiplier`` and ``gap_trend`` claims (``jobs``: each claim at a preset with its store's
    gated rows), Holm-adjusted within (store, preset, family)."""
    items = []
    for claim, preset, rows in jobs:
        comp = claim.comparisons[0].at(preset)
        where = {k: v for k, v in ((k, resolve(v, preset)) for k, v in claim.where.items()) if v is not None}
        frame = rows.frame[matches(rows.frame, where)] if where else rows.frame
        lad = ladder(frame, [comp.treatment, comp.reference])
        got = {rd: compare(lad, comp.treatment.label, comp.reference.label, rd, n_boot) for rd in READINGS}
        items.append((claim, preset, rows, frame, comp, lad, got))
    families: dict[tuple, list[int]] = {}
    pvals = []
    for i, (claim, preset, _rows, _frame, comp, lad, got) in enumerate(items):
        res = got["train_flops"]
        p = math.nan
        if res is not None and not _failures(lad, (comp.treatment.label, comp.reference.label), res.n):
            p = (two_sided_p(res.samples[:, _top(res)], claim.margin or 1.0) if claim.rule == "multiplier"
                 else two_sided_p(res.slope_samples, 0.0))
        pvals.append(p)
        families.setdefault((claim.store_name, preset, claim.family), []).append(i)
    adj = [(math.nan, ALPHA)] * len(items)
    for members in families.values():
        p_adj, levels = stats.holm([pvals[i] for i in members], ALPHA)
        for i, pa, lv in zip(members, p_adj, levels):
            adj[i] = (pa, lv if math.isfinite(lv) else ALPHA)
    return [_verdict(*item, *adj[i], Verdict) for i, item in enumerate(items)]


def _top(res: Reading) -> int:
    """The largest rung both arms ran."""
    return max(r for r in range(len(res.rungs)) if np.isfinite(res.multiplier[r]) or np.isinf(res.multiplier[r]))


def _verdict(claim, preset, rows, frame, comp, lad, got, p_adj, level, Verdict):
    res, cpu = got["train_flops"], got["best_cpu_s"]
    base = dict(context=rows.context_id, runs=rows.run_ids, commits=rows.commits, scope=run_facts(frame))
    if res is None:
        return Verdict(claim, preset, "not run", note="fewer than two rungs with both arms' final cells", **base)
    why = _failures(lad, (comp.treatment.label, comp.reference.label), res.n)
    conf = 1 - level
    t = _top(res)
    cross_line = _crossing(res)
    if claim.rule == "multiplier":
        lo, hi = percentile_interval(res.samples[:, t], conf)
        value, null = res.multiplier[t], claim.margin or 1.0
        head = (f"{comp.name}: multiplier {_fmt(value)} [{_fmt(lo)}, {_fmt(hi)}] at the largest rung "
                f"D{res.rungs[t][0]}×{res.rungs[t][1]} (n = {res.n}; > 1: {comp.treatment.label} reaches that loss "
                f"with less compute)")
    else:
        lo, hi = percentile_interval(res.slope_samples, conf)
        value, null = res.slope, 0.0
        head = (f"{comp.name}: gap slope {value:+.3g} [{lo:+.3g}, {hi:+.3g}] nats per decade of FLOPs "
                f"(n = {res.n}; negative: the gap closes); {cross_line}")
    decided = math.isfinite(p_adj) and p_adj < ALPHA
    if why:
        verdict = f"not decidable {why}" if why.startswith("at ") else f"not decidable: {why}"
    elif claim.rule == "multiplier":
        verdict = ("supported" if decided and lo > null else
                   f"contradicted: {comp.treatment.label} worth less than {null:g}× {comp.reference.label}'s compute"
                   if decided and hi < null else "inconclusive")
    else:
        verdict = ("supported" if decided and hi < 0 else
                   "contradicted: the gap widens with compute" if decided and lo > 0 else "inconclusive")
    curves = "; ".join(f"{x} {c.form}: E {c.E:.3g}, α {c.alpha:.3g}" for x, c in
                       ((comp.reference.label, res.ref_curve), (comp.treatment.label, res.curve)) if c is not None)
    reading = multiplier_text(cpu, "CPU-seconds reading") if cpu is not None else "CPU-seconds: no rows"
    ours = "; ".join((head, multiplier_text(res, "every rung (FLOPs)", conf), reading))
    note = (f"bootstrap: {N_BOOT} seed-stratified resamples, both curves refitted; interval at the Holm level "
            f"{conf:.3g} of its family; fits: {curves}")
    if claim.margin and claim.rule == "multiplier" and claim.margin != 1:
        note += f"; claimed multiplier {claim.margin:g}"
    return Verdict(claim, preset, verdict, ours=ours, note=note, n=res.n, cost_s=_cost(frame, comp), **base)


def _crossing(res: Reading) -> str:
    top = math.log10(res.top_compute)
    reach = float(np.mean(res.cross_samples <= top + math.log10(CROSS_REACH))) if res.cross_samples.size else 1.0
    lo, hi = percentile_interval(res.cross_samples, 0.95)
    where = ("the gap line does not reach 0" if math.isinf(res.cross) else
             f"the gap line reaches 0 at {10 ** res.cross:.3g} FLOPs (95 % [{_pow(lo)}, {_pow(hi)}])")
    if reach < 0.05:
        return f"{where}; no crossing within {CROSS_REACH:g}× the largest rung at 95 % ({100 * reach:.1f} % do)"
    return f"{where}; {100 * reach:.0f} % of the resamples cross within {CROSS_REACH:g}× the largest rung"


def _pow(x: float) -> str:
    return "∞" if math.isinf(x) else f"{10 ** x:.3g}"


def _cost(frame: pd.DataFrame, comp) -> float:
    if "metric" not in frame:
        return 0.0
    rows = frame[(frame["metric"] == "train_cpu_s") & (matches(frame, comp.treatment.where)
                                                       | matches(frame, comp.reference.where))]
    return float(rows["value"].sum())


__all__ = ["Ladder", "RULES", "Reading", "compare", "decide_claims", "ladder", "multiplier_text"]
