"""Behaviour probe of MQAR (``experiments.fingerprint``): one cell per arm and rung through ``mqar.unit_rows`` — the
generator, the decoder, the training loop with a validation after each of two optimizer steps, the final scores."""

from __future__ import annotations

from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args

TRAIN = ["eval_every=1", "ckpt_every=1", "log_every=1", "warmup_steps=1", "patience=0"]


def arms(cells: list[dict]) -> list[dict]:
    """Each final arm at each rung (with its tuned setting) and one tuning cell per preset."""
    final, tune = [], {}
    for c in cells:
        arm = {k: v for k, v in c.items() if k not in ("seed", "max_steps")}
        if c.get("phase") == "tune":
            tune.setdefault(c["preset"], arm)
        else:
            final.append(arm)
    return distinct(final + list(tune.values()))


def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import mqar as mod

    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2, train=TRAIN, fresh=True,
                      ensemble=False, arms=None, paper=None)
    return mod.unit_rows([{**arm, "seed": 0, "max_steps": 2}], args)[0]


PROBES = {"mqar": Probe(arms, run)}
