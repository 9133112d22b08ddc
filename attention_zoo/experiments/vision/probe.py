"""Behaviour probe of Table 6 (``experiments.fingerprint``): one cell per arm through ``table6_vit.cell_rows`` — the
image set, the ViT, the training loop with an evaluation after each of two optimizer steps, top-1/top-5 on one
batch."""

from __future__ import annotations

from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args

TRAIN = ["eval_every=1", "ckpt_every=1", "log_every=1", "warmup_steps=1", "eval_max_batches=1"]


def arms(cells: list[dict]) -> list[dict]:
    """Each final arm (with its tuned setting) and one tuning cell per preset."""
    final, tune = [], {}
    for c in cells:
        arm = {k: v for k, v in c.items() if k not in ("seed", "max_steps", "eval_batches")}
        if c.get("phase") == "tune":
            tune.setdefault(c["preset"], arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import table6_vit as mod

    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2, eval_batches=1, train=TRAIN, fresh=True,
                      keep_checkpoints=False)
    return mod.cell_rows([{**arm, "seed": 0, "max_steps": 2, "eval_batches": 1}], args)[0]


PROBES = {"table6_vit": Probe(arms, run)}
