"""The Slurm launcher (``--launcher submitit``; ``launchers`` picks it).

submitit: the units go out as one job array (``AutoExecutor.map_array``; ``--slurm-array-parallelism`` at once). A job
computes its unit and writes the rows as JSON with their SHA-256 into ``<out>/_cache/submitit/results/<unit>.json``
(atomically); the driver reads only that file — never a pickle — and verifies the hash. A job that fails or is lost is
resubmitted up to ``--slurm-retries`` times, then its cells are stored as ``error`` rows with the job's last log
lines. A preempted or timed-out Slurm job requeues itself (submitit's checkpointing: the unit is re-run, and the
experiments' own checkpoints make it resume). When the driver is killed the jobs run on; a rerun first collects
every unit whose result file is there and submits only the rest, so nothing is lost and no cell is stored twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from pathlib import Path

from ..io import atomic_write_text
from ..registry import _parse_value
from ..results import digest


# ---- submitit -------------------------------------------------------------------------------------------------------
def _rows_digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def read_result(path: Path):
    """A unit's rows from its result file, or None (missing, torn or failing its hash)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or "rows" not in rec or rec.get("sha256") != _rows_digest(rec["rows"]):
        return None
    return rec["rows"]


class UnitJob:
    """The job's callable: compute a unit, write its verified result file. On Slurm preemption or timeout submitit
    calls ``checkpoint`` and requeues the same call (the experiments' checkpoints make the unit resume)."""

    def __init__(self, work, init=None):
        self.work, self.init = work, init

    def __call__(self, unit: list[dict], path: str) -> str:
        if self.init is not None:  # e.g. the plan's thread count, as a local worker gets it
            self.init()
        rows = self.work(unit)
        if rows is None:
            raise RuntimeError("the unit was interrupted")
        atomic_write_text(path, json.dumps({"rows": rows, "sha256": _rows_digest(rows)}, default=str))
        return path

    def checkpoint(self, unit: list[dict], path: str):
        import submitit

        return submitit.helpers.DelayedSubmission(UnitJob(self.work, self.init), unit, path)


_POSITIVE = ("time", "timeout_min", "nodes", "array_parallelism")  # a job needs at least one of each


def _slurm_types() -> dict[str, tuple]:
    """{update_parameters key: accepted value types (empty: not checked)}: submitit's shared parameters and the
    Slurm executor's own (``slurm_<name>``, read from the signature of the function that writes the sbatch file)."""
    import inspect
    import typing

    from submitit import AutoExecutor
    from submitit.slurm import slurm

    def accepted(tp) -> tuple:
        args = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
        simple = tuple(a for a in args if a in (int, float, str, bool))
        if len(simple) != len(args):
            return ()  # lists, dicts: submitit checks them itself
        return simple + ((int,) if float in simple else ())

    generic = {k: accepted(t) for k, t in AutoExecutor._typed_parameters().items()}
    sig = inspect.signature(slurm._make_sbatch_string).parameters
    own = {f"slurm_{k}": accepted(sig[k].annotation) if k in sig else ()
           for k in slurm.SlurmExecutor._valid_parameters()}
    return {**generic, **{f"slurm_{k}": t for k, t in generic.items()}, **own}


def _extra(items: list[str]) -> dict:
    """``--slurm-extra KEY=VALUE ...`` as submitit parameters, every key one submitit's Slurm executor takes and
    every value of its type (a negative time or count is refused too), checked before anything is submitted.

    Raises:
        ValueError: a malformed item, an unknown key or a value of the wrong type (the message names the valid keys).
    """
    types = _slurm_types()
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"slurm-extra: expected KEY=VALUE, got {item!r}")
        if key not in types:
            raise ValueError(f"slurm-extra: unknown submitit parameter {key!r}; valid: {', '.join(sorted(types))}")
        v = _parse_value(value.strip())
        want = types[key]
        if want and (not isinstance(v, want) or (isinstance(v, bool) and bool not in want)):
            raise ValueError(f"slurm-extra: {key} expects {' or '.join(t.__name__ for t in want)}, got {value!r}")
        least = 1 if key.removeprefix("slurm_") in _POSITIVE else 0
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < least:
            raise ValueError(f"slurm-extra: {key} expects a number >= {least}, got {value!r}")
        out[key] = v
    return out


def _parameters(args, name: str) -> dict:
    """The submitit parameters of ``--slurm-*``, validated (argparse checks the numbers of the flags themselves; a
    caller building ``args`` by hand gets the same checks here).

    Raises:
        ValueError: a bad value (the message names its flag), or Slurm asked for where no ``sbatch`` is on PATH:
            submitit would silently run every job on this machine instead (``--submitit-cluster local`` asks for
            that explicitly).
    """
    for flag, minimum in (("slurm_time", 1), ("slurm_array_parallelism", 1), ("slurm_retries", 0)):
        v = getattr(args, flag)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{flag.replace('_', '-')}: expected an int >= {minimum}, got {v!r}")
    gpus, partition = args.slurm_gpus_per_task, args.slurm_partition
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise ValueError(f"slurm-gpus-per-task: expected an int >= 0, got {gpus!r}")
    if partition is not None and (not isinstance(partition, str) or not partition.strip() or " " in partition):
        raise ValueError(f"slurm-partition: expected a partition name, got {partition!r}")
    params = {"timeout_min": args.slurm_time, "name": name, "slurm_array_parallelism": args.slurm_array_parallelism}
    if partition:
        params["slurm_partition"] = partition
    if gpus is not None:
        params["slurm_gpus_per_task"] = gpus
    params.update(_extra(args.slurm_extra))
    if args.submitit_cluster in (None, "slurm") and shutil.which("sbatch") is None:
        raise ValueError("launcher: submitit found no Slurm here (no `sbatch` on PATH) and would run every job on "
                         "this machine; run on a Slurm login node, use --launcher local, or ask for submitit's local "
                         "executor with --submitit-cluster local")
    return params


class SubmititLauncher:
    def __init__(self, args, folder: Path, name: str):
        try:
            import submitit
        except ImportError:
            raise ValueError("launcher: submitit is not installed (pip install attention_zoo[cluster])") from None
        self.args, self.folder, self.name, self.submitit = args, Path(folder), name, submitit
        self.params = _parameters(args, name)  # every setting checked before anything is written or submitted
        self.results = self.folder / "results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.retries = args.slurm_retries

    def executor(self):
        ex = self.submitit.AutoExecutor(folder=self.folder / "jobs", cluster=self.args.submitit_cluster)
        ex.update_parameters(**self.params)
        return ex

    def path(self, unit, plan) -> Path:
        return self.results / f"{digest([plan.store.key(c) for c in unit])}.json"

    def run(self, units: list[list[dict]], plan):
        waiting = []
        for unit in units:  # collected from an earlier driver's jobs, never recomputed
            rows = read_result(self.path(unit, plan))
            if rows is not None:
                yield unit, rows, ""
            else:
                waiting.append(unit)
        if not waiting:
            return
        ex = self.executor()
        job = UnitJob(plan.work, plan.worker_init)
        jobs = ex.map_array(job, waiting, [str(self.path(u, plan)) for u in waiting])
        live = [(u, j, 0) for u, j in zip(waiting, jobs)]
        while live:
            time.sleep(0.2)
            still = []
            for unit, j, tries in live:
                if not j.done():
                    still.append((unit, j, tries))
                    continue
                rows = read_result(self.path(unit, plan))
                if rows is not None:
                    yield unit, rows, ""
                elif tries < self.retries:
                    still.append((unit, ex.submit(job, unit, str(self.path(unit, plan))), tries + 1))
                else:  # stored as error rows, and reported as a failure (the local launcher's exit code)
                    rows = _error_rows(_log_tail(j), tries + 1)
                    yield unit, [rows] * len(unit), rows[0]["message"]
            live = still


def _log_tail(job) -> str:
    try:
        text = job.stderr() or ""
    except Exception:  # noqa: BLE001 - the log may be gone with the node
        text = ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-2:])[-300:] or f"job {job.job_id} ended without a result ({job.state})"


def _error_rows(message: str, attempts: int) -> list[dict]:
    return [{"metric": "job", "value": math.nan, "unit": "", "status": "error",
             "message": f"failed {attempts} time(s): {message}"}]


class WholeRunJob:
    """A measuring script run whole as one cluster job (its timings need one machine): it writes its own store and
    leaves its exit code in a JSON file the driver reads."""

    def __init__(self, fn, args, path: str):
        self.fn, self.args, self.path = fn, args, path

    def __call__(self) -> None:
        code = self.fn(self.args)
        atomic_write_text(self.path, json.dumps({"exit_code": int(code)}))
