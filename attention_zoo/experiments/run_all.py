"""Run every table and figure at one preset (finished cells are skipped by each script), then write
``results/README.md``. Each script runs in its own process; a failing script is reported and the rest go on."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from .common import HelpFormatter, cli_main
from .results_index import build_index

REPRODUCE = Path(__file__).resolve().parents[2] / "reproduce"
# In dependency order: Appendix E reads Table 1's per-sample scores.
SCRIPTS = ("table2_efficiency", "table7_complexity", "synthetic", "table5_gpt2", "table1_generation",
           "appendix_e_kde", "table3_depth_blocks", "table4_ablation", "table6_vit", "appendix_fgh",
           "rowsum_analysis")


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python reproduce/all.py", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--preset", choices=("smoke", "paper"), default="smoke", help="preset of every script")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--results", type=Path, default=Path("results"), help="root of the per-script folders")
    p.add_argument("--only", default=",".join(SCRIPTS), help="comma-separated subset of the scripts")
    p.add_argument("--index-only", action="store_true", help="only rebuild results/README.md")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SCRIPTS))
    if unknown:
        raise ValueError(f"only: unknown {', '.join(unknown)}; available: {', '.join(SCRIPTS)}")
    failed = []
    for name in [s for s in SCRIPTS if s in chosen and not args.index_only]:
        cmd = [sys.executable, str(REPRODUCE / f"{name}.py"), "--preset", args.preset, "--device", args.device,
               "--out", str(args.results / name), "--quiet"]
        t0 = time.perf_counter()
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        rc = subprocess.run(cmd).returncode
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    path = build_index(args.results, args.preset)
    print(f"wrote {path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
