"""Backfill: record the behaviour fingerprints a result store lacks, where the code its numbers depend on is unchanged
since the runs that made its cells (comments and docstrings aside; clean commits only), so a probe made now stands for
that code. ``python -m attention_zoo.experiments.backfill results/<folder> ...``."""

from __future__ import annotations

from pathlib import Path

from ..envinfo import _git
from . import fingerprint as fp
from .fingerprint_records import StoreRuns, _entry, _write, experiment_of, read_records, store_runs
from .freshness import code_files, later_changes
from .protocol import EXPERIMENTS


def unchanged_since(store: Path, run_id: str, sr: StoreRuns) -> str | None:
    """None when the code the store's numbers depend on is the same now as at the run's commit (comments and
    docstrings aside) and that commit was clean; else why not."""
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


def main(argv: list[str] | None = None) -> int:
    """``FOLDER...``: record the fingerprints a store lacks where its code is unchanged since its runs."""
    import argparse

    from ..cli import cli_main

    def run(argv):
        p = argparse.ArgumentParser(prog="python -m attention_zoo.experiments.backfill",
                                    description=main.__doc__)
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


__all__ = ["backfill", "main", "unchanged_since"]
