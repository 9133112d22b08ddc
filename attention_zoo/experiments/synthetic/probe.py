"""Behaviour probe of the synthetic sweeps (``experiments.fingerprint``): one group per arm through
``sweep.group_rows`` — the task's data, the grouped model, two optimizer steps with a validation score after each,
the test metrics — at one setting of each task (the others only change the generator's λ or dₑ)."""

from __future__ import annotations

from pathlib import Path

from ..fingerprint import Probe, distinct, probe_args

ARM = ("task", "variant", "flavor", "attention_options")


def arms(cells: list[dict]) -> list[dict]:
    """Each (task, arm) once — final arms with their tuned setting, and one tuning cell per task — at the first
    setting the store holds for it."""
    final, tune = {}, {}
    for c in cells:
        arm = {"preset": c["config"].split("/", 1)[0], **{k: c[k] for k in ("task", "lam", "d_e", *ARM[1:])}}
        if "phase" in c:
            arm.update(phase=c["phase"], lr=c["lr"], weight_decay=c["weight_decay"])
        if c.get("phase") == "tune":
            tune.setdefault(c["task"], arm)
        else:
            final.setdefault(tuple(arm[k] for k in (*ARM, "phase", "lr", "weight_decay") if k in arm), arm)
    return distinct([*final.values(), *tune.values()])


def run(arm: dict, options: dict, tmp: Path) -> list[dict] | None:
    from . import sweep as mod

    args = probe_args(mod, arm["preset"], options, tmp / mod.NAME, steps=2)
    preset = mod.resolve_preset(args)
    cell = {"experiment": mod.NAME, "config": mod.config_tag(arm["preset"], preset), "seed": 0,
            **{k: v for k, v in arm.items() if k != "preset"}}
    return mod.group_rows([cell], preset, "cpu", None, ensemble=True)[0]


PROBES = {"synthetic": Probe(arms, run)}
