"""Table 4's report (render-only: a change here re-renders the section and leaves its store current): the relative
changes vs DAMCHA, the paper comparison, the seed-paired deltas, the verdicts and the delta figure on the verdicts'
metrics (held-out MSE and NLL at the decide preset) with FID@Top-50 and BERTScore beside them."""

from __future__ import annotations

import math

import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_markdown
from ...claims.ledger import ABLATION_IMAGE, ABLATION_TEXT
from ...claims.spec import resolve
from . import tables_report as gc
from .ablations import SETTINGS, TABLE4_ROWS

NAME = "table4_ablation"

LABELS = {"full": "DAMCHA", "no_sharing": "w/o sharing", "no_fx": "w/o f(x)", "no_both": "w/o both"}
METRICS = ("mse", "fid", "fid_top50", "nll", "bartscore", "bartscore_nll_top50", "bartscore_score_top50",
           "bertscore_f1", "bertscore_f1_nll_top50", "bertscore_f1_score_top50")
PAPER = (("cifar10", "fid_top50", "no_both", 17.59), ("cifar10", "fid_top50", "no_sharing", 19.59),
         ("commongen", "bartscore_score_top50", "no_fx", -13.99), ("commongen", "bartscore", "no_fx", -26.77))
STAND_INS = (("commongen", "bertscore_f1_score_top50", "no_fx"), ("commongen", "bertscore_f1", "no_fx"))


def relative_changes(df: pd.DataFrame) -> pd.DataFrame:
    """% change of every row vs ``full`` per (dataset, variant, metric), seeds averaged."""
    vals = gc.means(df, ["dataset", "variant", "setting"])
    out = [{"dataset": ds, "variant": v, "metric": m, "setting": s,
            "change_pct": gc.pct(x, vals.get((ds, v, "full", m)))}
           for (ds, v, s, m), x in vals.items() if s != "full" and m in METRICS]
    return pd.DataFrame(out)


def paper_comparison(rel: pd.DataFrame) -> pd.DataFrame:
    """The paper's quoted changes vs ours; a stand-in's value (digits, concepts) is "not comparable" (no delta)."""
    if rel.empty:
        return pd.DataFrame()
    present, entries = set(rel["dataset"]), []
    for ds, metric, setting, paper in PAPER + tuple((*s, math.nan) for s in STAND_INS):
        ours_ds = ds if ds in present else gc.ANALOG[ds]
        hit = rel[(rel["dataset"] == ours_ds) & (rel["metric"] == metric) & (rel["setting"] == setting)]
        where = gc.PAPER_NAMES[ds] + ("" if ours_ds == ds else f" (paper) · {ours_ds} (ours)")
        ours = float(hit["change_pct"].mean()) if len(hit) else math.nan
        note = "" if ours_ds == ds else f"{gc.NOT_COMPARABLE} ({ours_ds} stand-in vs {gc.PAPER_NAMES[ds]})"
        if ours_ds not in present or math.isnan(ours):
            note = f"not run: no {metric} rows on {ours_ds}"
        if math.isnan(paper):
            note = "BERTScore stand-in (no paper number)" + (f"; {note}" if note else "")
        entries.append({"what": f"{where}: {metric}, {LABELS[setting]} vs DAMCHA (%)", "paper": paper,
                        "ours": ours, "note": note, "source": (ours_ds, metric, setting)})
    return report.comparison_frame(entries)


BETTER = {"val_loss": "lower", "mse": "lower", "fid_top50": "lower", "nll": "lower", "bertscore_f1": "higher",
          "bartscore": "higher"}
PANELS = {"val_loss": "validation loss ↓", "mse": "held-out MSE ↓", "nll": "held-out NLL ↓",
          "fid_top50": "FID@Top-50 ↓", "bertscore_f1": "BERTScore F1 ↑"}
SECONDARY = ("fid_top50", "bertscore_f1")


def figure_metrics(preset: str) -> set[str]:
    """The delta figure's panels: the metrics the verdicts read at ``preset`` (held-out MSE and NLL at decide, the
    validation loss at smoke), with FID@Top-50 and BERTScore beside them."""
    return {resolve(ABLATION_IMAGE, preset), resolve(ABLATION_TEXT, preset), *SECONDARY}


def write_report(ctx, df: pd.DataFrame, env: dict, store=None) -> tuple[pd.DataFrame, list]:
    if df.empty:
        return pd.DataFrame(), []
    order = {s: i for i, s in enumerate(SETTINGS)}
    df = df.assign(row=df["setting"].map(LABELS), order=df["setting"].map(order))
    head = df[df["metric"].isin(METRICS + ("val_loss",))]
    wide = gc.flat_wide(head, ["order", "row", "variant"], ["dataset", "metric"]).sort_values("order")
    wide = wide.drop(columns="order").reset_index(drop=True)
    rel = relative_changes(df)
    comp = paper_comparison(rel)
    verdicts = frame_verdicts(NAME, ctx.preset_name, df, getattr(store, "path", None), getattr(store, "context_id", ""))
    deltas_md, deltas = gc.paired_section(df, BETTER, {"row": "DAMCHA"}, "DAMCHA", arm_cols=("row",))
    notes = [gc.seeds_line(df, ctx, "row"), *gc.image_text_notes(df, ctx), " ".join(TABLE4_ROWS.split()),
             "## Verdicts on the paper's claims (Table 4)", "", verdict_markdown(verdicts), *deltas_md,
             *gc.params_section(df, ("row",))]
    notes.append("## Table 4 (seed means)")
    best = {c: "max" if "score" in c else "min" for c in wide.columns if ": " in c}
    report.write_tables(ctx.out, NAME, df, wide, env, "Table 4: input adaptivity × sharing ablation",
                        "\n\n".join(notes), best=best, comparison=comp)
    shown = deltas[deltas["metric"].isin(figure_metrics(ctx.preset_name))].copy() if not deltas.empty else deltas
    if not shown.empty:
        shown["panel"] = shown["dataset"] + ": " + shown["metric"].map(PANELS)
        paper = {}
        for ds, metric, setting, value in PAPER:
            ours_ds = ds if ds in set(df["dataset"]) else gc.ANALOG[ds]
            if metric in PANELS:
                paper[(f"{ours_ds}: {PANELS[metric]}", LABELS[setting])] = value
        stand_in = not set(df["dataset"]) & {ds for ds, *_ in PAPER}
        plots.delta_plot(shown, "panel", ctx.out / f"{NAME}.png",
                         f"Table 4 ({ctx.preset_name}: {'/'.join(sorted(set(df['dataset'])))}; n = "
                         f"{int(deltas['n'].max())} seeds; {env.get('device_name')}): seed-paired change vs DAMCHA, "
                         + plots.interval_title(shown), "change vs DAMCHA (% of DAMCHA's value)", paper=paper,
                         paper_label="paper (CIFAR-10; a different task)" if stand_in else "paper",
                         reference="DAMCHA", note=report.setting_note(df, arms=("dataset", "row")))
    return comp, verdicts
