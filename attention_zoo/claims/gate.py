"""The learned-at-all gate: a cell whose arm does not beat its task's trivial predictor decides nothing.

A comparison of two arms that learned nothing measures noise, and one arm that learned nothing makes the effect a
measure of that failure. Each cell (one arm, one setting, one seed) is checked against what its store records:

- a metric beside its trivial reference (``CALIBRATIONS``: the training-mean predictor's MSE, the majority class's
  or chance accuracy, a unigram model's loss) must be beaten by a stated margin: a loss at least 1 % below the
  trivial one, an accuracy at least 2 points above it;
- generated text must be text: BERTScore F1 of exactly 0, half or more of the hypotheses empty, or hypotheses that
  repeat a few words (on average fewer than 30 % distinct words) fail. This check gates only the metrics that score
  the generated text (``GENERATED``): a held-out NLL is teacher-forced, so a model whose greedy decoding loops can
  still be compared on it once its loss beats the trivial one.

Failing rows get the status ``not_learned`` (their message says why). A comparison in which any seed of either arm
failed is "not decidable: stand-in not learned" (``verdicts``): dropping the failed seeds would select the runs
that favour one arm. Stores without any calibration rows are reported as unchecked, never as passed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

NOT_LEARNED = "not_learned"
# The columns that identify one cell's rows in a flattened store (those present are used).
CELL_KEYS = ("experiment", "task", "lam", "d_e", "dataset", "setting", "depth", "inference", "model", "d_model",
             "n_layers", "variant", "flavor", "arm", "seq_len", "n_pairs", "seed")
# d_model, n_layers: a rung of the scale ladder; arm, seq_len, n_pairs: the baselines' stand-ins
LOSS_MARGIN, ACC_MARGIN = 0.01, 0.02  # relative to the trivial loss; accuracy as a fraction (2 points)
EMPTY_AT, DISTINCT_BELOW = 0.5, 0.3
GENERATED = ("bertscore", "bartscore")  # metric name prefixes that score generated text


@dataclass(frozen=True)
class Calibration:
    """``metric`` must beat ``trivial`` (another metric of the same cell) in direction ``better``."""

    metric: str
    trivial: str
    better: str  # "lower" | "higher"
    what: str  # the trivial predictor, as the message names it


CALIBRATIONS = (
    Calibration("test_mse", "trivial_mse", "lower", "the training-mean predictor"),
    Calibration("test_acc", "chance_acc", "higher", "chance (the majority class)"),
    Calibration("val_loss", "trivial_val_loss", "lower", "the trivial predictor"),
    Calibration("test_loss", "trivial_loss", "lower", "a unigram model"),
    Calibration("top1", "chance_top1", "higher", "the majority class"),
)


def beats(value: float, trivial: float, better: str) -> bool:
    if not (math.isfinite(value) and math.isfinite(trivial)):
        return False
    if better == "lower":
        return value < trivial * (1 - LOSS_MARGIN)
    scale = 1.0 if trivial <= 1.0 else 100.0  # accuracy stored as a fraction or in percent
    return value > trivial + ACC_MARGIN * scale


@lru_cache(maxsize=256)
def _text_outputs(path: str) -> tuple[float, float] | None:
    """(fraction of empty hypotheses, mean fraction of distinct words) of one per-sample file, or None."""
    try:
        hyps = [json.loads(line).get("hypothesis") for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    hyps = [h for h in hyps if isinstance(h, str)]
    if not hyps:
        return None
    words = [h.split() for h in hyps]
    empty = sum(not w for w in words) / len(words)
    ratios = [len(set(w)) / len(w) for w in words if w]
    return empty, (sum(ratios) / len(ratios) if ratios else 0.0)


def _cell_failure(cell: pd.DataFrame, folder: Path | None) -> tuple[bool, str, bool]:
    """(checked, reason, text_only): whether any calibration applied to this cell, why it failed ('' if it did not)
    and whether the failure concerns only the generated text (then only ``GENERATED`` metrics fail)."""
    values = cell.groupby("metric")["value"].mean() if "metric" in cell else pd.Series(dtype=float)
    checked = False
    for cal in CALIBRATIONS:
        if cal.metric in values and cal.trivial in values:
            checked = True
            v, t = float(values[cal.metric]), float(values[cal.trivial])
            if not beats(v, t, cal.better):
                return True, f"{cal.metric} {v:.4g} does not beat {cal.what} ({t:.4g})", False
    if "bertscore_f1" in values:
        checked = True
        if float(values["bertscore_f1"]) <= 0:
            return True, "BERTScore F1 0 (empty outputs)", True
    if folder is not None and "per_sample" in cell:
        for rel in cell["per_sample"].dropna().unique():
            stats = _text_outputs(str(folder / str(rel)))
            if stats is None:
                continue
            checked = True
            empty, distinct = stats
            if empty >= EMPTY_AT:
                return True, f"{100 * empty:.0f} % of the generated texts are empty", True
            if distinct < DISTINCT_BELOW:
                return True, f"repeated outputs ({100 * distinct:.0f} % distinct words per text)", True
    return checked, "", False


def apply_gate(df: pd.DataFrame, folder: Path | None = None) -> tuple[pd.DataFrame, bool]:
    """(rows with failing cells' ok rows set to ``not_learned``, whether any cell could be checked)."""
    if df.empty or "metric" not in df:
        return df, False
    keys = [k for k in CELL_KEYS if k in df]
    if not keys:
        return df, False
    out = df.copy()
    if "message" not in out:
        out["message"] = ""
    any_checked = False
    for _, cell in out.groupby(keys, dropna=False, sort=False):
        checked, reason, text_only = _cell_failure(cell, folder)
        any_checked |= checked
        if reason:
            failing = cell["metric"].astype(str).str.startswith(GENERATED) if text_only else True
            ok = cell.index[(cell["status"].fillna("ok") == "ok") & failing]
            out.loc[ok, "status"] = NOT_LEARNED
            out.loc[ok, "message"] = reason
    return out, any_checked


def arm_failures(rows: pd.DataFrame, pair_on: tuple[str, ...]) -> tuple[int, int, str]:
    """(units of the arm, units with a not-learned cell, the first reason) over an arm's rows of every status."""
    if rows.empty or any(k not in rows for k in pair_on):
        return 0, 0, ""
    units = rows.groupby(list(pair_on)).ngroups
    bad = rows[rows["status"] == NOT_LEARNED]
    if bad.empty:
        return units, 0, ""
    return units, bad.groupby(list(pair_on)).ngroups, str(bad["message"].iloc[0])


__all__ = ["CALIBRATIONS", "GENERATED", "NOT_LEARNED", "Calibration", "apply_gate", "arm_failures", "beats"]
