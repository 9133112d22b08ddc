"""``python -m attention_zoo.claims --results results/``: rebuild the verdict table from the stores, training nothing.

Writes ``<results>/claims.md`` and ``<results>/claims.csv`` (or ``--md`` / ``--csv``) and prints one line per verdict.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import HelpFormatter, cli_main
from ..io import atomic_write_csv, atomic_write_text
from . import CLAIMS, verdict_frame, verdict_lines, verdict_markdown, verdicts_for


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.claims", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results"), help="folder of the per-script result folders")
    p.add_argument("--md", type=Path, default=None, help="markdown output (default: <results>/claims.md)")
    p.add_argument("--csv", type=Path, default=None, help="CSV output (default: <results>/claims.csv)")
    p.add_argument("--experiments", default=None, help="comma-separated scripts whose claims to decide (default: all)")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        raise ValueError(f"results: {str(args.results)!r} is not a directory")
    for name in ("md", "csv"):  # before any work
        target = getattr(args, name) or args.results / f"claims.{name}"
        if target.is_dir():
            raise ValueError(f"{name}: {str(target)!r} is a directory, expected a file name")
        if not target.parent.is_dir():
            raise ValueError(f"{name}: the folder of {str(target)!r} does not exist")
        setattr(args, name, target)
    chosen = tuple(s.strip() for s in args.experiments.split(",") if s.strip()) if args.experiments else None
    known = sorted({c.experiment for c in CLAIMS})
    unknown = [e for e in chosen or () if e not in known]
    if unknown or chosen == ():
        raise ValueError(f"experiments: unknown {', '.join(map(repr, unknown)) or 'empty selection'}; known: "
                         f"{', '.join(known)}")
    verdicts = verdicts_for(args.results, chosen)
    atomic_write_text(args.md, "# Verdicts on the paper's claims\n\n" + verdict_markdown(verdicts))
    atomic_write_csv(verdict_frame(verdicts), args.csv)
    print("\n".join(verdict_lines(verdicts)))
    print(f"wrote {args.md} and {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
