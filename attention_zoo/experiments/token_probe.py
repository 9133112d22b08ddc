"""The behaviour probe (``experiments.fingerprint``) of a token-sequence stand-in (MQAR, the masked LM): one cell per
arm (and setting) through the family's ``unit_rows`` — its data, its decoder, the training loop with a validation
after each of two optimizer steps, the final scores."""

from __future__ import annotations

import importlib
from pathlib import Path

from .fingerprint import Probe, distinct, probe_args

TRAIN = ["eval_every=1", "ckpt_every=1", "log_every=1", "warmup_steps=1", "patience=0"]


def arms(cells: list[dict]) -> list[dict]:
    """Each final arm at each setting (with its tuned setting) and one tuning cell per preset."""
    final, tune = [], {}
    for c in cells:
        arm = {k: v for k, v in c.items() if k not in ("seed", "max_steps")}
        if c.get("phase") == "tune":
            tune.setdefault(c["preset"], arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def unit_probe(module: str) -> Probe:
    """The probe of the experiment module ``module`` (its ``NAME``, ``unit_rows`` and parser)."""

    def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
        mod = importlib.import_module(module)
        args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2, train=TRAIN, fresh=True,
                          ensemble=False, arms=None, paper=None)
        return mod.unit_rows([{**arm, "seed": 0, "max_steps": 2}], args)[0]

    return Probe(arms, run)
