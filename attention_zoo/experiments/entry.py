"""An experiment's entry point: ``experiment_main`` wraps a script's ``main(argv)`` — one ``error:`` line for bad
input (``cli.cli_main``), the whole call read-only under ``--dry-run`` (``dryrun``), and the behaviour fingerprints
of the cells a run made recorded when it ends (``fingerprint_records``)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from ..cli import cli_main
from ..data.fetch import DatasetNotFoundError
from ..io import read_only
from .dryrun import show_missing_data


def experiment_main(main):
    """``cli_main`` for an experiment's ``main(argv)``; with ``--dry-run`` the whole call runs read-only. A run
    that made cells records their fingerprints when it ends (``fingerprint_records.record_new_runs``)."""

    @cli_main
    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        argv = sys.argv[1:] if argv is None else list(argv)
        if any(len(a) > 4 and "--dry-run".startswith(a) for a in argv):  # argparse takes abbreviations
            with read_only():
                try:
                    return main(argv)
                except DatasetNotFoundError as exc:  # data not on disk: part of the plan, not an error
                    return show_missing_data(main.__module__.rsplit(".", 1)[-1], exc)
        from .fingerprint_records import record_new_runs, run_ids

        out = _out_dir(main, argv)
        before = run_ids(out) if out is not None and out.is_dir() else {}
        try:
            code = main(argv)
        except KeyboardInterrupt:
            if out is not None:
                print(f"note: no fingerprint recorded for the cells of this run; `python -m attention_zoo.experiments."
                      f"backfill {out}` records it while the code is unchanged", file=sys.stderr)
            raise
        if out is not None and out.is_dir():
            record_new_runs(out, before)
        return code

    return wrapped


def _out_dir(main, argv: list[str]) -> Path | None:
    """The ``--out`` a script's ``argv`` names (or its parser's default); None when it cannot be told."""
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if a.startswith("--out="):
            return Path(a.split("=", 1)[1])
    build = getattr(sys.modules.get(main.__module__), "build_parser", None)
    default = build().get_default("out") if build is not None else None
    return Path(default) if default else None


__all__ = ["experiment_main"]
