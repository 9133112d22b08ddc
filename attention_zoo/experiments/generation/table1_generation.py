"""Table 1 (DAMCHA paper p. 6): decoder-only generation — the 7 methods × CIFAR-10, CIFAR-100, WMT, CommonGen.

Columns (docs/experiments.md §4): images MSE ↓, FID ↓, FID@Top-50 ↓ (+ feature distance); text NLL ↓, BARTScore ↑ and
BARTScore@Top-50 ↑ under both rules (``nll_top50``, ``score_top50``), with BERTScore F1 beside it. A cell is
(dataset, variant, flavour, seed): one training run (``training.train_and_score``); finished cells are skipped on
rerun and an interrupted one resumes from its checkpoint. Presets: ``smoke`` = digits (masked-patch task by default,
``--image-task pixel``) + the embedded concept-to-sentence task, 64 scored images / 64 scored sentences per variant
(real-Inception FID costs ≈0.17 s per image on an idle CPU); ``paper`` = CIFAR-10/100 + WMT14 en→de + CommonGen with
the compact repo config (see ``config.PRESETS``). Baselines run the published methods by default
(``--flavour damcha_repo``: what the paper ran, as ``reproduce/all.py --preset paper`` does; ``both``: the two).

``decide`` (``generation.decide``): digits + concepts to a validation plateau, every arm tuned, ten seeds at its
best; arms: the seven methods (the claims name MHA, MMA and "the best of the seven") and the controls ``mha_ctx``
and ``damcha_bm``. ``mha_pm`` is left out for the budget: its step costs 8–10× MHA's at this size (52–65 s per 150
steps in the smoke store), as much as three other arms. Sized from the smoke store's training times (150 steps,
2-core host): the nine arms take ≈ 0.33 s (digits) + 0.56 s (concepts) per step together; 26 runs per arm and
dataset (16 tuning, 10 final) × 600 steps (all.py passes ``--steps 600``) ≈ 13,900 CPU-s, plus scoring ≈ 2,500
≈ 4.6 core-hours ≈ 2.3 h on 2 cores with no early stop (the ceiling). The stand-ins learn at that length: MHA at
lr 4e-3, 600 steps, reached a validation MSE of 0.082 on digits against the training mean's 0.374 (−78 %) and a
validation NLL of 2.15 nats on concepts against the unigram's 3.14 (−31 %); its greedy sentences still repeat
words, so the learned-at-all gate keeps BERTScore out of the verdicts and the text claims rest on the NLL.
"""

from __future__ import annotations

import argparse

from ..common import FIVE_SEEDS, base_parser, experiment_main, select_variants, setup_threads, variant_flavours
from .config import Context
from .decide import arm_of, run_decide
from .shared import Clock, add_arguments, datasets_of, make_context, open_cell_store, run_cells
from .table1_report import NAME, write_report
from .training import train_and_score

DECIDE_ARMS = "mha,tha,dcmha,colmha,mma,moa,damcha,mha_ctx,damcha_bm"


def build_parser() -> argparse.ArgumentParser:
    p = add_arguments(base_parser(NAME, __doc__.split("\n")[0], presets=("smoke", "decide", "paper"),
                                  default_seeds={"smoke": [0], "decide": list(range(10)), "*": FIVE_SEEDS}))
    p.set_defaults(variants=None)  # every registered variant; the decide preset: DECIDE_ARMS
    return p


def model_options(ctx: Context, cell: dict) -> tuple[dict | None, bool]:
    """(attention options, share_mlp) of the cell's model (``train_cells_grouped`` builds it from them)."""
    return None, True


def cell_rows(ctx: Context, cell: dict, trained: tuple | None = None) -> list[dict] | None:
    """One cell: train (unless ``trained`` by a grouped unit) and score (None when interrupted)."""
    return train_and_score(ctx, cell, trained=trained)


def run(args) -> int:
    """Train and score every (dataset, variant, flavour, seed) cell; exit code 130 when interrupted (resumable)."""
    setup_threads(args.threads)
    clock, ctx = Clock(), make_context(args, NAME)
    store = open_cell_store(args, ctx, clock)  # validates --out before any work
    pairs = variant_flavours(select_variants(args.variants or (DECIDE_ARMS if args.preset == "decide" else "*")),
                             args.flavour)
    if args.preset == "decide":
        arms = [arm_of(ctx.cell(ds, v, f, "default", 0)) for ds in datasets_of(ctx, args.datasets) for v, f in pairs]
        return run_decide(args, __name__, ctx, store, arms, clock, write_report, NAME)
    cells = [ctx.cell(ds, v, f, "default", s) for ds in datasets_of(ctx, args.datasets) for v, f in pairs
             for s in args.seeds]

    return run_cells(args, __name__, ctx, store, cells, clock, write_report, NAME)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
