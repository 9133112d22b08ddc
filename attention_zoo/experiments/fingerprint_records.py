"""Where fingerprints live and when they are made: ``<store>.fingerprint.json`` beside a result store, one entry per
run (sitting) that made cells of it, each holding the probes of the arms that run made (``fingerprint``).

A run records its entry when it ends (``experiment_main`` calls ``record_new_runs``), with the code that made its
cells. A store made before fingerprints existed can be *backfilled* (``python -m
attention_zoo.experiments.backfill results/<folder>``) only where the code its numbers depend on
is unchanged since its runs (comments and docstrings aside, ``freshness``): the probes are then computed by that same
code. ``check`` recomputes the probes at
the code in this process and compares; results are cached by the digest of that code, so a rebuilt index reprobes
nothing that did not change. ``ATTENTION_ZOO_FINGERPRINT=0`` skips the recording (tests that run scripts)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..envinfo import _git, tree_dirty
from ..io import atomic_write_json, is_read_only, read_jsonl
from . import fingerprint as fp

ENV_SWITCH = "ATTENTION_ZOO_FINGERPRINT"


def record_path(store: Path) -> Path:
    """``<folder>/<name>.jsonl`` -> ``<folder>/<name>.fingerprint.json``."""
    return store.with_name(store.name.removesuffix(".jsonl") + fp.SUFFIX)


def read_records(store: Path) -> dict | None:
    """The store's fingerprint file, or None when it has none or it cannot be read as one."""
    path = record_path(store)
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("runs"), dict) else None


@dataclass
class StoreRuns:
    """A store's runs: the run record of each (its environment and context) and the cells each one owns now (the
    newest record of a cell counts)."""

    runs: dict[str, dict]
    cells: dict[str, list[dict]]


def store_runs(store: Path) -> StoreRuns:
    runs, owner = {}, {}
    for rec in read_jsonl(store):
        if rec.get("kind") == "run" and "run_id" in rec:
            runs[rec["run_id"]] = rec
        elif "cell_id" in rec and isinstance(rec.get("cell"), dict):
            owner[rec["cell_id"]] = (rec.get("run_id"), rec["cell"])
    cells: dict[str, list[dict]] = {}
    for run_id, cell in owner.values():
        cells.setdefault(run_id, []).append(cell)
    return StoreRuns(runs, cells)


def experiment_of(store: Path) -> str:
    return store.name.removesuffix(".jsonl")


def _options(run: dict) -> dict:
    ctx = run.get("context") if isinstance(run.get("context"), dict) else {}
    return ctx.get("options") if isinstance(ctx.get("options"), dict) else {}


def _entry(experiment: str, run: dict, cells: list[dict], how: str) -> dict:
    arms = fp.arms_of(experiment, cells)
    probes = fp.fingerprint_arms(experiment, arms, _options(run))
    env = run.get("env") if isinstance(run.get("env"), dict) else {}
    return {"git_commit": env.get("git_commit"), "git_dirty": env.get("git_dirty"), "time_utc": env.get("time_utc"),
            "recorded": how, "recorded_at": _git("rev-parse", "HEAD") or "unknown",
            "recorded_dirty": tree_dirty(), "torch": torch.__version__,
            "arms": [{"arm": a, "probes": probes[fp.arm_key(a)]} for a in arms]}


def _write(store: Path, entries: dict[str, dict]) -> Path:
    old = read_records(store) or {"runs": {}}
    body = {"version": fp.VERSION, "rtol": fp.RTOL, "experiment": experiment_of(store),
            "runs": {**old["runs"], **entries}}
    return atomic_write_json(record_path(store), body)


def run_ids(folder: Path) -> dict[Path, set[str]]:
    """The run ids each store under ``folder`` holds now (taken before a run, to find the runs it adds)."""
    return {s: set(store_runs(s).runs) for s in sorted(Path(folder).glob("*.jsonl"))}


def record_new_runs(folder: Path, before: dict[Path, set[str]]) -> list[Path]:
    """Record the fingerprint of every run added to a store under ``folder`` since ``before`` that made cells; the
    fingerprint files written. Skipped where the experiment has no probe, in a dry run, or when
    ``ATTENTION_ZOO_FINGERPRINT=0``."""
    if os.environ.get(ENV_SWITCH) == "0" or is_read_only():
        return []
    written = []
    for store in sorted(Path(folder).glob("*.jsonl")):
        exp = experiment_of(store)
        if fp.probe_of(exp) is None:
            continue
        sr = store_runs(store)
        new = {rid: _entry(exp, sr.runs[rid], sr.cells[rid], "with the run")
               for rid in sr.runs if rid not in before.get(store, set()) and sr.cells.get(rid)}
        if new:
            written.append(_write(store, new))
    return written


@dataclass
class Check:
    """The outcome of comparing a store's fingerprints with the code now: ``state`` "equal", "differs" or
    "unrecorded" (some run that owns cells has no entry), with the words for the report."""

    state: str
    text: str
    arms: int = 0


def _cache_key(experiment: str, arm: dict, options: dict, code_digest: str) -> str:
    text = json.dumps([experiment, arm, options, code_digest, torch.__version__, fp.VERSION], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _recorded_arms(recs: dict | None, sr: StoreRuns):
    """(run id, arm, its recorded probes, the run's options) of every run that owns cells, in the store's order."""
    for rid, cells in sr.cells.items():
        entry = recs["runs"].get(rid) if cells and recs is not None else None
        for item in (entry or {}).get("arms") or []:
            yield rid, item["arm"], item["probes"], _options(sr.runs.get(rid, {}))


def check(store: Path, code_digest: str, cache_dir: Path | None = None, part: tuple[int, int] = (0, 1)) -> Check:
    """Compare every owning run's recorded probes with the probes of the code in this process, arm by arm, up to the
    first that differs. ``part`` (k, n): only every n-th arm from the k-th (``compute_pending`` splits a store's
    probes between its workers so)."""
    exp, recs = experiment_of(store), read_records(store)
    sr = store_runs(store)
    owners = [rid for rid, cells in sr.cells.items() if cells]
    missing = [rid for rid in owners if recs is None or rid not in recs["runs"]]
    if missing:
        return Check("unrecorded", f"{len(missing)} of its {len(owners)} run(s) recorded no fingerprint (made before "
                                   "fingerprints existed)")
    n = 0
    for i, (rid, arm, stored, options) in enumerate(_recorded_arms(recs, sr)):
        if i % part[1] != part[0]:
            continue
        why = fp.difference(stored, _cached(exp, arm, options, code_digest, cache_dir))
        n += 1
        if why:
            label = "/".join(str(arm[k]) for k in ("dataset", "task", "model", "variant", "flavor", "setting",
                                                   "phase") if arm.get(k) is not None)
            return Check("differs", f"arm `{label}` (run `{rid}`): {why}", n)
    return Check("equal", f"{n} arm(s) probed", n)


def _cache_file(cache_dir: Path | None, experiment: str, arm: dict, options: dict, code_digest: str) -> Path | None:
    return None if cache_dir is None else cache_dir / f"{_cache_key(experiment, arm, options, code_digest)}.json"


def _read_cached(path: Path | None) -> list | None:
    try:
        return json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None


def _cached(experiment: str, arm: dict, options: dict, code_digest: str, cache_dir: Path | None) -> list:
    path = _cache_file(cache_dir, experiment, arm, options, code_digest)
    probes = _read_cached(path)
    if probes is None:
        probes = fp.fingerprint_arms(experiment, [arm], options)[fp.arm_key(arm)]
        probes = json.loads(json.dumps(probes))  # as stored: tuples become lists
        if path is not None and not is_read_only():
            atomic_write_json(path, probes)
    return probes


def pending(store: Path, code_digest: str, cache_dir: Path) -> list[tuple]:
    """``[(store, digest, cache dir)]`` when ``check`` would compute a probe for ``store`` (it reaches an arm not
    cached before one that differs), else []. One unit per store: ``compute_pending`` walks it as ``check`` does,
    so a section whose behaviour changed costs a probe per worker, not one per arm."""
    exp, recs, sr = experiment_of(store), read_records(store), store_runs(store)
    for _, arm, stored, options in _recorded_arms(recs, sr):
        now = _read_cached(_cache_file(cache_dir, exp, arm, options, code_digest))
        if now is None:
            return [(str(store), code_digest, str(cache_dir))]
        if fp.difference(stored, now):
            return []
    return []


def _settle(job: tuple) -> str:
    store, digest, cache_dir, part = job
    return check(Path(store), digest, Path(cache_dir), part).state  # computes and caches its probes


def compute_pending(jobs: list[tuple], workers: int = 2) -> None:
    """Run ``check`` on the stores of ``jobs`` (from ``pending``) so their probes are cached before the index reads
    them, in ``workers`` fresh processes (spawned: each imports the package anew). Each store's arms are shared
    between the workers (every ``workers``-th arm to one), each worker stopping at its first arm that differs: a
    section whose behaviour changed costs a probe or two, one whose code changed alone costs its arms / workers."""
    if not jobs:
        return
    if workers <= 1:
        for store, digest, cache_dir in jobs:
            _settle((store, digest, cache_dir, (0, 1)))
        return
    import concurrent.futures as cf
    import multiprocessing as mp

    units = [(*job, (k, workers)) for job in jobs for k in range(workers)]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for f in [pool.submit(_settle, unit) for unit in units]:
            f.result()


__all__ = ["Check", "ENV_SWITCH", "check", "compute_pending", "pending", "read_records",
           "record_new_runs", "record_path", "run_ids", "store_runs"]
