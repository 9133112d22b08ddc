"""Behaviour probes of the generation tables (Tables 1, 3, 4 and Appendices F–H; ``experiments.fingerprint``): one
cell per arm through the table's own ``cell_rows`` — its data, model, training loop and scoring — at two optimizer
steps with an evaluation after each, scoring four samples."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args
from .shared import TINY_EXTRACTOR, make_context

ARM = ("preset", "dataset", "variant", "flavor", "setting")
TUNED = ("phase", "lr", "weight_decay")
TRAIN = ["eval_every=1", "ckpt_every=1", "log_every=1", "warmup_steps=1"]  # every path of the loop within 2 steps


def table_arms(cells: list[dict]) -> list[dict]:
    """Each final arm (with its tuned setting), and one tuning cell per preset and data set: the grid's cells differ
    from it only in their setting."""
    final, tune = [], {}
    for c in cells:
        arm = {k: c[k] for k in ARM} | {k: c[k] for k in TUNED if k in c}
        if c.get("phase") == "tune":
            tune.setdefault((c["preset"], c["dataset"]), arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def table_run(arm: dict, options: dict, tmp: Path, module: str) -> list[dict] | None:
    mod = importlib.import_module(module)
    # FID on the 16-d test extractor: the same scoring code; Inception's 2048-d statistics take a minute per cell
    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2, eval_samples=4, train=TRAIN, fresh=True,
                      keep_checkpoints=False, fid_extractor=TINY_EXTRACTOR)
    ctx = make_context(args, mod.NAME)
    cell = ctx.cell(arm["dataset"], arm["variant"], arm["flavor"], arm["setting"], 0)
    return mod.cell_rows(ctx, {**cell, **{k: arm[k] for k in TUNED if k in arm}})


def fgh_arms(cells: list[dict]) -> list[dict]:
    return distinct({"preset": c["preset"], "model": c["model"]} for c in cells)


def fgh_run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import appendix_fgh as mod

    # seeds [1]: the probe's seed-0 cell is not the run's first seed, so it draws no figure
    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2, seeds=[1])
    s, snaps, _ = mod.settings_of(args)
    return mod.cell_rows([{"model": arm["model"], "preset": arm["preset"], "seed": 0, "snapshots": snaps}], args)[0]


def _table(name: str) -> Probe:
    return Probe(table_arms, functools.partial(table_run, module=f"{__package__}.{name}"))


PROBES = {"table1_generation": _table("table1_generation"), "table3_depth_blocks": _table("table3_depth_blocks"),
          "table4_ablation": _table("table4_ablation"), "appendix_fgh": Probe(fgh_arms, fgh_run)}
