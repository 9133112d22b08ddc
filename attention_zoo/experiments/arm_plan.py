"""Planning the baselines' stand-ins (MQAR, the masked LM): the shared flags, which arms run, the matched controls'
widths, the cells of a tuned preset over settings, and the dry run's prior cost of cells no store has timed yet.

``--paper`` picks the arms one paper's claims read (each decide preset is then that paper's decide run: the same
store, the same cells, so MHA trained for one paper serves the others); ``--arms`` names arms by label. Neither is
part of a cell's identity. ``--ensemble`` trains one arm's cells of one phase and setting as one grouped model
(``engine.grouped``; the arms whose modules cannot be grouped fall back one cell at a time, and the rows say so).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace

from ..engine import TrainConfig, parse_overrides
from .arms import PAPERS, ArmSpec, arm_fields
from .common import ListAction, positive_int
from .ensemble_units import add_ensemble_argument
from .tuning import Tuning, tuned_cells

SELECTION = ("arms", "paper", "jobs", "ensemble")  # flags that pick cells or say how they run: not provenance


def preset_setup(args, presets: dict, tunings: dict) -> tuple:
    """(preset, TrainConfig, Tuning or None) of ``args.preset``: the preset's recipe with ``--train`` and ``--steps``
    over it (progress bars off), and its tuning grid on ``--seeds`` when they are given."""
    preset = presets[args.preset]
    overrides = {**preset.train, **parse_overrides(args.train), "progress": False}
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    tuning = tunings.get(args.preset)
    if tuning is not None and args.seeds is not None:
        tuning = replace(tuning, seeds=tuple(args.seeds))
    return preset, TrainConfig.from_dict(overrides), tuning


def add_arm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paper", choices=PAPERS, default=None,
                   help="run only the arms the claims of this paper read (default: every arm of the preset)")
    p.add_argument("--arms", action=ListAction, default=None, help="arm labels to run (default: the preset's)")
    p.add_argument("--steps", type=positive_int, default=None, help="override the preset's maximum optimizer steps")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="cells (or grouped units) trained at once, one process each (default: CPU cores up to 8)")
    add_ensemble_argument(p)


def select_arms(arms: tuple[ArmSpec, ...], args) -> list[ArmSpec]:
    """The preset's arms narrowed by ``--paper`` and ``--arms``, in the preset's order; an arm that another arm
    matches (``match``) comes along with it.

    Raises:
        ValueError: an unknown arm label, or a selection with no arm.
    """
    labels = {a.label for a in arms}
    named = list(getattr(args, "arms", None) or [])
    unknown = [a for a in named if a not in labels]
    if unknown:
        raise ValueError(f"arms: unknown {', '.join(unknown)}; this preset's arms: {', '.join(sorted(labels))}")
    keep = [a for a in arms if (not named or a.label in named)
            and (getattr(args, "paper", None) is None or args.paper in a.papers)]
    need = {a.match[1] for a in keep if a.match}
    keep += [a for a in arms if a.label in need and a not in keep]
    if not keep:
        raise ValueError(f"arms: the selection leaves no arm (paper {args.paper!r}, arms {named})")
    return [a for a in arms if a in keep]


def resolve_matches(arms: list[ArmSpec], solve: Callable[[ArmSpec, ArmSpec], int]) -> list[ArmSpec]:
    """Each matched control with its solved ``d_ff`` (``solve(control, target) -> d_ff``) in its ``model``."""
    by = {a.label: a for a in arms}
    return [replace(a, model={**a.model, "d_ff": solve(a, by[a.match[1]])}) if a.match else a for a in arms]


def setting_cells(base: dict, arms: list[ArmSpec], settings: list[dict], tune_at: dict | None,
                  tuning: Tuning | None, records: list[dict], seeds: Callable[[ArmSpec], tuple[int, ...]]
                  ) -> list[dict]:
    """Every cell of the run: one per (arm, setting, seed) without tuning; with ``tuning``, each arm's grid at
    ``tune_at`` (default: the first setting) and its choice at every setting (``tuning.tuned_cells``), the final
    cells of arms still tuning waiting (lr None). ``seeds(arm)``: an arm's final seeds."""
    cells = []
    for arm in arms:
        fields = {**base, **arm_fields(arm)}
        if tuning is None:
            cells += [{**fields, **s, "seed": seed} for s in settings for seed in seeds(arm)]
            continue
        at = tune_at if tune_at is not None else settings[0]
        got, waiting, _ = tuned_cells(replace(tuning, seeds=seeds(arm)), [{**fields, **at}], records,
                                      lambda _arm, fields=fields: [{**fields, **s} for s in settings])
        cells += got + waiting
    return cells


def prior_seconds(step_seconds: Callable[[dict], float | None], steps: Callable[[dict], int]
                  ) -> Callable[[dict], float | None]:
    """A dry run's price of a cell no finished cell of its kind has timed: seconds per step × expected steps."""
    def price(cell: dict) -> float | None:
        s = step_seconds(cell)
        return None if s is None else s * steps(cell)
    return price


def arm_label(cell: dict) -> str:
    setting = ", ".join(f"{k} {cell[k]}" for k in ("seq_len", "n_pairs") if k in cell)
    return f"{cell['arm']}" + (f" ({setting})" if setting else "")


def backbone_of(cell: dict) -> dict:
    return json.loads(cell.get("backbone") or "{}")


__all__ = ["SELECTION", "add_arm_arguments", "arm_label", "backbone_of", "prior_seconds", "resolve_matches",
           "select_arms", "setting_cells"]
