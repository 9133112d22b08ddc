"""Behaviour probe of the scale ladder (``experiments.fingerprint``): one cell per arm and rung through
``ladder.cell_rows`` — the corpus, the decoder at the rung's shape, the training loop with an evaluation after each of
two optimizer steps, the final evaluation on one batch per split, the compute rows."""

from __future__ import annotations

from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args


def arms(cells: list[dict]) -> list[dict]:
    """Each final arm at its rung (with its tuned setting) and one tuning cell per preset and rung."""
    final, tune = [], {}
    for c in cells:
        arm = {k: v for k, v in c.items() if k not in ("seed",)}
        if c.get("phase") == "tune":
            tune.setdefault((c["preset"], c["d_model"], c["n_layers"]), arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import ladder as mod

    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, fresh=True, keep_checkpoints=False,
                      ensemble=False)
    cell = {**arm, "seed": 0, "max_steps": 2, "eval_batches": 1}
    return mod.cell_rows([cell], args)[0]


PROBES = {"scaling": Probe(arms, run)}
