"""Seed ensembles in the decide presets (Tables 1, 3, 4, 5, 6): which cells train as one grouped model.

With ``--ensemble`` (or a preset listed in its table's ``ENSEMBLE`` set), a work unit is one arm's cells of one
phase (``ensemble_units``): the tuning grid points × tuning seeds of an arm, or its final seeds, trained together by
``engine.grouped.train_grouped`` (each member gets what ``engine.loop.train`` gives it alone, to float rounding).
An arm whose model cannot be grouped (a parameter without a seed axis, a random forward such as dropout) or a unit of
one cell falls back to one cell at a time, and every row of an ``--ensemble`` run says which path ran: ``ensemble``
(the members trained together, 1 for one at a time) and ``ensemble_reason`` (why 1). The flag is not part of a
cell's identity: grouped and separate runs compute the same numbers, so a store keeps its cells either way.
"""

from __future__ import annotations

import argparse
import hashlib
import json

from .tuning import arm_id

ENSEMBLE_HELP = ("decide presets: train the cells of one arm and phase (its tuning grid x tuning seeds, or its final "
                 "seeds) as one grouped model (engine.grouped: the same numbers as one at a time, to float rounding; "
                 "arms that cannot be grouped fall back per arm and their rows say why); --no-ensemble: one cell at "
                 "a time. Default: the preset's (ENSEMBLE in the table's module); not part of a cell's identity")


def add_ensemble_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ensemble", action=argparse.BooleanOptionalAction, default=None, help=ENSEMBLE_HELP)


def ensemble_on(args, defaults: frozenset[str] | set[str]) -> bool:
    """``--ensemble``/``--no-ensemble`` if given, else whether the preset is in the table's ``ENSEMBLE`` set."""
    flag = getattr(args, "ensemble", None)
    return bool(flag) if flag is not None else args.preset in defaults


def ensemble_units(cells: list[dict]) -> list[list[dict]]:
    """The cells grouped by (arm, phase), in first-appearance order: one unit per arm's tuning grid and one per its
    final seeds (a preset without phases: one unit per arm)."""
    units: dict[tuple[str, str], list[dict]] = {}
    for c in cells:
        units.setdefault((arm_id(c), str(c.get("phase"))), []).append(c)
    return list(units.values())


def unit_tag(unit: list[dict]) -> str:
    """A short, stable name for a unit's group directory."""
    return hashlib.sha1(json.dumps(unit, sort_keys=True, default=str).encode()).hexdigest()[:10]


def ensemble_columns(size: int, reason: str = "") -> dict:
    """The columns every row of an ``--ensemble`` run carries."""
    return {"ensemble": size, "ensemble_reason": reason if size <= 1 else ""}


__all__ = ["ENSEMBLE_HELP", "add_ensemble_argument", "ensemble_columns", "ensemble_on", "ensemble_units", "unit_tag"]
