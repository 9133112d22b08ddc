"""Table 4 (DAMCHA paper p. 8): input adaptivity × sharing ablation of DAMCHA on CIFAR-10 and CommonGen.

Rows (docs/experiments.md §4): DAMCHA (``full``: one input-dependent generator shared by the stack), w/o sharing
(``no_sharing``: ``share_mlp=False``, one generator per layer on its own input), w/o f(x) (``no_fx``:
``use_mlp=False``, one learnable static D×D metric M0 shared by the stack, identity init), w/o both
(``no_both``: static and unshared, one M0 per layer). Columns: CIFAR-10 MSE, FID, FID@Top-50; CommonGen NLL,
BARTScore, BARTScore@Top-50 (both rules), with BERTScore F1 beside them. Quoted [Q]: CIFAR-10 FID@Top-50
+17.59 % with both removed and +19.59 % with sharing removed; CommonGen without input adaptivity: BARTScore@Top-50
−13.99 %, mean BARTScore −26.77 %. Relative change = (row − full) / |full| (negative = lower score).

Rows: ``ablations.SETTINGS``; what each is and how it is scored: ``ablations.TABLE4_ROWS``.

Smoke: digits (patch task) + the embedded concept task; BARTScore needs a local facebook/bart-base (else NaN).
Decide (``generation.decide``): the same tasks to a validation plateau, each row tuned as an arm of its own, ten
seeds at its best. Sized from the smoke store (per step, digits + concepts: full 61 + 79, no_sharing 98 + 117,
no_fx 35 + 49, no_both 36 + 50 ms): 26 runs (16 tuning, 10 final) × 1,000 steps ≈ 13,600 CPU-s + scoring ≈
1,200 ≈ 4.1 core-hours ≈ 2.1 h on 2 cores with no early stop (the ceiling; early stopping ended the 3-point grid's
run in ≈ 1.5 h).
"""

from __future__ import annotations

import argparse

from ...registry import get_attention_spec
from ..common import ListAction, base_parser, experiment_main, select_variants, setup_threads, variant_flavours
from . import shared as gc
from .ablations import SETTINGS
from .decide import arm_of, run_decide
from .table4_report import NAME, write_report
from .training import train_and_score


def check_variant(name: str) -> str:
    """Raises ValueError unless the variant has a static-metric switch (``use_mlp``) and generator options."""
    if not {"use_mlp", "hidden_dims"} <= set(get_attention_spec(name).options):
        raise ValueError(f"variants: {name!r} has no metric generator to ablate (needs use_mlp and hidden_dims)")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = gc.add_arguments(base_parser(NAME, __doc__.split("\n")[0], presets=("smoke", "decide", "paper"),
                                     default_seeds={"decide": list(range(10)), "*": [0, 1, 2, 3, 4]}))
    p.set_defaults(variants="damcha", flavour="paper")
    p.add_argument("--settings", action=ListAction, join=True, default=",".join(SETTINGS),
                   help=f"subset of {', '.join(SETTINGS)}")
    return p


def model_options(ctx, cell: dict) -> tuple[dict | None, bool]:
    """(attention options, share_mlp) of the cell's setting (``train_cells_grouped`` builds its model)."""
    return SETTINGS[cell["setting"]]


def cell_rows(ctx, cell: dict, trained: tuple | None = None) -> list[dict] | None:
    return train_and_score(ctx, cell, *SETTINGS[cell["setting"]], trained=trained)


def run(args) -> int:
    """Train and score every (dataset, variant, setting, seed) cell."""
    setup_threads(args.threads)
    clock, ctx = gc.Clock(), gc.make_context(args, NAME)
    store = gc.open_cell_store(args, ctx, clock)  # validates --out before any work
    variants = [check_variant(v) for v in select_variants(args.variants)]
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or set(settings) - set(SETTINGS):
        raise ValueError(f"settings: expected a subset of {', '.join(SETTINGS)}, got {args.settings!r}")
    p = ctx.preset
    datasets = gc.datasets_of(ctx, args.datasets, (p.image_datasets[0], p.text_datasets[-1]))
    if args.preset == "decide":
        arms = [arm_of(ctx.cell(ds, v, f, s, 0)) for ds in datasets for v, f in variant_flavours(variants, args.flavour)
                for s in SETTINGS if s in settings]
        return run_decide(args, __name__, ctx, store, arms, clock, write_report, NAME)
    cells = [ctx.cell(ds, v, f, s, seed) for ds in datasets for v, f in variant_flavours(variants, args.flavour)
             for seed in args.seeds for s in SETTINGS if s in settings]

    return gc.run_cells(args, __name__, ctx, store, cells, clock, write_report, NAME)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
