"""Where the units of a plan run: this machine (``local``) or a Slurm cluster through submitit (``submitit``, in
``slurm``). Both yield ``(unit, rows per cell or None, error)`` as units finish; the driver (``protocol.execute``)
stores them."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

from ..workers import die_with_parent
from .slurm import SubmititLauncher, WholeRunJob, _extra, _log_tail, _parameters


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
    # a forked worker inherits the driver's SIGTERM-as-Ctrl-C (workers.terminate_as_interrupt); the pool ends a
    # broken pool's workers with SIGTERM, which must end them
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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

    refills = True  # takes ``more`` (protocol.execute): units that become plannable while it runs

    def run(self, units: list[list[dict]], plan, more=None):
        if plan.workers <= 1 or len(units) <= 1 and more is None:
            if plan.worker_init is not None:
                plan.worker_init()
            queue = list(units)
            while queue or more is not None and (queue := more()):
                out = _call(plan.work, queue.pop(0))
                yield out
                if out[2] == "interrupted":
                    return
            return
        method = "fork" if sys.platform == "linux" else "spawn"
        work = [(u, False) for u in units]  # (unit, alone): a suspect of a broken pool runs with nothing beside it
        if not work and more is not None:
            work = [(u, False) for u in more()]
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
                        if ready and more is not None and not (work or broken or stopped):
                            # stored now: the units these made plannable start on the workers they freed
                            work += [(u, False) for u in more()]
                            broken = _fill(pool, work, live, plan)
                            procs = list((getattr(pool, "_processes", None) or {}).values()) or procs
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
