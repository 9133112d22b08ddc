"""Behaviour probe of Table 5 (``experiments.fingerprint``): one cell per arm through ``table5_gpt2.cell_rows`` — the
corpus, the decoder, the training loop with an evaluation after each of two optimizer steps, the final evaluation
on one batch per split."""

from __future__ import annotations

from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args

TUNED = ("phase", "lr", "weight_decay")
TRAIN = ["eval_every=1", "ckpt_every=1", "log_every=1", "warmup_steps=1", "eval_max_batches=1"]


def arms(cells: list[dict]) -> list[dict]:
    """Each final arm (with its tuned setting) and one tuning cell per preset and data set."""
    final, tune = [], {}
    for c in cells:
        arm = {k: v for k, v in c.items() if k not in ("seed", "max_steps", "eval_batches")}
        if c.get("phase") == "tune":
            tune.setdefault((c["preset"], c["dataset"]), arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import table5_gpt2 as mod

    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, max_steps=2, eval_batches=1, train=TRAIN,
                      fresh=True, keep_checkpoints=False, datasets=arm["dataset"])
    return mod.cell_rows([{**arm, "seed": 0, "max_steps": 2, "eval_batches": 1}], args)[0]


PROBES = {"table5_gpt2": Probe(arms, run)}
