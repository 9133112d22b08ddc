"""Table 1's report (render-only: a change here re-renders the section and leaves its store current): the paper
comparison, the seed-paired deltas vs MHA, the interval table, the verdicts and the delta figure."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_markdown
from ...claims.gate import DISTINCT_BELOW, EMPTY_AT, GENERATED, NOT_LEARNED, apply_gate
from .config import Context
from .tables_report import (
    ANALOG,
    NOT_COMPARABLE,
    PAPER_NAMES,
    flat_wide,
    image_text_notes,
    means,
    paired_section,
    params_section,
    pct,
    seeds_line,
)

NAME = "table1_generation"
IMAGE_METRICS = ("mse", "fid", "fid_top50", "feature_distance")
TEXT_METRICS = ("nll", "bertscore_f1", "bertscore_f1_nll_top50", "bertscore_f1_score_top50", "bartscore",
                "bartscore_nll_top50", "bartscore_score_top50")
PAPER = {("cifar10", "fid_top50"): {"mha": 91.4320, "damcha": 63.0295},  # [docs; Q]
         ("cifar100", "fid_top50"): {"mha": 59.6860, "damcha": 53.7560},
         ("wmt14", "bartscore"): {"mha": -8.4740, "damcha": -5.4451},
         ("commongen", "bartscore"): {"mha": -5.9250, "damcha": -5.6142}}
CI_METRICS = ("mse", "fid_top50", "nll", "bertscore_f1", "bartscore")  # the 95 % interval table
RELATIVE = (("cifar10", "fid_top50", "mma", -25.8), ("cifar10", "fid_top50", "mha", -31.1),  # DAMCHA vs ref, % [Q/D]
            ("cifar100", "fid_top50", "mha", -9.94), ("wmt14", "bartscore", "mha", 35.7),
            ("commongen", "bartscore", "mha", 5.25))


# ---- Table 1 ------------------------------------------------------------------------------------------------------
BETTER = {"mse": "lower", "fid": "lower", "fid_top50": "lower", "nll": "lower", "val_loss": "lower",
          "bertscore_f1": "higher", "bartscore": "higher", "bartscore_score_top50": "higher"}
DELTA_PANELS = {"fid_top50": "FID@Top-50 ↓", "mse": "MSE ↓", "nll": "NLL ↓", "bertscore_f1": "BERTScore F1 ↑"}


def paper_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """paper | ours | delta for the quoted cells and DAMCHA's relative claims. One policy: a value measured on a
    stand-in (digits, concepts) is set beside the paper's number as "not comparable" (no delta), a cell whose
    metric did not run (no BARTScore offline) says "not run"; every label names the dataset each side measured and
    the baseline's flavour."""
    if df.empty:
        return pd.DataFrame()
    vals, present, entries = means(df, ["dataset", "variant"]), set(df["dataset"]), []
    flavours = {v: sorted(set(g["flavor"])) for v, g in df.groupby("variant")}

    def side(pds, metric, variant):
        ds = pds if pds in present else ANALOG[pds]
        ours = vals.get((ds, variant, metric), math.nan)
        where = PAPER_NAMES[pds] + ("" if ds == pds else f" (paper) · {ds} (ours)")
        if ds not in present or math.isnan(ours):
            return where, ours, f"not run: no {metric} rows on {ds}"
        return where, ours, "" if ds == pds else f"{NOT_COMPARABLE} ({ds} stand-in vs {PAPER_NAMES[pds]})"

    for (pds, metric), per in PAPER.items():
        for v, p in per.items():
            where, ours, note = side(pds, metric, v)
            fl = "damcha_repo" if "damcha_repo" in flavours.get(v, []) else "paper"
            entries.append({"what": f"{where}: {metric}, {v}/{fl}", "paper": p, "ours": ours, "note": note,
                            "source": (where, v, metric)})
    for pds, metric, ref, paper in RELATIVE:
        where, dam, note = side(pds, metric, "damcha")
        ref_val = side(pds, metric, ref)[1]
        fl = "damcha_repo" if "damcha_repo" in flavours.get(ref, []) else "paper"
        entries.append({"what": f"{where}: {metric}, damcha vs {ref}/{fl} (%)", "paper": paper,
                        "ours": pct(dam, ref_val), "note": note, "source": (where, ref, metric)})
    return report.comparison_frame(entries)


def text_gate_note(df: pd.DataFrame, folder: Path | None) -> str | None:
    """One line naming the arms whose generated texts fail the verdicts' learned-at-all gate (empty or repeated
    outputs), so a BERTScore/BARTScore delta of those arms is read as a comparison of degenerate texts."""
    gated, _ = apply_gate(df, folder)
    bad = gated[(gated["status"] == NOT_LEARNED) & gated["metric"].astype(str).str.startswith(GENERATED)]
    if bad.empty:
        return None
    arms = ["variant", "flavor"]
    parts = []
    for ds, g in bad.groupby("dataset"):
        failed = g.groupby(arms)["seed"].nunique()
        of = df[df["dataset"] == ds].groupby(arms)["seed"].nunique()
        if len(failed) == len(of):  # every arm: one phrase, not a list of all of them
            lo, hi = int(failed.min()), int(failed.max())
            parts.append(f"every arm on {ds} ({lo if lo == hi else f'{lo}–{hi}'} of {int(of.max())} seeds each)")
        else:
            parts += [f"{ds} {v}/{fl} ({k} of {of[(v, fl)]} seeds)" for (v, fl), k in failed.items()]
    return (f"Generated text fails the learned-at-all gate (≥ {100 * EMPTY_AT:.0f} % of texts empty, or under "
            f"{100 * DISTINCT_BELOW:.0f} % distinct words per text) for {'; '.join(parts)}: their BERTScore/BARTScore "
            "deltas compare degenerate texts and decide nothing.")


def write_report(ctx: Context, df: pd.DataFrame, env: dict, store=None) -> tuple[pd.DataFrame, list]:
    """Tables, figures and the verdicts on Table 1's claims (and App. E's) from every cell of this context."""
    if df.empty:
        return pd.DataFrame(), []
    df = df.assign(label=df["variant"] + "/" + df["flavor"])
    head = df[df["metric"].isin(IMAGE_METRICS + TEXT_METRICS + ("val_loss",))]
    wide = flat_wide(head, ["variant", "flavor"], ["dataset", "metric"])
    comp = paper_comparison(df)
    verdicts = frame_verdicts(NAME, ctx.preset_name, df, getattr(store, "path", None),
                              getattr(store, "context_id", ""))
    deltas_md, deltas = paired_section(df, BETTER, {"variant": "mha", "flavor": "paper"}, "MHA/paper")
    gate_note = text_gate_note(df, store.path.parent if store is not None else None)
    deltas_md += [gate_note] if deltas_md and gate_note else []
    notes = [seeds_line(df, ctx, "arm (variant/flavour)"), *image_text_notes(df, ctx),
             "## Verdicts on the paper's claims (Table 1, App. E)", "", verdict_markdown(verdicts), *deltas_md,
             *params_section(df),
             "Images: MSE on the masked patches (pixel task: whole image), FID over all scored pairs, FID@Top-50, mean "
             "squared L2 Inception-feature distance, `val_loss` = the training loss over the whole held-out "
             "validation split. Text: mean per-example target NLL (nats/token), BERTScore F1 (offline "
             "all-MiniLM-L6-v2; not comparable with roberta-large values), BARTScore (facebook/bart-base); "
             "`_nll_top50` = mean over the 50 lowest-NLL examples (new code), `_score_top50` = mean of the 50 highest "
             "scores (old code; probably the paper's). The paper's text 'BARTScore' is compared with our mean.",
             "Model selection: lowest validation loss (smoke: evaluated once, final weights). Scored on the first "
             "examples of the validation split (the authors' protocol). Baselines in the flavour shown."]
    ci = report.ci_table(df[df["metric"].isin(CI_METRICS) & (df["status"] == "ok")], ["variant", "flavor"],
                         ["dataset", "metric"])
    if not ci.empty:
        notes += ["## Mean and 95 % Student-t interval over seeds (n per cell)", "", report.markdown_table(ci)]
    notes += ["## Table 1 (seed means)"]
    report.write_tables(ctx.out, NAME, df, wide, env, "Table 1: decoder-only generation", "\n\n".join(notes),
                        best={c: "max" if "score" in c else "min" for c in wide.columns if ": " in c},
                        comparison=comp)
    if not deltas.empty:
        shown = deltas[deltas["metric"].isin(list(DELTA_PANELS))].copy()
        shown["panel"] = shown["dataset"] + ": " + shown["metric"].map(DELTA_PANELS)
        n = int(deltas["n"].max())
        sets = "/".join(sorted(set(df["dataset"])))
        plots.delta_plot(shown, "panel", ctx.out / f"{NAME}_delta.png",
                         f"Table 1 ({ctx.preset_name}: {sets}; n = {n} seeds; {env.get('device_name')}): seed-paired "
                         "change vs MHA/paper, " + plots.interval_title(shown), "change vs MHA (% of MHA's value)",
                         reference="MHA/paper", note=" ".join(x for x in (
                             report.setting_note(df, arms=("dataset", "variant", "flavor")), gate_note) if x) or None)
    return comp, verdicts
