"""``python -m attention_zoo.claims --results results/``: rebuild the verdict table from the stores, training nothing
(``--paper tha|dcmha|colmha|moa|mma|damcha``: one paper's claims).

Writes ``<results>/claims.md`` and ``<results>/claims.csv`` (or ``--md`` / ``--csv``) and prints one line per verdict.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import HelpFormatter, cli_main
from ..io import atomic_write_csv, atomic_write_text
from . import CLAIMS, PAPER_NAMES, PAPER_TITLES, verdict_frame, verdict_lines, verdict_markdown, verdicts_for


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.claims", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results"), help="folder of the per-script result folders")
    p.add_argument("--md", type=Path, default=None, help="markdown output (default: <results>/claims.md)")
    p.add_argument("--csv", type=Path, default=None, help="CSV output (default: <results>/claims.csv)")
    p.add_argument("--experiments", default=None, help="comma-separated scripts whose claims to decide (default: all)")
    p.add_argument("--paper", choices=PAPER_NAMES, default=None,
                   help="only this paper's claims: the DAMCHA paper's (damcha) or a baseline's own (tha: Talking-Heads "
                        "Attention, dcmha: DCFormer, colmha: collaborative heads, moa: Mixture of Attention Heads, "
                        "mma: MMA); the tables are then written to claims_<paper>.md/.csv unless --md/--csv say")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        raise ValueError(f"results: {str(args.results)!r} is not a directory")
    stem = "claims" if args.paper is None else f"claims_{args.paper}"
    for name in ("md", "csv"):  # before any work
        target = getattr(args, name) or args.results / f"{stem}.{name}"
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
    verdicts = verdicts_for(args.results, chosen, args.paper)
    title = "the paper's claims" if args.paper is None else f"{PAPER_TITLES[args.paper]}'s claims"
    atomic_write_text(args.md, f"# Verdicts on {title}\n\n" + verdict_markdown(verdicts))
    atomic_write_csv(verdict_frame(verdicts), args.csv)
    print("\n".join(verdict_lines(verdicts)))
    print(f"wrote {args.md} and {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
