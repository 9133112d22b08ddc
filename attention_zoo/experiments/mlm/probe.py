"""Behaviour probe of the masked LM (``experiments.fingerprint``): one cell per arm through ``masked_lm.unit_rows``:
the corpus and its masks, the bidirectional model, the training loop with a validation after each of two optimizer
steps, the final scores."""

from __future__ import annotations

from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args

TRAIN = ["eval_every=1", "ckpt_every=1", "log_every=1", "warmup_steps=1", "patience=0"]


def arms(cells: list[dict]) -> list[dict]:
    """Each final arm (with its tuned setting) and one tuning cell per preset."""
    final, tune = [], {}
    for c in cells:
        arm = {k: v for k, v in c.items() if k not in ("seed", "max_steps")}
        if c.get("phase") == "tune":
            tune.setdefault(c["preset"], arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import masked_lm as mod

    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2, train=TRAIN, fresh=True,
                      ensemble=False, arms=None, paper=None)
    return mod.unit_rows([{**arm, "seed": 0, "max_steps": 2}], args)[0]


PROBES = {"masked_lm": Probe(arms, run)}
