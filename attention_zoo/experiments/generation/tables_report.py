"""What the generation tables' reports (Tables 1, 3, 4) share: seed-averaged wide tables, the paired-difference
section, parameter and compute rows, notes on sample sizes and scorers. Render-only: nothing here changes a stored
number."""

from __future__ import annotations

import math

import pandas as pd

from ... import report
from ...report import NOT_COMPARABLE  # noqa: F401 - re-exported: the tables' name for it
from .config import Context

ANALOG = {"cifar10": "digits", "cifar100": "digits", "wmt14": "concepts", "commongen": "concepts"}


def flat_wide(df: pd.DataFrame, index: list[str], columns: list[str]) -> pd.DataFrame:
    """Seed-averaged pivot over the observed column combinations only (all-NaN cells such as an unsupported
    BARTScore stay as NaN columns), headers joined by ": "."""
    if df.empty:
        return pd.DataFrame()
    wide = df.groupby(index + columns, dropna=False)["value"].mean().unstack(columns)
    wide.columns = [": ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in wide.columns]
    wide = wide.reset_index()
    return wide.dropna(how="all", subset=[c for c in wide.columns if c not in index]).reset_index(drop=True)


def means(df: pd.DataFrame, keys: list[str]) -> dict:
    """Seed-averaged values of ok rows, ``{(*keys, metric): value}``, preferring the damcha_repo flavour (what the
    paper ran) where a variant has both."""
    ok = df[df["status"] == "ok"].assign(rank=lambda d: d["flavor"] != "damcha_repo")
    m = ok.groupby([*keys, "flavor", "metric", "rank"], dropna=False)["value"].mean().reset_index()
    m = m.sort_values("rank", kind="stable").drop_duplicates([*keys, "metric"])
    return {(*(r[k] for k in keys), r["metric"]): r["value"] for _, r in m.iterrows()}


def pct(a: float | None, b: float | None) -> float:
    """Relative change of ``a`` vs ``b`` in % of |b| (NaN when either is missing)."""
    return 100.0 * (a - b) / abs(b) if a is not None and b is not None and b != 0 else math.nan


def comparison_text(comp: pd.DataFrame) -> str:
    """``report.format_comparison`` with each row's note appended."""
    text = report.format_comparison(comp)
    if comp.empty or "note" not in comp:
        return text
    lines = text.split("\n")
    return "\n".join([lines[0]] + [f"{ln}  {n}" if n else ln for ln, n in zip(lines[1:], comp["note"].fillna(""))])


def image_text_notes(df: pd.DataFrame, ctx: Context) -> list[str]:
    """Sample sizes, scorer availability and caveats shared by the tables' markdown."""
    n = df[df["metric"] == "n_eval"].groupby("dataset")["value"].max()
    notes = [f"Preset `{ctx.preset_name}`; scored samples per cell: "
             + ", ".join(f"{ds} {int(v)}" for ds, v in n.items())
             + f"; FID features: `{ctx.extractor}`. FID and FID@Top-50 (the 50 lowest-MSE pairs, the authors' "
             "rule) are small-sample statistics, not comparable with standard 50k-sample FID"
             + (" — the smoke preset scores few samples because real-Inception FID costs ≈0.17 s per image on an "
                "idle CPU." if ctx.preset_name == "smoke" else ".")]
    if ctx.preset.decoder_positions != "sinusoidal" and set(df["task"]) & {"text", "pixel"}:
        notes.append(f"Text/pixel decoders use {ctx.preset.decoder_positions} positions in this preset (the "
                     "Decoder's unit-amplitude sinusoids swamp its N(0, 0.02) token embeddings at smoke scale; see "
                     "`generation.Preset.decoder_positions`); the patch model keeps the authors' sinusoids.")
    bad = df[df["status"] != "ok"].drop_duplicates(["metric", "status", "message"])
    notes += [f"`{r.metric}`: {r.status} — {r.message}" for r in bad.itertuples() if not r.metric.endswith("top50")]
    return notes


# ---- report pieces shared by Tables 1, 3, 4 ---------------------------------------------------------------------
PAPER_NAMES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "wmt14": "WMT14", "commongen": "CommonGen",
               "digits": "digits", "concepts": "concepts"}


def seeds_line(df: pd.DataFrame, ctx: Context, arms: str = "arm") -> str:
    """"Preset …, n = … seeds per …": what every table below is a mean or a paired difference over."""
    n = df.groupby([c for c in ("dataset", "variant", "flavor", "setting") if c in df])["seed"].nunique()
    ns = sorted(set(int(v) for v in n)) if len(n) else [0]
    tasks = ", ".join(f"{ds} ({'stand-in for ' + ANALOG_OF.get(ds) if ds in ANALOG_OF else 'the paper task'})"
                      for ds in sorted(set(df["dataset"])))
    return (f"Preset `{ctx.preset_name}`; n = {'–'.join(map(str, ns))} seed{'s' if ns != [1] else ''} per {arms} in "
            f"every table below (means over seeds; intervals are 95 % Student-t for n ≥ 5, the range of the seeds "
            f"below); "
            f"datasets: {tasks}.")


ANALOG_OF = {"digits": "CIFAR-10/100", "concepts": "WMT14 and CommonGen"}


def paired_section(df: pd.DataFrame, metrics: dict[str, str], reference: dict, ref_name: str,
                   arm_cols: tuple[str, ...] = ("variant", "flavor"), columns: tuple[str, ...] = ("dataset", "metric")
                   ) -> tuple[list[str], pd.DataFrame]:
    """(markdown lines, long deltas): every arm's seed-paired change vs the reference in % of the reference, with
    its interval (95 % Student-t from five seeds, the range of the seeds below: the heading says which) and n, for
    ``metrics`` {metric: "lower"|"higher"}."""
    from ...claims.paired import delta_frame, delta_table

    sub = df[df["metric"].isin(list(metrics)) & (df["status"] == "ok")]
    deltas = delta_frame(sub, list(columns), reference, arm_cols)
    if deltas.empty:
        return [], deltas
    return [f"## Seed-paired change vs {ref_name} (% of {ref_name}; {report.interval_heading(deltas)}; ↓/↑: better "
            "direction)", "", report.markdown_table(delta_table(deltas, list(columns), metrics))], deltas


def params_section(df: pd.DataFrame, arm_cols: tuple[str, ...] = ("variant", "flavor")) -> list[str]:
    """Total and attention parameters and training GFLOPs (analytic) of every arm, per dataset."""
    cols = [c for c in ("params", "attention_params", "train_gflops") if c in df]
    if "params" not in cols:
        return []
    per = df.dropna(subset=["params"]).groupby([*arm_cols, "dataset"])[cols].mean().reset_index()
    for c in ("params", "attention_params"):
        if c in per:
            per[c] = per[c].map("{:,.0f}".format)
    if "train_gflops" in per:
        per["train_gflops"] = per["train_gflops"].map("{:.3g}".format)
    per = per.rename(columns={"params": "params (total)", "attention_params": "params (attention)",
                              "train_gflops": "training GFLOP (analytic, 3 × forward × steps)"})
    return ["## Parameters and training compute per arm", "", report.markdown_table(per)]
