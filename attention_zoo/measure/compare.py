"""Regressions across commits: ``python -m attention_zoo.bench compare BASE.csv NEW.csv [--threshold 0.05]``.

Reads two saved runs — ``python -m attention_zoo.bench --results-file`` CSVs or quick-benchmark ``--csv`` files —
and compares every case both ran (same variant, flavour, shape, mode, dtype and compilation; or the same quick
case) by its median time. A case **regressed** when NEW/BASE − 1 exceeds the threshold *and* the two runs'
interquartile ranges do not overlap (NEW's q25 above BASE's q75): a change inside the rounds' own spread is noise.
Improvements are reported the same way. The header names the machine, torch and commit of both sides (from the
``.env.json`` written beside a results file, else the CSV's own columns). Exit status: 1 when any case regressed,
0 otherwise; 2 for bad input. Ratios are only meaningful between runs on the same machine kind: the header says
when the two differ.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from ..cli import HelpFormatter, cli_main
from ..io import atomic_write_csv

BENCH_KEYS = ["variant", "flavor", "batch", "seq_len", "d_model", "n_heads", "causal", "mode", "dtype", "compiled"]
BENCH_TIME = ("latency_median_ms", "latency_q25_ms", "latency_q75_ms")
QUICK_TIME = ("fwd_bwd_ms", "q25_ms", "q75_ms")


def load_run(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """(rows keyed by ``case`` with median/q25/q75 ms, the run's machine/torch/commit)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"run: {str(path)!r} is not a file (a CSV written by the benchmark)")
    df = pd.read_csv(path)
    if set(BENCH_TIME) <= set(df):
        keys = [k for k in BENCH_KEYS if k in df]
        case = df[keys].astype(str).agg(" ".join, axis=1)
        med, q25, q75 = BENCH_TIME
    elif {"case", *QUICK_TIME} <= set(df):
        case = df["case"].astype(str)
        med, q25, q75 = QUICK_TIME
    else:
        raise ValueError(f"run: {str(path)!r} has neither the bench columns {BENCH_TIME} nor the quick benchmark's "
                         f"{('case', *QUICK_TIME)}")
    ok = df["status"].fillna("ok").eq("ok") if "status" in df else pd.Series(True, index=df.index)
    rows = pd.DataFrame({"case": case, "median_ms": df[med], "q25_ms": df[q25], "q75_ms": df[q75]})[ok]
    rows = rows.dropna(subset=["median_ms"]).drop_duplicates("case", keep="last").set_index("case")
    env_file = Path(f"{path}.env.json")
    env = json.loads(env_file.read_text()) if env_file.is_file() else {}

    def col(c: str) -> str | None:
        return str(df[c].dropna().iloc[0]) if c in df and df[c].notna().any() else None

    machine = env.get("device_name") or col("cpu_model") or col("device_name") or "unknown"
    if env.get("cpu_model") and env.get("cpu_model") != machine:
        machine = f"{machine} / {env['cpu_model']}"
    meta = {"file": str(path), "machine": machine, "torch": env.get("torch") or col("torch") or "unknown",
            "commit": str(env.get("git_commit") or col("git_commit") or "unknown")[:10]}
    return rows, meta


def compare(base: pd.DataFrame, new: pd.DataFrame, threshold: float = 0.05) -> pd.DataFrame:
    """Per common case: base and new median (ms), ratio new/base and a verdict: regression, improvement or same."""
    if not (isinstance(threshold, (int, float)) and 0 < threshold < 10 and math.isfinite(threshold)):
        raise ValueError(f"threshold: expected a positive fraction (0.05 = 5 %), got {threshold!r}")
    both = base.add_suffix("_base").join(new.add_suffix("_new"), how="inner")
    ratio = both["median_ms_new"] / both["median_ms_base"]
    slower = (ratio - 1 > threshold) & (both["q25_ms_new"] > both["q75_ms_base"])
    faster = (1 - ratio > threshold) & (both["q75_ms_new"] < both["q25_ms_base"])
    verdict = pd.Series("same (within noise or threshold)", index=both.index)
    verdict[slower], verdict[faster] = "regression", "improvement"
    return pd.DataFrame({"base_ms": both["median_ms_base"], "new_ms": both["median_ms_new"], "ratio": ratio,
                         "verdict": verdict})


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench compare", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("base", type=Path, help="the earlier run's CSV")
    p.add_argument("new", type=Path, help="the later run's CSV")
    p.add_argument("--threshold", type=float, default=0.05, help="relative slow-down that counts (0.05 = 5 %%)")
    p.add_argument("--csv", type=Path, default=None, help="write the per-case comparison here")
    args = p.parse_args(argv)
    (base, bmeta), (new, nmeta) = load_run(args.base), load_run(args.new)
    table = compare(base, new, args.threshold)
    for side, m in (("base", bmeta), ("new ", nmeta)):
        print(f"{side}: {m['file']} — machine {m['machine']}, torch {m['torch']}, commit {m['commit']}")
    if bmeta["machine"] != nmeta["machine"]:
        print("warning: the two runs come from different machines: ratios compare machines, not commits",
              file=sys.stderr)
    if table.empty:
        raise ValueError("new: no case in common with base (different variants, shapes or modes)")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        atomic_write_csv(table.reset_index(), args.csv)
    bad = table[table["verdict"] == "regression"]
    print(f"{len(bad)} regression(s) beyond {100 * args.threshold:g} % and the runs' IQR; "
          f"{int((table['verdict'] == 'improvement').sum())} improvement(s); {len(table)} cases compared")
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
