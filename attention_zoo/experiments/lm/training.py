"""Table 5's cell: the shared character-LM cell (``experiments.charlm``) with Table 5's budget fractions (a final
cell's test loss read at 1/8, 1/4, 1/2 and all of the step budget in the decide preset)."""

from __future__ import annotations

from ..charlm import (  # noqa: F401 - the names table5_gpt2 reads
    _evaluators,
    _peak,
    _reset_peak,
    _status_mib,
    budget_scores_at_best,
    build_model,
    cell_result_rows,
    run_dir_of,
)
from ..charlm import grouped_unit as _grouped_unit
from ..charlm import run_cell as _run_cell
from .presets import BUDGET_FRACS


def run_cell(cell: dict, preset, corpus, cfg, info, run_dir, final_eval_batches, fresh: bool = False):
    """``charlm.run_cell`` at the preset's budget fractions."""
    return _run_cell(cell, preset, corpus, cfg, info, run_dir, final_eval_batches, fresh,
                     BUDGET_FRACS.get(cell["preset"], ()))


def grouped_unit(unit: list[dict], preset, corpus, cfg, info, out, context, final_eval_batches, fresh: bool = False):
    """``charlm.grouped_unit`` at the preset's budget fractions."""
    return _grouped_unit(unit, preset, corpus, cfg, info, out, context, final_eval_batches, fresh,
                         BUDGET_FRACS.get(unit[0]["preset"], ()))
