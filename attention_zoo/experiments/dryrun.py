"""``--dry-run``: the plan of a run, printed instead of run. ``entry.experiment_main`` runs a script's ``main`` under
``io.read_only`` (no folder is created, no store locked, repaired or written); the protocol's ``execute`` then prints
the plan (``show_plan``) instead of launching it, and ``launchers.run_whole`` does the same for the scripts that
measure as a whole (``show_whole``).

A plan lists the cells to run and the finished ones a run would skip (read from the store), the data they need and
an estimate of the cost: per pending cell, the median training time of finished cells of the same kind (the same
cell but for its seed; rows carry ``train_cpu_s`` or ``train_time_s``), else the experiment's own price
(``Plan.price``: the scale ladder's per-step timings of the arm and rung, or its calibration), else of the same
variant scaled by the steps (as measured where the cells record no steps: the synthetic sweeps), else the
experiment's calibrated prior (``Plan.prior``: its measured CPU seconds per step × the cell's expected steps), else,
for an arm never run yet, the median over the other arms (on the same data and task) of that same-variant price,
else the analytic step floor of docs/paper_scale.md (15 ms per optimizer step on a GPU, 5 ms for the synthetic
models) times the cell's steps. A paper preset about to train on a CPU gets a warning.

A dry run checks every argument as the run does (the launcher's settings while parsing, a whole-run script's own
checks through ``run_whole(..., check)``), and downloads, extracts and writes nothing: data that is not on disk ends
the plan with a line naming it and what a run would do (``show_missing_data``, exit 0)."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from ..data.fetch import DatasetNotFoundError
from ..envinfo import resolve_device
from ..io import read_jsonl

TIMINGS = ("train_cpu_s", "train_time_s")  # CPU seconds where a row has them, else wall seconds
STEP_FLOOR_S = {"synthetic": 0.005, "*": 0.015}  # docs/paper_scale.md: assumed seconds per optimizer step (GPU)
SHOWN = 40  # cells listed per section; the rest are counted


def show_missing_data(name: str, exc: DatasetNotFoundError) -> int:
    """The plan of a dry run that reached data not on disk (``data.fetch.DataNotReady``: a run would download or
    extract it; or a ``DatasetNotFoundError`` under ``--no-download``: a run would stop there). Every argument was
    checked before; the cells are not listed, since their number and steps depend on the data."""
    what = getattr(exc, "action", None)
    lines = [f"{name}: dry run: the data is not on disk, so the plan stops there (nothing downloaded or written)",
             f"data missing: {' '.join(str(exc).split())}",
             "a run " + ("would do that first, then train" if what else "would stop there with that error")
             + "; once the data is there, --dry-run lists the cells and their cost"]
    print("\n".join(lines))
    return 0


def _seconds(rec: dict) -> float | None:
    """The training time a finished cell's rows record (a column or a metric row), CPU seconds first."""
    for key in TIMINGS:
        for row in rec.get("rows") or []:
            value = row.get("value") if row.get("metric") == key else row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
                return float(value)
    return None


def _kind(cell: dict) -> str:
    return json.dumps({k: v for k, v in cell.items() if k != "seed"}, sort_keys=True, default=str)


def _task(cell: dict) -> tuple:
    return cell.get("dataset"), cell.get("task")


def _steps(cell: dict, default: int | None = None) -> int | None:
    steps = cell.get("steps", cell.get("max_steps")) or default
    return steps if isinstance(steps, int) and steps > 0 else None


def estimate(cells: list[dict], records: list[dict], name: str, steps: int | None = None, price=None,
             prior=None) -> tuple[float, dict[str, int]]:
    """Seconds for ``cells`` and how many cells each source priced (same kind, the experiment's ``price(cell,
    records)``, same variant, its calibrated ``prior(cell)``, the other arms, analytic, none); ``steps``: the run's
    ``--steps`` for cells that do not record theirs."""
    by_kind, by_variant, by_task = {}, {}, {}
    for rec in records:
        s = _seconds(rec)
        if s is not None:
            by_kind.setdefault(_kind(rec["cell"]), []).append(s)
            by_variant.setdefault(rec["cell"].get("variant"), []).append((s, _steps(rec["cell"])))
            by_task.setdefault(_task(rec["cell"]), {}).setdefault(rec["cell"].get("variant"), []).append(
                (s, _steps(rec["cell"])))
    floor = STEP_FLOOR_S.get(name, STEP_FLOOR_S["*"])
    total, sources = 0.0, {"same kind": 0, "priced": 0, "same variant": 0, "calibrated": 0, "other arms": 0,
                           "analytic": 0, "unknown": 0}

    def scaled(timed: list[tuple[float, int | None]], n_steps: int | None) -> list[float]:
        if not n_steps:  # cells that record no steps (the synthetic sweeps: the preset's): as measured
            return [s for s, n in timed if not n]
        return [s * n_steps / n for s, n in timed if n]

    for c in cells:
        own = price(c, records) if price is not None and _kind(c) not in by_kind else None
        same, n_steps = by_kind.get(_kind(c)), _steps(c, steps)
        mine = scaled(by_variant.get(c.get("variant"), []), n_steps)
        others = [statistics.median(x) for v, timed in by_task.get(_task(c), {}).items() if v != c.get("variant")
                  if (x := scaled(timed, n_steps))] if not mine else []
        if same:
            total += statistics.median(same)
            sources["same kind"] += 1
        elif own is not None:
            total += own
            sources["priced"] += 1
        elif mine:
            total += statistics.median(mine)
            sources["same variant"] += 1
        elif prior is not None and (priced := prior(c)) is not None:
            total += priced
            sources["calibrated"] += 1
        elif others:  # an arm never run yet: the median arm's price of the same task and steps
            total += statistics.median(others)
            sources["other arms"] += 1
        elif n_steps:
            total += n_steps * floor
            sources["analytic"] += 1
        else:
            sources["unknown"] += 1
    return total, sources


def _cell_line(cell: dict) -> str:
    keys = ("dataset", "task", "arm", "variant", "flavor", "setting", "lam", "d_e", "seq_len", "n_pairs", "model",
            "d_model", "n_layers", "phase", "lr", "weight_decay", "seed")
    return " ".join(f"{k}={cell[k]}" for k in keys if k in cell)


def _section(title: str, cells: list[dict]) -> list[str]:
    lines = [f"{title}: {len(cells)}"] + [f"  {_cell_line(c)}" for c in cells[:SHOWN]]
    return lines + ([f"  … and {len(cells) - SHOWN} more"] if len(cells) > SHOWN else [])


def _data_line(args, cells: list[dict]) -> str:
    """The data sets the cells name, where they are looked for, and the other folders the script reads."""
    sets = sorted({str(c["dataset"]) for c in cells if c.get("dataset")})
    root = getattr(args, "data_dir", None) or os.environ.get("ATTENTION_ZOO_DATA")
    where = f"under {root}" if root else "embedded, or in the loaders' default folder"
    reads = [f"--{k.replace('_', '-')} {v}" for k, v in sorted(vars(args).items())
             if k.endswith("_dir") and k != "data_dir" and v is not None]
    return f"data: {', '.join(sets) or 'none named by the cells'} ({where})" + (
        f"; reads {', '.join(reads)}" if reads else "")


def _cpu_warning(args) -> list[str]:
    if getattr(args, "preset", None) != "paper" or resolve_device(getattr(args, "device", "auto")).type != "cpu":
        return []
    return ["warning: the paper preset would train on a CPU; docs/paper_scale.md sizes it in GPU-hours"]


def show_plan(plan, args, name: str) -> int:
    """Print what ``execute(plan, args, name)`` would run and skip, the data and the cost; run nothing."""
    store = plan.store
    cells = [c for unit in plan.units for c in unit]
    done = [c for c in cells if store.is_done(c)]
    todo = [c for c in cells if not store.is_done(c)]
    steps = getattr(args, "steps", None) or getattr(args, "max_steps", None)
    seconds, sources = estimate(todo, store.records(every_context=True), name, steps, getattr(plan, "price", None),
                                getattr(plan, "prior", None))
    priced = ", ".join(f"{n} {k}" for k, n in sources.items() if n)
    unknown = (f"; {sources['unknown']} cell(s) without an estimate: no finished cell of their kind and no step "
               f"count (docs/paper_scale.md sizes the paper presets)" if sources["unknown"] else "")
    lines = [f"{name}: dry run (preset {getattr(args, 'preset', '?')}); store {store.path}"
             f"{'' if store.path.exists() else ' (not written yet)'}",
             *_section("would run", todo), *_section("would skip (finished)", done), _data_line(args, cells),
             f"estimate: {seconds:.0f} s of training for {len(todo)} cell(s) ({priced or 'nothing to run'}; "
             f"{sum(any(c in todo for c in u) for u in plan.units)} unit(s), up to {plan.workers} at a time)"
             + (f"; {seconds / 3600:.2f} CPU-h, ≈ {seconds / 3600 / plan.workers:.2f} h on {plan.workers} workers"
                if seconds >= 3600 else "")
             + unknown,
             *_cpu_warning(args)]
    print("\n".join(lines))
    return 0


def show_whole(args, name: str) -> int:
    """The plan of a script that measures as a whole (timings, figures): its store and the last run's cost."""
    out = Path(args.out)
    path = out / f"{name}.jsonl"
    records = [r for r in (read_jsonl(path) if path.is_file() else []) if r.get("kind") == "cell"]
    record = out.parent / "run_all.json"
    try:
        last = json.loads(record.read_text()).get("scripts", {}).get(name, {})
    except (OSError, ValueError, AttributeError):
        last = {}
    cost = (f"the last run took {last['cpu_s']:.0f} s CPU, {last['wall_s']:.0f} s wall ({record})"
            if "cpu_s" in last else "no recorded run to estimate from (see docs/paper_scale.md)")
    lines = [f"{name}: dry run (preset {getattr(args, 'preset', '?')}); measures as a whole on this machine",
             f"store {path}: {len(records)} stored cell(s); cells measured with the same settings on the same kind of "
             f"machine are reused", _data_line(args, [r["cell"] for r in records]), f"estimate: {cost}",
             *_cpu_warning(args)]
    print("\n".join(lines))
    return 0


__all__ = ["estimate", "show_plan", "show_whole"]
