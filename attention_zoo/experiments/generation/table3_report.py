"""Table 3's report (render-only: a change here re-renders the section and leaves its store current): the paper
comparison, the temperature check of the block ablation, the seed-paired deltas vs full DAMCHA, the verdicts and
the figure of the verdicts' metric vs generator depth."""

from __future__ import annotations

import math

import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_markdown
from ...claims.ledger import ABLATION_IMAGE
from ...claims.spec import resolve
from ...claims.stats import t_interval
from . import tables_report as gc
from .ablations import INFERENCE, depth_of

NAME = "table3_depth_blocks"

PAPER = {"full FID@Top-50 at depth 9": 58.64, "full FID@Top-50 at depth 1": 77.97,
         "best diagonal-only FID@Top-50": 98.703}
AXIS = {"val_loss": "validation loss (masked-patch MSE, pixels in [−1, 1])",
        "mse": "held-out MSE (masked patches, pixels in [−1, 1])"}


def _get(df: pd.DataFrame, depth: int, inference: str, metric: str = "fid_top50") -> float:
    v = df[(df["depth"] == depth) & (df["inference"] == inference) & (df["metric"] == metric)]["value"]
    return float(v.mean()) if len(v) else math.nan


def paper_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's FID@Top-50 values (CIFAR-10) beside ours: on a stand-in "not comparable", a depth not run "not
    run"."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return pd.DataFrame()
    ds = "cifar10" if "cifar10" in set(ok["dataset"]) else ok["dataset"].iloc[0]
    ok = ok[ok["dataset"] == ds]
    depths = sorted(ok["depth"].unique())
    full = {k: _get(ok, k, "full") for k in depths}
    best_diag = min((_get(ok, k, "diag_only") for k in depths), default=math.nan)
    where = "CIFAR-10" + ("" if ds == "cifar10" else f" (paper) · {ds} (ours)")
    entries = []
    for (what, paper), ours, k in zip(PAPER.items(), (full.get(9, math.nan), full.get(1, math.nan), best_diag),
                                      (9, 1, None)):
        note = "" if ds == "cifar10" else f"{gc.NOT_COMPARABLE} ({ds} stand-in vs CIFAR-10)"
        if k is not None and k not in full:
            note = f"not run: depth {k} is not in this run (depths {', '.join(map(str, depths))})"
        entries.append({"what": f"{where}: {what}", "paper": paper, "ours": ours, "note": note})
    return report.comparison_frame(entries)


def temperature_rows(df: pd.DataFrame, metric: str = "val_loss") -> pd.DataFrame:
    """Per depth: each block-scaled inference against the temperature-scaled full metric it would equal if the H
    blocks of a block row were equal (docs/variants.md §7.4): gap = |row − scaled full| / |row − full|."""
    ok = df[df["status"] == "ok"]
    rows = []
    for k in sorted(ok["depth"].unique()):
        v = {i: _get(ok, k, i, metric) for i in INFERENCE}
        rows.append({"depth": int(k), **{f"{metric} {i}": v[i] for i in INFERENCE},
                     "gap diag-only vs full/H": abs(v["diag_only"] - v["full_over_H"]) / abs(v["diag_only"] - v["full"])
                     if v["diag_only"] != v["full"] else math.nan,
                     "gap off-diag-only vs full·(H−1)/H":
                     abs(v["off_diag_only"] - v["full_times_H1_over_H"]) / abs(v["off_diag_only"] - v["full"])
                     if v["off_diag_only"] != v["full"] else math.nan})
    return pd.DataFrame(rows)


BETTER = {"val_loss": "lower", "mse": "lower", "fid_top50": "lower"}


def _metric(df: pd.DataFrame, name: str) -> pd.DataFrame:
    return df[df["metric"] == name]


def write_report(ctx, df: pd.DataFrame, env: dict, store=None) -> tuple[pd.DataFrame, list]:
    if df.empty:
        return pd.DataFrame(), []
    df = df.assign(depth=df["setting"].map(depth_of)) if "depth" not in df else df
    comp = paper_comparison(df)
    verdicts = frame_verdicts(NAME, ctx.preset_name, df, getattr(store, "path", None), getattr(store, "context_id", ""))
    deltas_md, deltas = gc.paired_section(df, BETTER, {"inference": "full"}, "full DAMCHA (same depth and seed)",
                                          arm_cols=("inference",), columns=("depth", "metric"))
    temp = temperature_rows(df)
    H = ctx.preset.n_heads

    def by_depth(m: str) -> pd.DataFrame:
        wide = gc.flat_wide(_metric(df, m), ["dataset", "variant", "depth"], ["inference"])
        return wide[[c for c in ["dataset", "variant", "depth", *INFERENCE] if c in wide.columns]]  # one order

    notes = [gc.seeds_line(df, ctx, "depth and inference row"), *gc.image_text_notes(df, ctx),
             f"Generator depth k = k − 1 hidden layers of width {ctx.preset.depth_width} + the output layer. One "
             "model per depth and seed; the columns are inference-time block scales on it: full (1, 1), diag_only "
             f"(1, 0), off_diag_only (0, 1), full_over_H (1/H, 1/H), full_times_H1_over_H ((H−1)/H, (H−1)/H), H = {H}.",
             "## Verdicts on the paper's claims (Table 3)", "", verdict_markdown(verdicts), *deltas_md,
             "## What the block ablation can show under RowSum (docs/variants.md §7.4)",
             "Head i sees only m_i = Σ_j M_ij, so every block of a block row receives the same gradient and the blocks "
             "differ only by their initialisation. If they were equal, diagonal-only would be the full metric × 1/H "
             f"and off-diagonal-only the full metric × (H−1)/H = {(H - 1) / H:.3f}: temperature changes, not a loss "
             "or gain of cross-head information. The gap columns measure how far each row is from that scaled full "
             "metric, relative to its distance from the full one (validation loss, seed means): a gap well below 1 "
             "means the row behaves as a temperature change, so its ordering against the full metric says nothing "
             "about cross-head information; a gap near or above 1 means the blocks have diverged from equality.",
             report.markdown_table(temp, floatfmt=".4g"),
             *gc.params_section(df, ("variant", "depth")),
             "## Validation loss (seed means)", report.markdown_table(by_depth("val_loss")),
             "## MSE (seed means)", report.markdown_table(by_depth("mse")),
             "## FID@Top-50 (seed means; secondary: 50 of the scored images, see above)"]
    report.write_tables(ctx.out, NAME, df, by_depth("fid_top50"), env,
                        "Table 3: generator depth × block ablation", "\n\n".join(notes), comparison=comp)
    metric = resolve(ABLATION_IMAGE, ctx.preset_name)  # the verdicts' metric at this preset
    ok = _metric(df, metric)[lambda d: d["status"] == "ok"]
    if not ok.empty:
        band = [{"inference": i, "depth": int(k), **dict(zip(("mean", "low", "high"), t_interval(g["value"])))}
                for (i, k), g in ok.groupby(["inference", "depth"])]
        n = int(ok.groupby(["inference", "depth"])["seed"].nunique().min())
        plots.interval_plot(pd.DataFrame(band), "depth", "inference", ctx.out / f"{NAME}.png",
                            f"Table 3 ({ctx.preset_name}: {'/'.join(sorted(set(df['dataset'])))}; n = {n} seed"
                            f"{'s' if n > 1 else ''}; {env.get('device_name')}): {AXIS[metric].split(' (')[0]} vs "
                            "generator depth" + ("; mean and 95 % t interval over seeds" if n > 1
                                                 else "; one seed: no interval"),
                            AXIS[metric], "generator depth k (layers)", zero=False, integer_x=True,
                            note=report.setting_note(df, arms=("setting",)))
    return comp, verdicts
