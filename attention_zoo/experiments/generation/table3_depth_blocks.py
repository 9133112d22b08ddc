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
seeds at its best. Sized from the smoke store (≈ 45 ms per step of DAMCHA on digits): 3 depths × 26 runs (16
tuning, 10 final) × 1,000 steps ≈ 3,500 CPU-s + scoring (4 inference rows × 30 final cells) ≈ 1,300 ≈ 1.3
core-hours ≈ 0.7 h on 2 cores.
"""

from __future__ import annotations

import argparse
import functools

from ...registry import get_attention_spec
from ...variants.damcha import set_block_scales
from ..common import ListAction, base_parser, experiment_main, select_variants, setup_threads, variant_flavours
from . import shared as gc
from .ablations import block_scales, depth_of
from .data import IMAGE_SETS
from .decide import arm_of, run_decide
from .table3_report import NAME, write_report
from .training import train_and_score


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


def model_options(ctx, cell: dict) -> tuple[dict | None, bool]:
    """(attention options, share_mlp) of the cell's model: a generator of depth k (``train_cells_grouped``)."""
    return {"hidden_dims": (ctx.preset.depth_width,) * (depth_of(cell["setting"]) - 1)}, True


def cell_rows(ctx, cell: dict, trained: tuple | None = None) -> list[dict] | None:
    k, H = depth_of(cell["setting"]), ctx.preset.n_heads
    apply = {label: functools.partial(set_block_scales, diag_scale=d, off_diag_scale=o)
             for label, (d, o) in block_scales(H).items()}
    rows = train_and_score(ctx, cell, *model_options(ctx, cell), inference=apply, trained=trained)
    return None if rows is None else [{**r, "depth": k} for r in rows]


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
