"""Where fingerprints live and when they are made: ``<store>.fingerprint.json`` beside a result store, one entry per
run (sitting) that made cells of it, each holding the probes of the arms that run made (``fingerprint``).

A run records its entry when it ends (``experiment_main`` calls ``record_new_runs``), with the code that made its
cells. A store made before fingerprints existed can be *backfilled* (``python -m
attention_zoo.experiments.fingerprint_records backfill results/<folder>``) only where the code its numbers depend on
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


def unchanged_since(store: Path, run_id: str, sr: StoreRuns) -> str | None:
    """None when the code the store's numbers depend on is the same now as at the run's commit (comments and
    docstrings aside) and that commit was clean; else why not."""
    from .freshness import code_files, later_changes
    from .protocol import EXPERIMENTS

    env = sr.runs.get(run_id, {}).get("env") or {}
    commit, exp = env.get("git_commit"), EXPERIMENTS.get(experiment_of(store))
    if not commit or commit == "unknown" or env.get("git_dirty"):
        return f"run `{run_id}` came from {'an uncommitted tree' if env.get('git_dirty') else 'no known commit'}"
    if exp is None:
        return f"{experiment_of(store)!r} is not a registered experiment"
    changes = later_changes([commit], code_files((exp.module_path,)))
    if changes is None:
        return f"commit {commit[:7]} of run `{run_id}` is not in this history"
    return f"{len(changes)} later commit(s) changed its code" if changes else None


def backfill(folder: Path) -> tuple[list[Path], list[str]]:
    """Record the missing entries of the stores under ``folder``, probing at this code, for the runs whose code is
    unchanged since (the only case where a probe today stands for the code that made the cells); (the files
    written, the runs refused with why)."""
    written, refused = [], []
    head = _git("rev-parse", "HEAD") or "unknown"
    for store in sorted(Path(folder).glob("*.jsonl")):
        exp = experiment_of(store)
        if fp.probe_of(exp) is None:
            continue
        sr, old = store_runs(store), (read_records(store) or {"runs": {}})["runs"]
        todo = {rid: cells for rid, cells in sr.cells.items() if rid not in old}
        for rid in list(todo):
            why = unchanged_since(store, rid, sr)
            if why:
                refused.append(f"{store}: {why}")
                del todo[rid]
        new = {rid: _entry(exp, sr.runs.get(rid, {}), cells, f"backfilled at {head[:7]}: the code its numbers "
                           "depend on equals the run's (comments and docstrings aside)")
               for rid, cells in todo.items()}
        if new:
            written.append(_write(store, new))
    return written, refused


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


def check(store: Path, code_digest: str, cache_dir: Path | None = None) -> Check:
    """Compare every owning run's recorded probes with the probes of the code in this process."""
    exp, recs = experiment_of(store), read_records(store)
    sr = store_runs(store)
    owners = [rid for rid, cells in sr.cells.items() if cells]
    missing = [rid for rid in owners if recs is None or rid not in recs["runs"]]
    if missing:
        return Check("unrecorded", f"{len(missing)} of its {len(owners)} run(s) recorded no fingerprint (made before "
                                   "fingerprints existed)")
    n = 0
    for rid in owners:
        entry, options = recs["runs"][rid], _options(sr.runs.get(rid, {}))
        for item in entry.get("arms") or []:
            arm, stored = item["arm"], item["probes"]
            now = _cached(exp, arm, options, code_digest, cache_dir)
            why = fp.difference(stored, now)
            n += 1
            if why:
                label = "/".join(str(arm[k]) for k in ("dataset", "task", "model", "variant", "flavor", "setting",
                                                       "phase") if arm.get(k) is not None)
                return Check("differs", f"arm `{label}` (run `{rid}`): {why}", n)
    return Check("equal", f"{n} arm(s) probed", n)


def _cached(experiment: str, arm: dict, options: dict, code_digest: str, cache_dir: Path | None) -> list:
    path = None if cache_dir is None else cache_dir / f"{_cache_key(experiment, arm, options, code_digest)}.json"
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    probes = fp.fingerprint_arms(experiment, [arm], options)[fp.arm_key(arm)]
    probes = json.loads(json.dumps(probes))  # as stored: tuples become lists
    if path is not None and not is_read_only():
        atomic_write_json(path, probes)
    return probes


def main(argv: list[str] | None = None) -> int:
    """``backfill FOLDER...``: record the fingerprints a store lacks where its code is unchanged since its runs."""
    import argparse

    from ..cli import cli_main

    def run(argv):
        p = argparse.ArgumentParser(prog="python -m attention_zoo.experiments.fingerprint_records",
                                    description=main.__doc__)
        p.add_argument("command", choices=("backfill",))
        p.add_argument("folders", nargs="+", type=Path)
        args = p.parse_args(argv)
        bad = [f for f in args.folders if not f.is_dir()]
        if bad:
            raise ValueError(f"folders: {', '.join(map(str, bad))} is not a directory")
        code = 0
        for folder in args.folders:
            written, refused = backfill(folder)
            for w in written:
                print(f"recorded {w}")
            for r in refused:
                print(f"not recorded: {r}")
            code = max(code, int(bool(refused)))
        return code

    return cli_main(run)(argv)


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["Check", "ENV_SWITCH", "backfill", "check", "read_records", "record_new_runs", "record_path", "run_ids",
           "store_runs", "unchanged_since"]
