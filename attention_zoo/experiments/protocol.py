"""One protocol for every experiment: its cells, how a unit of cells is computed, and where the units run.

An experiment module exposes ``build_parser()`` and ``plan(args) -> Plan``: the result store (the driver is its only
writer), the pending cells grouped into work units (a unit is one cell, or the seeds of a grouped ensemble), a
picklable ``work(unit) -> rows per cell`` and ``finish() -> exit code`` (the report and the verdicts). ``execute``
runs a plan: it claims the cells (two drivers on one ``--out`` never compute the same cell), hands the units to a
launcher, stores each unit's rows as they arrive and releases what did not finish, so an interrupted run loses
nothing and a rerun computes only what is missing.

Launchers (``--launcher``): ``local`` (this process, or ``--workers`` processes) and ``submitit`` (Slurm through
submitit's ``AutoExecutor``, one job per unit in a job array, ``launchers.py``). The registry ``EXPERIMENTS`` lists
every experiment in the order ``reproduce/all.py`` runs them (Appendix E reads Table 1's per-sample files).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..cli import non_negative_int, positive_int
from ..results import ResultStore
from ..workers import terminate_as_interrupt


@dataclass(frozen=True)
class Experiment:
    """A reproduce script: ``name`` (its store, results folder and ``reproduce/<name>.py``), the ``family``
    package that holds its ``module`` (default: ``name``), what it reproduces and its presets; ``units``: "cells"
    when ``plan`` fans cells out (the launcher applies), "run" when the script measures on one machine as a whole
    (timings; a cluster launch runs the whole script as one job)."""

    name: str
    family: str
    title: str
    presets: tuple[str, ...] = ("smoke", "paper")
    units: str = "cells"
    module: str = ""

    @property
    def module_path(self) -> str:
        return f"{__package__}.{self.family}.{self.module or self.name}"

    def load(self):
        return importlib.import_module(self.module_path)


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("table2_efficiency", "efficiency", "Table 2: efficiency", units="run"),
    Experiment("table7_complexity", "efficiency", "Table 7: complexity and measured scaling", units="run"),
    Experiment("synthetic", "synthetic", "Figures 12–13: synthetic sweeps", presets=("smoke", "decide", "paper"),
               module="sweep"),
    Experiment("table5_gpt2", "lm", "Table 5: character-level GPT-2 pretraining", presets=("smoke", "decide", "paper")),
    Experiment("table1_generation", "generation", "Table 1: decoder-only generation",
               presets=("smoke", "decide", "paper")),
    Experiment("appendix_e_kde", "generation", "Appendix E: KDEs of per-sample scores", units="run"),
    Experiment("table3_depth_blocks", "generation", "Table 3: generator depth × block ablation",
               presets=("smoke", "decide", "paper")),
    Experiment("table4_ablation", "generation", "Table 4: input adaptivity × sharing ablation",
               presets=("smoke", "decide", "paper")),
    Experiment("table6_vit", "vision", "Table 6: ViT classification", presets=("smoke", "decide", "cifar10", "paper")),
    Experiment("appendix_fgh", "generation", "Appendices F–H: DAMCHA's metric"),
    Experiment("rowsum_analysis", "efficiency", "DAMCHA under RowSum", units="run"),
    Experiment("mqar", "mqar", "MQAR: associative recall for every arm (the baselines' claims)",
               presets=("smoke", "decide")),
    Experiment("masked_lm", "mlm", "Masked character LM: the baselines' masked-LM claims and sweeps",
               presets=("smoke", "decide")),
    Experiment("scaling", "scaling", "The scale axis: compute multipliers on a char-LM ladder",
               presets=("smoke", "decide"), module="ladder"),
)}


@dataclass
class Plan:
    """What ``execute`` needs: the store, the work units, how to compute one, and how to report."""

    store: ResultStore
    units: list[list[dict]]
    work: Callable[[list[dict]], list[list[dict]] | None]  # None: interrupted (resumable)
    finish: Callable[[], int]
    workers: int = 1
    worker_init: Callable[[], None] | None = None
    describe: Callable[[list[dict]], str] = field(default=lambda unit: f"{len(unit)} cell(s)")
    # the dry run's price of a cell no stored cell of its kind prices: (cell, store records) -> seconds or None
    price: Callable[[dict, list[dict]], float | None] | None = None
    # the dry run's price (seconds) of a cell that no finished cell of its kind or variant has timed: an experiment's
    # calibrated seconds per step × its expected steps (None: no prior; the analytic step floor applies)
    prior: Callable[[dict], float | None] | None = None


def add_launcher_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--launcher`` and the submitit options, shared by every experiment."""
    g = p.add_argument_group("launcher (docs/cluster.md)")
    g.add_argument("--launcher", choices=("local", "submitit"), default="local",
                   help="local: this machine; submitit: Slurm through submitit's AutoExecutor, one job per unit of "
                        "cells (needs `pip install attention_zoo[cluster]`)")
    g.add_argument("--slurm-partition", default=None, help="Slurm partition")
    g.add_argument("--slurm-gpus-per-task", type=non_negative_int, default=None, help="GPUs per job")
    g.add_argument("--slurm-time", type=positive_int, default=60, help="minutes per job")
    g.add_argument("--slurm-array-parallelism", type=positive_int, default=64,
                   help="jobs of the array running at once")
    g.add_argument("--slurm-extra", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more submitit parameters (e.g. slurm_mem_gb=32 slurm_constraint=a100; checked against "
                        "what submitit's Slurm executor accepts)")
    g.add_argument("--slurm-retries", type=non_negative_int, default=2,
                   help="resubmissions of a failed or preempted job")
    g.add_argument("--submitit-cluster", choices=("slurm", "local", "debug"), default=None,
                   help="submitit's executor: slurm (the default; refused where no `sbatch` is on PATH), or local / "
                        "debug to run the jobs on this machine (testing)")
    return p


# Options that only say where the work runs: never part of a cell's provenance.
LAUNCH_OPTIONS = ("launcher", "slurm_partition", "slurm_gpus_per_task", "slurm_time", "slurm_array_parallelism",
                  "slurm_extra", "slurm_retries", "submitit_cluster")


def execute(plan: Plan, args: argparse.Namespace, name: str,
            more: Callable[[], list[list[dict]]] | None = None) -> int:
    """Run the plan's pending units on the chosen launcher, store their rows, then ``plan.finish()``.

    ``more`` (a staged run, ``tuning.execute_stages``): called after a unit is stored while no unit waits to start;
    it returns the units that have become plannable (the arms whose tuning was just stored), to run with
    ``plan.work``. Their cells not done, not in flight and claimable join the run, so a worker that would idle
    until the stage ends takes them up. Launchers without ``refills`` (submitit) ignore it.

    Returns the exit code: 130 when interrupted (the finished units are stored; rerun to continue), 1 when a unit
    failed for good (recorded as ``error`` rows by the cluster launcher, or left for a rerun locally: the same code
    on either launcher), else ``finish``'s."""
    from .launchers import launcher_for

    if getattr(args, "dry_run", False):  # the plan, printed (experiment_main made this call read-only)
        from .dryrun import show_plan

        return show_plan(plan, args, name)
    store = plan.store
    launcher = launcher_for(args, plan, name)  # its settings are checked before any cell is claimed
    todo = [[c for c in unit if store.claim(c)] for unit in plan.units]
    todo = [u for u in todo if u]
    n_cells = sum(len(u) for u in plan.units)
    bar = tqdm(total=n_cells, initial=n_cells - sum(len(u) for u in todo), desc=name,
               disable=getattr(args, "quiet", False), unit="cell")
    failed, interrupted = [], False
    busy = {store.key(c) for u in todo for c in u}  # claimed by this run and not stored yet

    def more_units() -> list[list[dict]]:
        new = [[c for c in unit if store.key(c) not in busy and store.claim(c)] for unit in more()]
        new = [u for u in new if u]
        busy.update(store.key(c) for u in new for c in u)
        todo.extend(new)
        bar.total += sum(len(u) for u in new)
        bar.refresh()
        return new

    refill = {"more": more_units} if more is not None and getattr(launcher, "refills", False) else {}
    try:
        with terminate_as_interrupt():  # `kill PID` of a background run stops it as a Ctrl-C does
            for unit, rows, err in launcher.run(todo, plan, **refill):
                busy.difference_update(store.key(c) for c in unit)
                if rows is None:
                    for c in unit:
                        store.release(c)
                    if err == "interrupted":
                        interrupted = True
                    else:
                        failed.append(f"{plan.describe(unit)}: {err}")
                else:
                    for cell, r in zip(unit, rows):
                        store.add(cell, r)
                    if err:  # stored as error rows (a cluster job that failed for good): a failure all the same
                        failed.append(f"{plan.describe(unit)}: {err}")
                bar.update(len(unit))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for unit in todo:  # claims of units not finished go back
            for c in unit:
                store.release(c)
        bar.close()
    for f in failed:
        print(f"{name}: failed {f}", file=sys.stderr)
    if interrupted:
        print(f"{name}: interrupted; finished cells are stored in {store.path}, rerun to continue", file=sys.stderr)
        return 130
    store.refresh()
    code = plan.finish()
    return max(code, int(bool(failed)))


def default_workers(device_type: str, requested: int | None) -> int:
    cpus = os.cpu_count() or 1
    return requested or (min(cpus, 8) if device_type == "cpu" else 1)


__all__ = ["EXPERIMENTS", "LAUNCH_OPTIONS", "Experiment", "Plan", "add_launcher_arguments", "default_workers",
           "execute"]
