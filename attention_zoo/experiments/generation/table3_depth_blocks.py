"""Table 3 (DAMCHA paper p. 8): metric-generator depth × inference-time block ablation, CIFAR-10 FID@Top-50.

Rows: generator depth k = the number of generator layers: k − 1 hidden layers of a fixed width
(``Preset.depth_width``: 256 paper, 128 smoke), then the output layer; k = 1 is a single ``Linear(D → D²)``. This
is the most likely reading of the paper's "layer" (repo run names ``mlp_shared_depth{k}``; Section 5.1 uses a
9-layer generator) [U]. One model is trained per depth and scored four times with inference-time block scales
(docs/variants.md §7.5; no retraining): Full (1, 1), Diagonal-only (1, 0), Off-diagonal-only (0, 1), Full/H
(1/H, 1/H) and Full·(H−1)/H. The last two check the derived property of docs/variants.md §7.4: under RowSum the H
blocks of a block row get identical gradients, so once training dominates the initialisation diagonal-only ≈ the
full metric scaled by 1/H and off-diagonal-only ≈ the full metric scaled by (H−1)/H (softmax temperature changes).
Rows are scored by their held-out validation loss (``val_loss``), seed-paired against full DAMCHA at the same
depth; FID@Top-50 stays as a secondary column. Quoted [Q]: full 58.64 at depth 9 and 77.97 at depth 1; the best
diagonal-only, 98.703, is worse than the weakest full; off-diagonal-only is worse than both. Block scales act on
the generated metric only, as in the DAMCHA authors' code; a static M0 (``use_mlp=False``) takes none.

Smoke: digits (patch task), depths {1, 2, 3} (``--depths``), five seeds, 64 scored images per inference row.
Decide (``generation.decide``): the same depths to a validation plateau, each depth tuned as an arm of its own, ten
seeds at its best. Sized from the smoke store (≈ 45 ms per step of DAMCHA on digits): 3 depths × 22 runs × 1,000
steps ≈ 3,000 CPU-s + scoring (4 inference rows × 30 final cells) ≈ 1,300 ≈ 1.2 core-hours ≈ 0.6 h on 2 cores.
"""

from __future__ import annotations

import argparse
import functools
import math

import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_markdown
from ...claims.stats import t_interval
from ...registry import get_attention_spec
from ...variants.damcha import set_block_scales
from ..common import ListAction, base_parser, experiment_main, select_variants, setup_threads, variant_flavours
from . import shared as gc
from .data import IMAGE_SETS
from .decide import arm_of, run_decide
from .training import train_and_score

NAME = "table3_depth_blocks"
INFERENCE = ("full", "diag_only", "off_diag_only", "full_over_H", "full_times_H1_over_H")
PAPER = {"full FID@Top-50 at depth 9": 58.64, "full FID@Top-50 at depth 1": 77.97,
         "best diagonal-only FID@Top-50": 98.703}


def block_scales(n_heads: int) -> dict[str, tuple[float, float]]:
    off = (n_heads - 1) / n_heads
    return dict(zip(INFERENCE, ((1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (1.0 / n_heads, 1.0 / n_heads), (off, off))))


def check_variant(name: str) -> str:
    """Raises ValueError unless the variant has a depth-configurable generator with block scales."""
    opts = get_attention_spec(name).options
    if not {"hidden_dims", "diag_scale", "off_diag_scale"} <= set(opts):
        raise ValueError(f"variants: {name!r} has no metric generator with block scales (needs the hidden_dims, "
                         "diag_scale and off_diag_scale options)")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = gc.add_arguments(base_parser(NAME, __doc__.split("\n")[0], presets=("smoke", "decide", "paper"),
                                     default_seeds={"decide": list(range(10)), "*": [0, 1, 2, 3, 4]}))
    p.set_defaults(variants="damcha", flavour="paper")
    p.add_argument("--depths", action=ListAction, join=True, default=None,
                   help="generator depths (default: 1..9 paper, 1,2,3 smoke)")
    return p


def depth_of(setting: str) -> int:
    return int(setting.removeprefix("depth"))


def cell_rows(ctx, cell: dict) -> list[dict] | None:
    k, H = depth_of(cell["setting"]), ctx.preset.n_heads
    apply = {label: functools.partial(set_block_scales, diag_scale=d, off_diag_scale=o)
             for label, (d, o) in block_scales(H).items()}
    rows = train_and_score(ctx, cell, {"hidden_dims": (ctx.preset.depth_width,) * (k - 1)}, inference=apply)
    return None if rows is None else [{**r, "depth": k} for r in rows]


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
    ok = _metric(df, "val_loss")[lambda d: d["status"] == "ok"]
    if not ok.empty:
        band = [{"inference": i, "depth": int(k), **dict(zip(("mean", "low", "high"), t_interval(g["value"])))}
                for (i, k), g in ok.groupby(["inference", "depth"])]
        n = int(ok.groupby(["inference", "depth"])["seed"].nunique().min())
        plots.interval_plot(pd.DataFrame(band), "depth", "inference", ctx.out / f"{NAME}.png",
                            f"Table 3 ({ctx.preset_name}: {'/'.join(sorted(set(df['dataset'])))}; n = {n} seed"
                            f"{'s' if n > 1 else ''}; {env.get('device_name')}): validation loss vs generator depth"
                            + ("; mean and 95 % interval" if n > 1 else "; one seed: no interval"),
                            "validation loss (masked-patch MSE, pixels in [−1, 1])", "generator depth k (layers)",
                            zero=False, integer_x=True)
    return comp, verdicts


def run(args) -> int:
    """Train one model per (dataset, variant, depth, seed) and score it under the four block scalings."""
    setup_threads(args.threads)
    clock, ctx = gc.Clock(), gc.make_context(args, NAME)
    store = gc.open_cell_store(args, ctx, clock)  # validates --out before any work
    variants = [check_variant(v) for v in select_variants(args.variants)]
    depths = [int(d) for d in args.depths.split(",")] if args.depths else list(ctx.preset.depths)
    if any(d < 1 for d in depths):
        raise ValueError(f"depths: expected positive generator depths, got {depths}")
    datasets = gc.datasets_of(ctx, args.datasets, ctx.preset.image_datasets[:1], IMAGE_SETS)
    if args.preset == "decide":
        arms = [arm_of(ctx.cell(ds, v, f, f"depth{k}", 0)) for ds in datasets
                for v, f in variant_flavours(variants, args.flavour) for k in depths]
        return run_decide(args, __name__, ctx, store, arms, clock, write_report, NAME)
    cells = [ctx.cell(ds, v, f, f"depth{k}", s) for ds in datasets for v, f in variant_flavours(variants, args.flavour)
             for k in depths for s in args.seeds]

    return gc.run_cells(args, __name__, ctx, store, cells, clock, write_report, NAME)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
