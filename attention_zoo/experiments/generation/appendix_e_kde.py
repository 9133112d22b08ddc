"""Appendix E (DAMCHA paper Figs. 6–7, p. 21): distributions of per-sample generation scores per dataset.

Reads Table 1's per-sample files (``<table1-dir>/per_sample/``, listed by its result store) — no retraining; it is
an error to run this before Table 1. One figure per dataset: a Gaussian KDE (seaborn ``kdeplot``, one curve per
variant/flavour, seeds pooled, each curve normalised on its own) of every per-sample score Table 1 saved: MSE and
Inception-feature distance for images, NLL, BERTScore F1 and (if it was available) BARTScore for text. The paper's
claim is qualitative [Q]: DAMCHA's mass shifts to good scores, with fewer low-score outliers and tighter KDEs. The
tables quantify it per variant: median, IQR, and the tail fraction — the share of a variant's samples beyond the
pooled 90th percentile of all variants on the bad side (above it for MSE/feature distance/NLL, below the pooled
10th percentile for BERTScore/BARTScore).
"""

from __future__ import annotations

import argparse
from fnmatch import fnmatch
from pathlib import Path

import pandas as pd

from ... import plots, report
from ...checks import MissingInputError
from ...envinfo import environment_record
from ...io import atomic_savefig
from ...metrics.topk import read_per_sample
from ...results import ensure_out_dir, read_records
from ..common import ListAction, base_parser, experiment_main, select_variants, variant_flavours
from ..launchers import run_whole
from ..protocol import add_launcher_arguments
from .table1_generation import NAME as TABLE1
from .tables_report import flat_wide

NAME = "appendix_e_kde"
SCORES = {"mse": "lower", "feature_distance": "lower", "nll": "lower", "bertscore_f1": "higher",
          "bartscore": "higher"}  # per-sample score -> which side is better
STATS = ("median", "iqr", "tail_fraction")
SCORE_UNITS = {"mse": "pixel MSE", "feature_distance": "Inception feature L2", "nll": "nats/token",
               "bertscore_f1": "F1, no baseline rescaling", "bartscore": "log-likelihood, nats/token"}  # axis units too
# Each score's range: the densities stay inside it (no KDE mass outside what the metric can take).
BOUNDS = {"mse": (0.0, None), "feature_distance": (0.0, None), "nll": (0.0, None), "bertscore_f1": (0.0, 1.0),
          "bartscore": (None, 0.0)}


def build_parser() -> argparse.ArgumentParser:
    p = base_parser(NAME, __doc__.split("\n")[0])
    p.set_defaults(seeds=None)
    p.add_argument("--table1-dir", type=Path, default=Path("results") / TABLE1,
                   help="Table 1's --out directory (its result store and per_sample/ files)")
    p.add_argument("--datasets", action=ListAction, join=True, default=None,
                   help="datasets (default: all Table 1 scored)")
    p.epilog = "--seeds filters Table 1's seeds (default: all, pooled); --device and --threads are not used."
    return add_launcher_arguments(p)


def load_samples(table1_dir: Path, preset: str, variants: str, flavour: str, seeds, datasets) -> pd.DataFrame:
    """Per-sample rows of Table 1's finished cells (the newest record per dataset/variant/flavour/seed).

    Raises:
        MissingInputError: Table 1 has not been run into ``table1_dir`` (or not with this preset), or a per-sample
            file it lists is missing.
    """
    path = Path(table1_dir) / f"{TABLE1}.jsonl"
    if not path.is_file():
        raise MissingInputError(f"table1-dir: {path} does not exist; run `python reproduce/{TABLE1}.py "
                                f"--preset {preset} --out {table1_dir}` first (App. E reads its per-sample scores)")
    latest = {}
    for rec in read_records(path):  # an input: read without a lock file; in file order, the newest record wins
        c = rec["cell"]
        files = {r.get("per_sample") for r in rec["rows"]} - {None}
        if c["preset"] == preset and files and (seeds is None or c["seed"] in seeds):
            latest[(c["dataset"], c["variant"], c["flavor"], c["seed"])] = files
    frames = []
    pairs = set(variant_flavours(sorted({k[1] for k in latest}), flavour)) if latest else set()
    patterns = [p.strip() for p in variants.split(",") if p.strip()]
    for (ds, v, f, _), files in latest.items():
        if (v, f) not in pairs or (datasets and ds not in datasets) or not any(fnmatch(v, p) for p in patterns):
            continue
        for rel in sorted(files):
            if not (table1_dir / rel).is_file():
                raise MissingInputError(f"table1-dir: {table1_dir / rel} is listed by {path} but missing; "
                                        "rerun Table 1 after deleting its store")
            frames.append(read_per_sample(table1_dir / rel).assign(label=f"{v}/{f}"))
    if not frames:
        raise MissingInputError(f"table1-dir: {path} has no finished {preset!r} cells matching the filters")
    return pd.concat(frames, ignore_index=True)


def score_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Long rows (dataset, variant, flavor, metric = "<score>:<stat>", value) of the distribution statistics."""
    rows = []
    for ds, g in df.groupby("dataset"):
        for score, better in SCORES.items():
            if score not in g or g[score].isna().all():
                continue
            pooled = g[score].dropna()
            cut = pooled.quantile(0.9 if better == "lower" else 0.1)
            for (v, f), s in g.dropna(subset=[score]).groupby(["variant", "flavor"])[score]:
                q25, q75 = s.quantile([0.25, 0.75])
                tail = float((s > cut).mean() if better == "lower" else (s < cut).mean())
                stats = {"mean": s.mean(), "median": s.median(), "iqr": q75 - q25, "std": s.std(),
                         "tail_fraction": tail, "n": len(s)}
                units = {"n": "samples", "tail_fraction": "fraction"}
                rows += [{"dataset": ds, "variant": v, "flavor": f, "score": score, "stat": k, "value": float(x),
                          "unit": units.get(k, SCORE_UNITS[score]), "metric": f"{score}:{k}", "better": better,
                          "status": "ok"} for k, x in stats.items()]
    return pd.DataFrame(rows)


@plots.themed
def kde_figure(df: pd.DataFrame, dataset: str, path: Path, preset: str = "") -> Path:
    """One panel per score: a KDE per variant/flavour (its fixed colour, damcha_repo dashed), seeds pooled, n per
    curve in the legend; each density stays inside its score's range (BOUNDS) while the axis follows the data.
    One legend, outside the data."""
    plt, _ = plots._plt()
    scores = [s for s in SCORES if s in df and df[s].notna().any()]
    fig, axes = plt.subplots(1, len(scores), figsize=(4.2 * len(scores) + 2.4, 3.6), squeeze=False)
    for ax, s in zip(axes[0], scores):
        plots.kde_plot(ax, df.dropna(subset=[s]).sort_values("label", kind="stable"), s, "label",
                       bounds=BOUNDS[s], counts=True)
        ax.set_title(f"{s} ({SCORES[s]} is better)", fontsize=9)
        ax.set_xlabel(f"{s} ({SCORE_UNITS[s]})")
        ax.set_ylabel("density (each curve integrates to 1)")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    plots.legend_outside(axes[0][-1], *axes[0][0].get_legend_handles_labels())
    per = df.groupby("label").size()
    n = f"n = {per.iloc[0]} samples per curve" if per.nunique() == 1 else f"n = {per.min()}–{per.max()} per curve"
    seeds = df["seed"].nunique() if "seed" in df else None
    fig.suptitle(f"App. E: per-sample score densities ({dataset}{f', {preset} preset' if preset else ''}; {n}"
                 f"{f', {seeds} seeds pooled' if seeds else ''})", fontsize=10)
    out = atomic_savefig(fig, path, dpi=120)
    return out


def check(args) -> None:
    """The arguments a run checks before any work (also by a dry run): an unknown variant is an error, not an empty
    selection."""
    select_variants(args.variants)


def run(args) -> int:
    check(args)
    ensure_out_dir(args.out)  # before any work
    datasets = [d.strip() for d in args.datasets.split(",")] if args.datasets else None
    samples = load_samples(Path(args.table1_dir), args.preset, args.variants, args.flavour, args.seeds, datasets)
    out = Path(args.out)
    stats = score_stats(samples)
    pngs = [kde_figure(g, ds, out / f"{NAME}_{ds}.png", args.preset) for ds, g in samples.groupby("dataset")]
    wide = flat_wide(stats[stats["stat"].isin(STATS)], ["dataset", "variant", "flavor"], ["score", "stat"])
    env = environment_record("cpu", preset=args.preset, table1_dir=str(args.table1_dir),
                             figures=[p.name for p in pngs])
    notes = [__doc__.split("\n\n")[1].replace("\n", " "), f"Source: `{args.table1_dir}` (preset `{args.preset}`). "
             "No paper numbers: App. E is qualitative, so there is no paper | ours | delta.",
             "Figures: " + ", ".join(f"`{p.name}`" for p in pngs)]
    report.write_tables(out, NAME, stats, wide, env,
                        "Appendix E: distributions of per-sample scores", "\n\n".join(notes))
    print("(no paper numbers for App. E: the claim is qualitative — see the tail fractions and IQRs below)")
    for (ds, score), g in stats[stats["stat"] == "tail_fraction"].groupby(["dataset", "score"]):
        ranked = g.sort_values("value")
        print(f"{ds:>10} {score:<18} tail fraction, best first: "
              + ", ".join(f"{r.variant}/{r.flavor} {r.value:.2f}" for r in ranked.itertuples()))
    print(f"{NAME}: {len(pngs)} figure(s) and tables in {out}")
    return 0


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run_whole(build_parser().parse_args(argv), NAME, run, check)  # one machine: a cluster job runs it whole
