"""The ladder's fits, from a scaling store's final cells: per arm, test loss against training compute
``L(C) = E + A·C^(−α)`` fitted on the seed means of its rungs (or the log-log line where four or five points do not
identify E: ``claims.scaling_fit``, scipy); each arm's multiplier over MHA at every rung, ``C_MHA(L_X(s)) / C_X(s)``
read off MHA's fitted curve (> 1: the arm reaches that loss with less compute), with a 95 % percentile interval from
a seed-stratified bootstrap (``N_BOOT`` resamples, both curves refitted in each); the trend of each arm's gap to MHA
(its loss minus MHA's curve at its own compute) per decade of compute, with where it would close. Every reading twice:
training FLOPs and CPU-seconds, both up to the best checkpoint (``rows.py``).

The arithmetic lives with the claims that decide from it (``claims/scaling.py``, below the experiments); this module
turns a store into the report's tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...claims.scaling import READINGS, compare, ladder
from ...claims.scaling_fit import percentile_interval
from ...claims.spec import Arm

REFERENCE = "mha"
N_BOOT = 2000


def final_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The final cells' rows (phase ``tuned``)."""
    return frame[frame["phase"] == "tuned"] if "phase" in frame else frame


def arms_of(frame: pd.DataFrame) -> list[str]:
    order = list(dict.fromkeys(frame["variant"])) if "variant" in frame else []
    return [REFERENCE] + [v for v in order if v != REFERENCE] if REFERENCE in order else order


def points(frame: pd.DataFrame) -> pd.DataFrame:
    """Per arm and rung: seeds, mean and SD of the test loss, mean compute on both readings, how the cells stopped."""
    df = final_rows(frame)
    if df.empty or "d_model" not in df:
        return pd.DataFrame()
    ok = df[df["status"].fillna("ok") == "ok"]
    test = ok[(ok["metric"] == "test_loss") & (ok["eval_set"].fillna(ok["dataset"]) == ok["dataset"])]
    keys = ["variant", "d_model", "n_layers"]
    out = test.groupby(keys)["value"].agg(n="count", test_loss="mean", sd="std").reset_index()
    for metric in ("train_flops", "best_cpu_s", "train_cpu_s", "params", "trivial_loss"):
        got = ok[ok["metric"] == metric].groupby(keys)["value"].mean().rename(metric)
        out = out.merge(got, on=keys, how="left")
    stops = ok[ok["metric"] == "stop"].groupby(keys)["stop_reason"].agg(
        lambda s: ", ".join(f"{k} {v}" for k, v in s.value_counts().items())).rename("stopped by")
    lrs = df.groupby(keys)["lr"].first().rename("lr") if "lr" in df else None
    out = out.merge(stops, on=keys, how="left")
    return out.merge(lrs, on=keys, how="left") if lrs is not None else out


def analyse(frame: pd.DataFrame, n_boot: int = N_BOOT, seed: int = 0) -> dict[str, pd.DataFrame]:
    """{"multipliers", "curves", "gaps"}: the leaderboard rows (arm × rung × reading), each arm's fitted curve, and
    its gap trend against MHA."""
    df = final_rows(frame)
    arms = arms_of(df)
    if REFERENCE not in arms:
        return {"multipliers": pd.DataFrame(), "curves": pd.DataFrame(), "gaps": pd.DataFrame()}
    lad = ladder(df, [Arm(v, {"variant": v}) for v in arms])
    mult, curves, gaps = [], [], []
    for reading, unit in READINGS.items():
        for arm in arms:
            res = compare(lad, arm, REFERENCE, reading, n_boot, seed)
            if res is None:
                continue
            if arm == REFERENCE:
                c = res.ref_curve
                curves.append({"arm": arm, "reading": unit, "form": c.form, "E": c.E, "A": c.A, "alpha": c.alpha})
            else:
                c = res.curve
                curves.append({"arm": arm, "reading": unit, "form": c.form, "E": c.E, "A": c.A, "alpha": c.alpha})
            for r, rung in enumerate(res.rungs):
                if math.isnan(res.multiplier[r]):
                    continue
                lo, hi = percentile_interval(res.samples[:, r], 0.95)
                compute = _mean(lad.compute[reading][arm][r])
                mult.append({"arm": arm, "reading": unit, "d_model": rung[0], "n_layers": rung[1],
                             "compute": compute, "multiplier": res.multiplier[r], "low": lo, "high": hi,
                             "extrapolated": bool(res.extrapolated[r]), "n": int(np.isfinite(lad.loss[arm][r]).sum())})
            if arm != REFERENCE:
                lo, hi = percentile_interval(res.slope_samples, 0.95)
                reach = float(np.mean(res.cross_samples <= math.log10(res.top_compute) + 2))
                gaps.append({"arm": arm, "reading": unit, "slope_per_decade": res.slope, "low": lo, "high": hi,
                             "closes_at": 10 ** res.cross if math.isfinite(res.cross) else math.inf,
                             "p_cross_within_100x": reach, "largest": res.top_compute})
    return {"multipliers": pd.DataFrame(mult), "curves": pd.DataFrame(curves).drop_duplicates(["arm", "reading"]),
            "gaps": pd.DataFrame(gaps)}


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


__all__ = ["N_BOOT", "REFERENCE", "analyse", "arms_of", "final_rows", "points"]
