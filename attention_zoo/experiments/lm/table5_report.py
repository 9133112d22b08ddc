"""Tables, figures and verdicts of Table 5 (character-level GPT-2 pretraining)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_markdown
from ...claims.paired import delta_frame, delta_table, interval_heading
from ...data.text import bpc
from ...io import read_jsonl
from ...results import ResultStore
from ..tuning import Tuning, calibration_lines, report_lines
from .presets import PAPER_DATASETS

NAME = "table5_gpt2"
REFERENCES = ("mha", "dcmha")  # the table's relative-reduction baselines
PAPER_METHOD = "damcha"
PAPER_REDUCTION = {("mix", "mha"): -5.19, ("mix", "dcmha"): -3.70}  # % change of DAMCHA's loss [Q]
PAPER_VS_DCMHA_RANGE = "−1.90 … −3.70 % (range over the three datasets)"
QUALITY = {"test_loss": "lower", "test_bpc": "lower", "val_loss": "lower"}


def _label(df: pd.DataFrame) -> pd.Series:
    return df["variant"] + "/" + df["flavor"]


def reductions(df: pd.DataFrame) -> pd.DataFrame:
    """Test-loss change (%) of every arm vs each reference (mha, dcmha in each flavour run), seeds averaged."""
    ok = df[(df["metric"] == "test_loss") & (df["eval_set"] == df["dataset"]) & (df["status"] == "ok")]
    if ok.empty:
        return pd.DataFrame()
    loss = ok.assign(label=_label(ok)).groupby(["dataset", "variant", "label"], as_index=False)["value"].mean()
    out = []
    for ds, g in loss.groupby("dataset"):
        for _, ref in g[g["variant"].isin(REFERENCES)].iterrows():
            for _, r in g[g["label"] != ref["label"]].iterrows():
                change = 100 * (r["value"] - ref["value"]) / ref["value"]
                out.append({"dataset": ds, "variant": r["label"], "reference": ref["label"],
                            "ref_variant": ref["variant"], "change_pct": change})
    return pd.DataFrame(out)


def paper_comparison(red: pd.DataFrame, steps: str) -> pd.DataFrame:
    """paper | ours for DAMCHA's relative test-loss change. A stand-in run (Shakespeare at a few hundred steps) is
    "not comparable" with the paper's Mix at GPT-2 scale: no delta."""
    if red.empty:
        return pd.DataFrame()
    entries = []
    for _, r in red[red["variant"].str.startswith(PAPER_METHOD + "/")].iterrows():
        paper_ds = r["dataset"] if r["dataset"] in PAPER_DATASETS else "mix"
        paper = PAPER_REDUCTION.get((paper_ds, r["ref_variant"]), math.nan)
        where = paper_ds + ("" if paper_ds == r["dataset"] else f" at GPT-2 scale (paper) · {r['dataset']}, {steps} "
                            "steps (ours)")
        note = "" if paper_ds == r["dataset"] else f"not comparable ({r['dataset']} stand-in vs {paper_ds})"
        if math.isnan(paper) and r["ref_variant"] == "dcmha":
            note = f"paper: {PAPER_VS_DCMHA_RANGE}" + (f"; {note}" if note else "")
        entries.append({"what": f"{where}: {r['variant']} vs {r['reference']} (test loss %)", "paper": paper,
                        "ours": r["change_pct"], "note": note})
    return report.comparison_frame(entries)


def _eval_curves(out: Path, store: ResultStore, run_dir_of) -> pd.DataFrame:
    """Periodic validation bpc of every run on its own dataset, from the runs' logs."""
    frames = []
    for rec in store.records():
        cell = rec["cell"]
        if cell.get("phase", "tuned") != "tuned":  # a tuned preset's curves: the final seeds
            continue
        for r in read_jsonl(run_dir_of(out, cell, store.context) / "metrics.jsonl"):
            if r.get("event") == "eval" and r.get("eval_set", cell["dataset"]) == cell["dataset"]:
                frames.append({"dataset": cell["dataset"], "variant": cell["variant"], "flavor": cell["flavor"],
                               "seed": cell["seed"], "step": r["step"], "value": bpc(r["loss"]), "status": "ok"})
    return pd.DataFrame(frames).drop_duplicates(["dataset", "variant", "flavor", "seed", "step"], keep="last") \
        if frames else pd.DataFrame()


def _wide(df: pd.DataFrame) -> pd.DataFrame:
    wide = report.wide_table(df, ["variant", "flavor"], ["dataset", "metric"])
    wide.columns = [c.replace(" | ", ": ") for c in wide.columns]  # a "|" inside a header breaks markdown tables
    values = [c for c in wide.columns if c not in ("variant", "flavor")]
    return wide.dropna(how="all", subset=values).reset_index(drop=True)  # pivot lists every variant × flavour


def write_report(out: Path, store: ResultStore, env: dict, preset_name: str, run_dir_of,
                 tuning: Tuning | None = None) -> tuple[pd.DataFrame, list]:
    """The report; with ``tuning`` (the decide preset) every table is of the final seeds at each arm's tuned
    setting, after the grid and the calibration against the unigram model."""
    df = store.frame()
    env = store.environment(env, df)
    if df.empty:
        return pd.DataFrame(), []
    tuned = []
    if tuning is not None:
        tuned = report.table_blocks(report_lines(tuning, store.records(),
                                          lambda c: f"{c['dataset']}: {c['variant']}/{c['flavor']}"))
        df = df[df["phase"] == "tuned"].copy() if "phase" in df else df.iloc[:0]
        if df.empty:
            print("\n".join(tuned))
            return pd.DataFrame(), []
    df["eval_set"] = df["eval_set"].fillna(df["dataset"]) if "eval_set" in df else df["dataset"]
    head = df[df["eval_set"] == df["dataset"]]
    quality = head[head["metric"].isin(["val_loss", "val_bpc", "test_loss", "test_bpc"])]
    wide = _wide(quality)
    eff = head[head["metric"].str.startswith(("tokens_per_s", "tokens_seen", "peak_", "params", "attention_params"))]
    steps = "/".join(str(int(s)) for s in sorted(set(df["max_steps"]))) if "max_steps" in df else "?"
    comp = paper_comparison(reductions(df), steps)
    verdicts = frame_verdicts(NAME, preset_name, head, store.path, store.context_id)
    n = head.groupby(["dataset", "variant", "flavor"])["seed"].nunique()
    deltas = delta_frame(head[head["metric"].isin(list(QUALITY))], ["dataset", "metric"],
                         {"variant": "mha", "flavor": "paper"})
    notes = [f"Preset `{preset_name}`; n = {'–'.join(map(str, sorted(set(n))))} seeds per arm in every table below; "
             f"{steps} optimizer steps per run (tokens seen per run in the size table). Test/validation cross-entropy "
             "in nats and bpc = nats/ln 2 (bits per byte on enwik8); final weights; Mix = mean of its enwik8 and "
             "text8 parts. Tokens/s = training targets / wall time inside training steps (evaluation excluded). "
             "Memory: CUDA `max_memory_allocated` (`peak_alloc_mib`) or, on CPU, the process's VmHWM after a "
             "clear_refs reset at the start of the cell (`peak_rss_mib`, includes interpreter, torch and corpus; "
             "not comparable with CUDA numbers). Baselines run in the flavour shown. Presets and the DAMCHA "
             "generator configuration: attention_zoo/experiments/lm/table5_gpt2.py.",
             *tuned, *report.table_blocks(calibration_lines(head, "test_loss", "trivial_loss", True,
                                                   "a unigram of the training text")),
             "## Verdicts on the paper's claims (Table 5)", "", verdict_markdown(verdicts)]
    if not deltas.empty:
        notes += [f"## Seed-paired change vs MHA/paper (% of MHA's value; {interval_heading(deltas)}; lower is "
                  "better)", "", report.markdown_table(delta_table(deltas, ["dataset", "metric"], QUALITY))]
    if "eval_targets" in head:
        cover = (head.dropna(subset=["eval_targets"]).groupby(["dataset", "context", "stride"])
                 [["eval_targets", "split_targets"]].first())
        notes += ["Final evaluation (deterministic windows): " + "; ".join(
            f"{ds}: context {int(c)}, stride {int(s)}, {int(r.eval_targets):,} of {int(r.split_targets):,} targets "
            "per split scored" for (ds, c, s), r in cover.iterrows())]
    ci = report.ci_table(quality[quality["metric"].isin(["test_loss", "test_bpc"]) & (quality["status"] == "ok")],
                         ["variant", "flavor"], ["dataset", "metric"])
    notes += ["## Test loss and bpc: mean [95 % Student-t interval] (n seeds)", "", report.markdown_table(ci)]
    if not eff.empty:
        notes += ["## Efficiency and size (means over seeds)", "", report.markdown_table(_wide(eff), floatfmt=".1f")]
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        notes += ["Non-ok cells: " + "; ".join(f"{r.dataset}/{r.variant}/{r.flavor}: {r.status} {r.message}"
                                               for r in bad.drop_duplicates(["dataset", "variant", "flavor"])
                                               .itertuples())]
    notes += ["## Validation and test loss (nats) and bpc (seed means)"]
    report.write_tables(out, NAME, df, wide, env, "Table 5: character-level GPT-2 pretraining", "\n\n".join(notes),
                        best={c: "min" for c in wide.columns if c.endswith(("loss", "bpc"))}, comparison=comp)
    _figures(out, store, env, preset_name, deltas, run_dir_of, steps, report.setting_note(head))
    return comp, verdicts


def _figures(out, store, env, preset_name, deltas, run_dir_of, steps, note=None) -> None:
    where = f"{preset_name}: {'/'.join(sorted(set(deltas['dataset'])))} · {steps} steps" if not deltas.empty else ""
    if not deltas.empty:
        shown = deltas[deltas["metric"] == "test_bpc"].assign(panel=lambda d: d["dataset"] + ": test bpc ↓")
        plots.delta_plot(shown, "panel", out / f"{NAME}_delta.png",
                         f"Table 5 ({where}; n = {int(deltas['n'].max())} seeds; {env.get('device_name')}): "
                         "seed-paired change vs MHA/paper, " + plots.interval_title(shown),
                         "change vs MHA (% of MHA's bpc)",
                         reference="MHA/paper", note=note)
    curves = _eval_curves(out, store, run_dir_of)
    if curves.empty or curves["step"].nunique() < 2:
        return
    for ds, g in curves.groupby("dataset"):
        d = delta_frame(g, ["dataset", "step"], {"variant": "mha", "flavor": "paper"})
        if d.empty:
            continue
        plots.interval_plot(d, "step", "arm", out / f"{NAME}_delta_curve_{ds}.png",
                            f"Table 5 ({preset_name}: {ds}; n = {int(d['n'].max())} seeds): validation bpc during "
                            "training, seed-paired change vs MHA/paper (periodic subset)",
                            "change vs MHA (% of MHA's validation bpc)", "optimizer step",
                            zero=f"0 = MHA/paper (reference); bars: {plots.interval_words(d)} over {int(d['n'].max())} "
                                 "seeds",
                            note=note)
