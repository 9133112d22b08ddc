"""The generation tables' decide preset (Tables 1, 3, 4): the smoke tasks trained to a validation plateau, every arm
tuned on one grid (``experiments.tuning``), then ten seeds at its own best.

Tuning and early stopping read the first half of the validation split (``val_loss``); the scored metrics (MSE, FID,
NLL, BERTScore) read the second half, which nothing selects on (``DataOptions.scored_holdout``). Tuning cells store
the validation loss only. The report is the table's own, on the final seeds at each arm's tuned setting, followed by
the grid (each arm's validation loss at every point, its choice, edge flags) and the calibration rows (the arm's
``val_loss`` against the task's trivial predictor, ``trivial_val_loss``).
"""

from __future__ import annotations

from dataclasses import replace

from ...io import atomic_write_text
from ..protocol import default_workers
from ..tuning import Tuning, calibration_lines, execute_stages, report_lines, tuned_cells
from .config import Context
from .shared import Clock, cell_plan, frame_and_env
from .tables_report import comparison_text

# lr 1e-3..4e-3 at a constant lr (lower than under the earlier cosine decay, whose grid 1e-3..8e-3 had 12 of Table
# 1's 18 arms at its top), extended past an edge up to two steps (8e-3, 16e-3 or 5e-4, 2.5e-4); weight decay 0 (the
# authors') and 0.1, a two-value axis. Seeds 1000-1001 score the grid; five final seeds also run at each arm's
# runner-up setting (the verdicts' robustness column).
TUNING = Tuning(lrs=(1e-3, 2e-3, 4e-3), weight_decays=(0.0, 0.1), tune_seeds=(1000, 1001), seeds=tuple(range(10)),
                extend=2, runner_up_seeds=(0, 1, 2, 3, 4))


def arm_of(cell: dict) -> dict:
    """A cell's arm for ``tuning.tuned_cells``: the cell without its seed."""
    return {k: v for k, v in cell.items() if k != "seed"}


def run_decide(args, module: str, ctx: Context, store, arms: list[dict], clock: Clock, write_report,
               name: str) -> int:
    """Run a table's decide preset in stages (the grid, then each arm's final seeds) and write its report."""
    from ...claims import verdict_lines

    tuning = replace(TUNING, seeds=tuple(args.seeds))

    def finish() -> int:
        df, env = frame_and_env(store, ctx, clock)
        final = df[df["phase"] == "tuned"].copy() if "phase" in df else df.iloc[:0]
        comp, verdicts = write_report(ctx, final, env, store=store)
        lines = report_lines(tuning, store.records(), lambda c: f"{c['dataset']}: {c['variant']}/{c['flavor']} "
                                                                f"({c['setting']})")
        lines += calibration_lines(final, "val_loss", "trivial_val_loss", True, "the task's trivial predictor: the "
                                   "training mean / a unigram", by=("dataset", "variant", "flavor", "setting"))
        md = ctx.out / f"{name}.md"
        if md.is_file():
            atomic_write_text(md, md.read_text() + "\n" + "\n".join(lines) + "\n")
        print(comparison_text(comp))
        print("\n".join(verdict_lines(verdicts)))
        print("\n".join(lines))
        print(clock.line(name))
        return 0

    def plan_of():
        cells, waiting, _ = tuned_cells(tuning, arms, store.records())
        todo = cells + (waiting if args.dry_run else [])  # a dry run prices the waiting cells; a run waits
        workers = default_workers(ctx.device.type, getattr(args, "jobs", None))
        return cell_plan(args, module, ctx, store, todo, finish, workers), len(waiting)

    return execute_stages(plan_of, args, name)


__all__ = ["TUNING", "arm_of", "run_decide"]
