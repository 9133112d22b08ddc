"""Where the units of a plan run: this machine (``local``) or a Slurm cluster through submitit (``submitit``).

Both yield ``(unit, rows per cell or None, error)`` as units finish; the driver (``protocol.execute``) stores them.

submitit: the units go out as one job array (``AutoExecutor.map_array``; ``--slurm-array-parallelism`` at once). A job
computes its unit and writes the rows as JSON with their SHA-256 into ``<out>/_cache/submitit/results/<unit>.json``
(atomically); the driver reads only that file — never a pickle — and verifies the hash. A job that fails or is lost is
resubmitted up to ``--slurm-retries`` times, then its cells are stored as ``error`` rows with the job's last log
lines. A preempted or timed-out Slurm job requeues itself (submitit's checkpointing: the unit is re-run, and the
experiments' own checkpoints make it resume). When the driver is killed the jobs run on; a rerun first collects
every unit whose result file is there and submits only the rest, so nothing is lost and no cell is stored twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

from ..io import atomic_write_text
from ..registry import _parse_value
from ..results import digest
from ..workers import die_with_parent


def launcher_for(args, plan, name: str):
    if getattr(args, "launcher", "local") == "submitit":
        return SubmititLauncher(args, plan.store.out_dir / "_cache" / "submitit", name)
    return LocalLauncher()


# ---- local ----------------------------------------------------------------------------------------------------------
_STOPPED = False  # in a pool worker: a Ctrl-C arrived, so units not started yet come back "interrupted" at once
_IN_UNIT = False  # in a pool worker: computing a unit (a Ctrl-C there ends the unit, as in a plain process)


def _worker_sigint(signum, frame) -> None:
    """A pool worker's SIGINT handler. Between units it only marks the worker stopped: an exception there would kill
    the worker and break the pool. Inside a unit it raises once, as Python's default handler would; while the engine
    trains it has its own handler (checkpoint at the step boundary, the unit returns None)."""
    global _STOPPED
    first = not _STOPPED
    _STOPPED = True
    if _IN_UNIT and first:
        raise KeyboardInterrupt


def _init_worker(parent: int, init, forked: bool = False) -> None:
    die_with_parent(parent)  # a killed driver leaves no worker behind
    signal.signal(signal.SIGINT, _worker_sigint)
    if forked:
        # libgomp is not fork-safe: once the driver has run an OpenMP region, a forked child's first multi-threaded
        # op waits forever for threads that were not copied. One thread per worker (the workers share the cores),
        # for torch and for numpy's BLAS too: two workers' spinning OpenBLAS threads on two cores made an FID's
        # eigendecomposition take minutes.
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(1)
        threadpool_limits(1)
    if init is not None:
        init()


def _call(work, unit):
    try:
        rows = work(unit)
        return unit, rows, "" if rows is not None else "interrupted"
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which releases the unit's cells
        return unit, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _worker_call(work, unit):
    """``_call`` in a pool worker: after a Ctrl-C (or a unit that was interrupted) the worker takes no more work, so
    one Ctrl-C ends the run within a training step instead of the pool moving on to the next unit."""
    global _STOPPED, _IN_UNIT
    if _STOPPED:
        return unit, None, "interrupted"
    _IN_UNIT = True
    try:
        out = _call(work, unit)
    except KeyboardInterrupt:
        out = unit, None, "interrupted"
    finally:
        _IN_UNIT = False
    _STOPPED = _STOPPED or out[2] == "interrupted"
    return out


def _stop_pool(pool: ProcessPoolExecutor, futures) -> None:
    """Cancel the units not handed out yet and pass a Ctrl-C on to the workers (a SIGINT sent to the driver alone
    reaches them too): a running unit checkpoints and returns, a queued one returns without starting."""
    for f in futures:
        f.cancel()
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass


def _death(processes) -> str:
    """Why a pool broke, from the exit codes of its worker processes: the one killed by a signal (SIGKILL: killed,
    or the kernel's out-of-memory killer) or exited with an error; the SIGTERM the pool then sends the others
    counts last."""
    codes = [(p.pid, p.exitcode) for p in processes if p.exitcode not in (None, 0)]
    codes.sort(key=lambda pc: (pc[1] == -signal.SIGTERM, pc[1] > 0))
    if not codes:
        return "a worker process died abruptly"
    pid, code = codes[0]
    if code > 0:
        return f"worker process {pid} exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = " (killed, e.g. by the out-of-memory killer)" if name == "SIGKILL" else ""
    return f"worker process {pid} died of {name}{hint}"


def _fill(pool: ProcessPoolExecutor, work: list, live: dict, plan) -> bool:
    """Submit units from the front of ``work`` until ``plan.workers`` are in flight in ``live``; a unit marked
    alone runs with nothing beside it. True when the pool turned out broken (a worker died between units)."""
    while work and len(live) < plan.workers:
        unit, alone = work[0]
        if live and (alone or any(a for _, a in live.values())):
            return False
        try:
            fut = pool.submit(_worker_call, plan.work, unit)
        except BrokenProcessPool:
            return True
        work.pop(0)
        live[fut] = (unit, alone)
    return False


class LocalLauncher:
    """In this process, or ``plan.workers`` forked processes (spawned on CUDA) that die with the driver. An
    interrupted unit (a Ctrl-C) ends the run: no further unit starts; the finished ones are stored by the driver.

    A worker that dies (killed, out of memory) breaks the pool: at most ``plan.workers`` units are in flight, so the
    units it may have been running are known. A unit that was alone in flight is the one that died: it comes back
    failed, with the reason (``_death``), and its cells are released. Several in flight: each is rerun by itself in
    a fresh pool, which pins the one that dies again; the others, and every unit not started yet, run and are
    stored as usual."""

    def run(self, units: list[list[dict]], plan):
        if plan.workers <= 1 or len(units) <= 1:
            if plan.worker_init is not None:
                plan.worker_init()
            for unit in units:
                out = _call(plan.work, unit)
                yield out
                if out[2] == "interrupted":
                    return
            return
        method = "fork" if sys.platform == "linux" else "spawn"
        work = [(u, False) for u in units]  # (unit, alone): a suspect of a broken pool runs with nothing beside it
        stopped = False
        while work and not stopped:
            with ProcessPoolExecutor(plan.workers, mp_context=get_context(method), initializer=_init_worker,
                                     initargs=(os.getpid(), plan.worker_init, method == "fork")) as pool:
                live: dict = {}  # future -> (unit, alone); at most plan.workers, so a break names its suspects
                procs, broken = [], False
                suspects, ran, finished = [], False, False
                try:
                    broken = _fill(pool, work, live, plan)
                    procs = list((getattr(pool, "_processes", None) or {}).values()) or procs
                    while live:
                        done, _ = wait(live, return_when=FIRST_COMPLETED)
                        ready = []
                        for fut in done:
                            unit, alone = live.pop(fut)
                            if fut.cancelled():  # dropped after an interrupt: its cells are released by the driver
                                continue
                            try:
                                out = fut.result()
                            except BrokenProcessPool:
                                broken = True
                                suspects.append((unit, alone))
                                continue
                            ran = True
                            if out[2] == "interrupted" and not stopped:
                                stopped = True
                                _stop_pool(pool, list(live))
                            ready.append(out)
                        if not (broken or stopped):  # the next units start before these are stored
                            broken = _fill(pool, work, live, plan)
                            procs = list((getattr(pool, "_processes", None) or {}).values()) or procs
                        yield from ready
                    finished = True
                finally:  # on Ctrl-C the finished units are stored; running ones checkpoint, queued ones are dropped
                    if not finished:
                        _stop_pool(pool, list(live))
            why = _death(procs)  # after the pool's shutdown: every worker's exit code is known
            if len(suspects) == 1 or any(alone for _, alone in suspects):  # this unit's worker died
                for unit, _ in suspects:
                    yield unit, None, f"{why}; its cells are left for a rerun"
            elif suspects:  # one of these died: each runs alone next, before the units not started yet
                work = [(unit, True) for unit, _ in suspects] + work
            elif broken and not ran:  # a fresh pool that breaks before any unit runs: it would again
                for unit, _ in work:
                    yield unit, None, f"{why} before running a unit; its cells are left for a rerun"
                return


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


def check_launcher(args, name: str = "run") -> None:
    """The launcher settings of ``args`` checked as a launch checks them, creating and submitting nothing: with
    ``--launcher submitit`` everything ``SubmititLauncher`` refuses; with ``local`` a given ``--slurm-extra`` is
    still checked (where submitit is installed), since a bad key is bad input whatever runs it. The experiments'
    parser calls it, so a real run and a dry run refuse the same settings before any work.

    Raises:
        ValueError: the first bad setting, the message naming its flag.
    """
    if getattr(args, "launcher", "local") == "submitit":
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ValueError("launcher: submitit is not installed (pip install attention_zoo[cluster])") from None
        _parameters(args, name)
    elif getattr(args, "slurm_extra", None):
        try:
            import submitit  # noqa: F401
        except ImportError:
            return
        _extra(args.slurm_extra)


def run_whole(args, name: str, fn, check=None) -> int:
    """``fn(args)`` here (``--launcher local``) or as one submitit job, waiting for it (``--launcher submitit``);
    with ``--dry-run``, the plan instead. ``check(args)``: the script's own argument checks (the ones ``fn`` makes
    before any work), run first in either case, so a dry run refuses what the run would refuse."""
    if check is not None:
        check(args)
    if getattr(args, "dry_run", False):
        from .dryrun import show_whole

        return show_whole(args, name)
    if getattr(args, "launcher", "local") != "submitit":
        return fn(args)
    folder = Path(args.out) / "_cache" / "submitit"
    launcher = SubmititLauncher(args, folder, name)
    local = argparse.Namespace(**{**vars(args), "launcher": "local"})
    path = folder / "results" / f"{name}-whole.json"
    if path.exists():
        path.unlink()
    job = launcher.executor().submit(WholeRunJob(fn, local, str(path)))
    job.wait()
    try:
        return int(json.loads(path.read_text())["exit_code"])
    except (OSError, ValueError, KeyError):
        print(f"{name}: the cluster job ended without an exit code: {_log_tail(job)}", file=sys.stderr)
        return 1
