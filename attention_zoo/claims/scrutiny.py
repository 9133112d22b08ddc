"""The tests a skeptic adds to a comparison (``verdicts`` applies them): the seeds that would detect an effect at the
family's fixed level, whether the effect still moves at the end of the budget, whether a positive control shows the
task exercises what the claim is about, and the words that name a stand-in (docs/claims.md §2, §5)."""

from __future__ import annotations

import math

import pandas as pd

from . import stats
from .controls import interval_text
from .data import matches, metric_rows
from .spec import Claim, base_preset, resolve

ALPHA = 0.05  # the family-wise level (verdicts.ALPHA)


def _frac(f: float) -> str:
    return {0.125: "1/8", 0.25: "1/4", 0.5: "1/2", 1.0: "1"}.get(f, f"{f:g}")


MAX_SEEDS = 100_000


def seeds_to_detect(sd: float, target: float, alpha: float, power: float = 0.8) -> int | None:
    """The smallest n (≥ 5) whose MDE (``stats.mde`` at ``alpha``) is at most ``target``; None beyond MAX_SEEDS."""
    if stats.mde(MAX_SEEDS, sd, alpha, power) > target:
        return None
    lo, hi = stats.DECIDABLE_N, stats.DECIDABLE_N
    while stats.mde(hi, sd, alpha, power) > target:  # doubling, then bisection: the MDE falls with n
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if stats.mde(mid, sd, alpha, power) > target else (lo, mid)
    return lo


def seeds_needed(res, paper_task: bool) -> str:
    """Seeds for the MDE at this SD, at the family's fixed level α/m, to reach the paper's effect (paper task) or
    the observed one: the smallest such n, from the same power formula as the MDE."""
    quoted = res.comp.paper_effect is not None and paper_task
    target = abs(res.comp.paper_effect) if quoted else abs(res.test.mean)
    if not (math.isfinite(res.test.sd) and res.test.sd > 0 and math.isfinite(target) and target > 0):
        return ""
    what = "the paper's effect" if quoted else "the observed effect"
    alpha = ALPHA / res.family_m
    n = seeds_to_detect(res.test.sd, target, alpha)
    if n is None:
        return f"> {MAX_SEEDS:,} seeds at this SD for an effect of {target:.2g} {res.unit}"
    return f"{n} seeds at this SD detect {what} ({target:.2g} {res.unit}) at α/m = {alpha:.3g}"


def budget_bound(res) -> str:
    """Why a comparison is budget-bound, or "": its effect still moved between the last two budget fractions (the
    seed-paired change has a 95 % t-interval excluding 0, n ≥ 5) in the direction that could overturn its verdict —
    toward what the paper claims where the verdict is contradicted or inconclusive, away from it where it is
    supported. For a claim that the treatment is better, "toward the claim" is "toward the treatment"."""
    if res.movement is None:
        return ""
    f0, f1, d = res.movement
    t = stats.paired_test(res.direction * d)  # oriented as the claim: positive = toward what the paper says
    if not t.decidable or not (t.low > 0 or t.high < 0):
        return ""
    toward = t.mean > 0
    if res.verdict in ("contradicted", "inconclusive") and toward or res.verdict == "supported" and not toward:
        side = "toward" if toward else "away from"
        who = f" ({res.comp.treatment.label} {'gaining' if toward == (res.direction > 0) else 'losing'})"
        return (f"the effect still moves {side} the paper's claim{who} between {_frac(f0)} and {_frac(f1)} of the "
                f"budget ({t.mean:+.3g} [{t.low:+.3g}, {t.high:+.3g}] {res.unit}, n = {t.n})")
    return ""


def positive_control(claim: Claim, preset: str, frame: pd.DataFrame, results: list) -> str:
    """Apply the claim's positive control (``Claim.positive_control``): its arm's per-seed slope of the metric over
    ``positive_over``, oriented so that a rising error is positive, must have a 95 % t-interval above 0; where it
    does not, every comparison of the claim becomes not decidable. Returns the note that states the slope."""
    arm, over = claim.positive_control, claim.positive_over
    if arm is None:
        return ""
    metric = resolve(claim.metric, preset)
    rows = metric_rows(frame, metric)
    part = rows[matches(rows, arm.where)] if not rows.empty else rows
    if part.empty or over not in part:
        return f"positive control {arm.label}: not run in this store"
    sign = 1.0 if claim.better == "lower" else -1.0  # worse = up
    per = part.groupby([*claim.pair_on, over])["value"].mean().reset_index()
    slopes = [sign * stats.slope(g[over], g["value"]) for _, g in per.groupby(list(claim.pair_on))
              if g[over].nunique() > 1]
    t = stats.paired_test(slopes)
    text = (f"positive control {arm.label}: its {metric} worsens by {interval_text(t)} per unit {over} "
            f"(n = {t.n})")
    if t.decidable and t.low > 0:
        return text + ": the task responds"
    why = (f"the task does not isolate {claim.positive_what or 'what the claim is about'} ({text}, "
           + ("not above 0)" if t.decidable else "too few seeds to show it)"))
    for r in results:
        if r.verdict not in ("not run",) and not r.gate and not r.diverged:
            r.verdict, r.why = "not decidable", why
    return text


METRIC_WORDS = {"mse": "MSE", "nll": "NLL", "fid_top50": "FID@Top-50", "fid": "FID", "bartscore": "BARTScore",
                "bertscore_f1": "BERTScore F1", "mse_iqr": "IQR of per-sample MSE", "nll_iqr": "IQR of per-sample NLL",
                "mse_q90": "90th percentile of per-sample MSE", "nll_q90": "90th percentile of per-sample NLL",
                "val_loss": "validation loss", "test_loss": "test loss", "top1": "top-1 accuracy",
                "test_mse": "test MSE", "test_acc": "test accuracy"}
DATA_WORDS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "wmt14": "WMT14", "commongen": "CommonGen",
              "imagenet": "ImageNet-1K", "shakespeare": "Shakespeare", "enwik8": "enwik8", "text8": "text8",
              "mix": "enwik8/text8 mix"}


def stand_in(claim: Claim, preset: str) -> str:
    """"<our data> <our metric> (stand-in for <the paper's data> <the paper's metric>)" where the preset's rows are
    not the paper's task and its data or metric differs from the paper's; "" otherwise."""
    if base_preset(preset) in claim.paper_task or "paper" not in claim.scope:
        return ""
    metric, paper_metric = resolve(claim.metric, preset), resolve(claim.metric, "paper")
    data, paper_data = (resolve(claim.where.get("dataset"), p) for p in (preset, "paper"))

    def words(d, m):
        return " ".join(w for w in (DATA_WORDS.get(d, d) if d else "", METRIC_WORDS.get(m, m)) if w)

    ours, theirs = words(data, metric), claim.paper_metric or words(paper_data, paper_metric)
    return "" if ours == theirs else f"{ours} (stand-in for {theirs})"
