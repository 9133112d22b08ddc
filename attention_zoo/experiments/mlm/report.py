"""The masked LM's report: test loss and perplexity per arm, each arm's size and compute, the expert-load balance of
the MoA arms, the tuning grid, the calibration against the unigram model, how the runs stopped, and the verdicts of
the claims that read this store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ... import report
from ...claims import frame_verdicts, verdict_markdown
from ...results import ResultStore
from ..token_report import final_frame, stopping
from ..tuning import Tuning, calibration_lines

NAME = "masked_lm"
SIZE = ("params", "attention_params", "fwd_flops")
BALANCE = ("expert_load_cv", "expert_load_entropy", "expert_load_max_share", "expert_load_unused")


def quality(df: pd.DataFrame) -> pd.DataFrame:
    """Per arm: test loss mean [95 % t-interval] (n), perplexity at the mean loss, parameters, forward MFLOPs, the
    d_ff and heads it ran with."""
    ok = df[df["status"] == "ok"]
    rows = []
    for arm, g in ok.groupby("arm"):
        loss = g.loc[g["metric"] == "test_loss", "value"].to_numpy(float)
        if not len(loss):
            continue
        mean, lo, hi = report.t_interval(loss)
        size = g[g["metric"].isin(SIZE)].groupby("metric")["value"].mean()
        bb = json.loads(g["backbone"].iloc[0]) if "backbone" in g else {}
        rows.append({"arm": arm, "variant": g["variant"].iloc[0], "heads": bb.get("n_heads", ""),
                     "d_ff": bb.get("d_ff", ""), "test loss (nats)": f"{mean:.4f}" + (
                         f" [{lo:.4f}, {hi:.4f}]" if pd.notna(lo) else "") + f" (n={len(loss)})",
                     "test ppl": math.exp(mean),
                     "params": size.get("params"), "attention params": size.get("attention_params"),
                     "forward MFLOP/seq": size.get("fwd_flops", float("nan")) / 1e6})
    return pd.DataFrame(rows)


def balance(df: pd.DataFrame) -> pd.DataFrame:
    """The MoA arms' expert-load statistics per layer, means over seeds (the test pass)."""
    b = df[df["metric"].isin(BALANCE) & (df["status"] == "ok")]
    if b.empty:
        return pd.DataFrame()
    return (b.groupby(["arm", "layer_index", "metric"])["value"].mean().unstack("metric").reset_index()
            .rename(columns=lambda c: c.replace("expert_load_", "")))


def write_report(out: Path, store: ResultStore, env: dict, preset_name: str, tuning: Tuning | None = None) -> list:
    df, env, tuned = final_frame(store, env, tuning)
    if df.empty:
        if tuned:  # a tuned preset whose finals wait: its grid so far
            print("\n".join(tuned))
        return []
    table = quality(df)
    verdicts = frame_verdicts(NAME, preset_name, df, store.path, store.context_id)
    bal = balance(df)
    notes = [f"Preset `{preset_name}`. Masked-character cross-entropy (nats per masked character) on the test windows "
             "at the best validation checkpoint, mean [95 % Student-t interval over seeds] (n seeds); perplexity = "
             "exp of the mean loss. Every arm is scored on the same windows with the same masks. Recipe and arms: "
             "attention_zoo/experiments/mlm/presets.py.", stopping(df), *tuned,
             *report.table_blocks(calibration_lines(df, "test_loss", "trivial_loss", True,
                                                    "a unigram model of the training characters", by=("arm",))),
             "## Verdicts of the claims that read this store", "", verdict_markdown(verdicts)]
    if not bal.empty:
        notes += ["## Expert load of the MoA arms (test pass; CV 0 and entropy 1 are perfectly balanced)", "",
                  report.markdown_table(bal, floatfmt=".3f")]
    notes += ["## Test loss per arm"]
    report.write_tables(out, NAME, df, table, env, "Masked character LM: the baselines' masked-LM claims and sweeps",
                        "\n\n".join(n for n in notes if n))
    return verdicts


__all__ = ["NAME", "balance", "quality", "stopping", "write_report"]
