"""Regressions across commits: ``python -m attention_zoo.bench compare BASE.csv NEW.csv [--threshold 0.05]``.

Reads two saved runs — ``python -m attention_zoo.bench --results-file`` CSVs or quick-benchmark ``--csv`` files —
and compares every case both ran (same variant, flavour, shape, mode, dtype and compilation; or the same quick
case) by its median time. A case **regressed** when NEW/BASE − 1 exceeds the threshold *and* the two runs'
interquartile ranges do not overlap (NEW's q25 above BASE's q75): a change inside the rounds' own spread is noise.
Where a row has an IQR but no q25/q75 (the quick benchmark's breakdown rows), its spread is the median ± IQR/2; a
case without any spread on either side is judged by the threshold alone.
Improvements are reported the same way.

A comparison never passes on a case it could not compare: a case the base run timed that the new run lacks, or
has no time for (an ``error``/``oom``/``nan``/``incorrect`` row, a NaN or infinite median), is named and fails the
comparison like a regression. Cases only the new run has, and cases the base run has no time for, are listed and
do not fail it.

The header names the machine, torch and commit of both sides (from the ``.env.json`` written beside a results
file, else the CSV's own columns). Exit status: 1 when any case regressed or could not be compared, 0 otherwise;
2 for bad input (a file that is missing, empty, not a CSV, lacks the timing columns or holds non-numeric timings;
the message names the file). Ratios are only meaningful between runs on the same machine kind: the header says
when the two differ.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..cli import HelpFormatter, cli_main
from ..io import atomic_write_csv
from ..results import ensure_out_file

BENCH_KEYS = ["variant", "flavor", "batch", "seq_len", "d_model", "n_heads", "causal", "mode", "dtype", "compiled"]
BENCH_TIME = ("latency_median_ms", "latency_q25_ms", "latency_q75_ms")
QUICK_TIME = ("fwd_bwd_ms", "q25_ms", "q75_ms")
IQR = {"latency_median_ms": "latency_iqr_ms", "fwd_bwd_ms": "iqr_ms"}  # the spread when q25/q75 are absent
SAME = "same (within noise or threshold)"
FAILING = ("regression", "missing in new", "no time in new")  # verdicts (prefixes) that fail the comparison


def _read_csv(path: Path, arg: str) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{arg}: {str(path)!r} is empty, expected a CSV written by the benchmark") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        why = " ".join(str(exc).split())[:160]
        raise ValueError(f"{arg}: {str(path)!r} is not a readable CSV ({type(exc).__name__}: {why})") from None
    if df.empty:
        raise ValueError(f"{arg}: {str(path)!r} has no rows (a header only), expected a benchmark run's rows")
    return df


def _times(df: pd.DataFrame, col: str, path: Path, arg: str) -> pd.Series:
    """Column ``col`` as floats (NaN where it is absent or empty, and where it is not finite); a non-numeric cell
    is refused."""
    if col not in df:
        return pd.Series(np.nan, index=df.index)
    raw = df[col]
    num = pd.to_numeric(raw, errors="coerce")
    bad = raw.notna() & num.isna()
    if bad.any():
        rows = [int(i) + 2 for i in df.index[bad][:3]]  # line numbers in the file (the header is line 1)
        raise ValueError(f"{arg}: {str(path)!r} has non-numeric timings in column {col!r} (line(s) "
                         f"{', '.join(map(str, rows))}: {raw[bad].iloc[0]!r})")
    return num.astype(float).where(np.isfinite(num.astype(float)))


def load_run(path: str | Path, arg: str = "run") -> tuple[pd.DataFrame, dict]:
    """(rows keyed by ``case`` with median/q25/q75 ms, status and message, the run's machine/torch/commit).
    ``arg`` names the argument in error messages (``base``, ``new``).

    Raises:
        ValueError: ``path`` is not a file, is empty, is not a readable CSV, has neither the bench nor the quick
            benchmark's timing columns, or holds a non-numeric timing (the message starts with ``arg`` and names
            the file).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{arg}: {str(path)!r} is not a file (a CSV written by the benchmark)")
    df = _read_csv(path, arg)
    if BENCH_TIME[0] in df:
        keys = [k for k in BENCH_KEYS if k in df]
        if not keys:
            raise ValueError(f"{arg}: {str(path)!r} has {BENCH_TIME[0]!r} but none of the case columns {BENCH_KEYS}")
        case = df[keys].astype(str).agg(" ".join, axis=1)
        med, q25, q75 = BENCH_TIME
    elif {"case", QUICK_TIME[0]} <= set(df):
        case = df["case"].astype(str)
        med, q25, q75 = QUICK_TIME
    else:
        raise ValueError(f"{arg}: {str(path)!r} has neither the bench columns {BENCH_TIME} nor the quick benchmark's "
                         f"{('case', *QUICK_TIME)}")
    status = df["status"].fillna("ok").astype(str) if "status" in df else pd.Series("ok", index=df.index)
    message = df["message"].fillna("").astype(str) if "message" in df else pd.Series("", index=df.index)
    median, lo, hi, iqr = (_times(df, c, path, arg) for c in (med, q25, q75, IQR[med]))
    gap = lo.isna() | hi.isna()  # e.g. the quick benchmark's breakdown rows carry an IQR only: median ± IQR/2
    lo, hi = lo.where(~gap, median - iqr / 2), hi.where(~gap, median + iqr / 2)
    rows = pd.DataFrame({"case": case, "median_ms": median, "q25_ms": lo, "q75_ms": hi, "status": status,
                         "message": message})
    rows = rows.drop_duplicates("case", keep="last").set_index("case")
    env = {}
    env_file = Path(f"{path}.env.json")
    if env_file.is_file():
        try:
            env = json.loads(env_file.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            print(f"warning: {arg}: {str(env_file)!r} is unreadable; the run's machine is read from the CSV",
                  file=sys.stderr)
        env = env if isinstance(env, dict) else {}

    def col(c: str) -> str | None:
        return str(df[c].dropna().iloc[0]) if c in df and df[c].notna().any() else None

    machine = env.get("device_name") or col("cpu_model") or col("device_name") or "unknown"
    if env.get("cpu_model") and env.get("cpu_model") != machine:
        machine = f"{machine} / {env['cpu_model']}"
    meta = {"file": str(path), "machine": machine, "torch": env.get("torch") or col("torch") or "unknown",
            "commit": str(env.get("git_commit") or col("git_commit") or "unknown")[:10]}
    return rows, meta


def _timed(rows: pd.DataFrame) -> pd.Series:
    """Which cases have a time: status ok and a finite, positive median."""
    return rows["status"].eq("ok") & rows["median_ms"].gt(0)


def _no_time(rows: pd.DataFrame, case: str) -> str:
    r = rows.loc[case]
    if r["status"] != "ok":
        return f"{r['status']}: {r['message']}" if r["message"] else str(r["status"])
    return "median is NaN or not finite" if pd.isna(r["median_ms"]) else f"median {r['median_ms']:g} ms"


def compare(base: pd.DataFrame, new: pd.DataFrame, threshold: float = 0.05) -> pd.DataFrame:
    """Per case of either run: base and new median (ms), ratio new/base, a verdict and whether it fails the
    comparison (``fails``). Verdicts: regression, improvement or same for cases both runs timed (``… (no
    spread: threshold alone)`` where a side has no q25/q75); ``missing in new`` and ``no time in new (…)`` for
    cases the base timed and the new did not (these fail); ``not in base``, ``no time in base (…)`` and ``no time
    in either (…)`` (these do not)."""
    if not (isinstance(threshold, (int, float)) and 0 < threshold < 10 and math.isfinite(threshold)):
        raise ValueError(f"threshold: expected a positive fraction (0.05 = 5 %), got {threshold!r}")
    for frame in (base, new):  # frames from older callers: rows with a time only
        for c, default in (("status", "ok"), ("message", "")):
            if c not in frame:
                frame[c] = default
    tb, tn = _timed(base), _timed(new)
    both = base[tb].add_suffix("_base").join(new[tn].add_suffix("_new"), how="inner")
    ratio = both["median_ms_new"] / both["median_ms_base"]
    spread = both[["q25_ms_base", "q75_ms_base", "q25_ms_new", "q75_ms_new"]].notna().all(axis=1)
    slower = (ratio - 1 > threshold) & ((both["q25_ms_new"] > both["q75_ms_base"]) | ~spread)
    faster = (1 - ratio > threshold) & ((both["q75_ms_new"] < both["q25_ms_base"]) | ~spread)
    verdict = pd.Series(SAME, index=both.index, dtype=object)
    verdict[slower], verdict[faster] = "regression", "improvement"
    verdict[~spread] = verdict[~spread].map(lambda v: f"{v.split(' (')[0]} (no spread: threshold alone)")
    out = pd.DataFrame({"base_ms": both["median_ms_base"], "new_ms": both["median_ms_new"], "ratio": ratio,
                        "verdict": verdict})
    extra = []
    for case in base.index.union(new.index, sort=False):
        if case in out.index:
            continue
        in_b, in_n = case in base.index, case in new.index
        b_ms = base.loc[case, "median_ms"] if in_b and tb[case] else np.nan
        n_ms = new.loc[case, "median_ms"] if in_n and tn[case] else np.nan
        if in_b and tb[case]:
            why = "missing in new" if not in_n else f"no time in new ({_no_time(new, case)})"
        elif not in_b:
            why = "not in base (a new case)" if tn[case] else f"not in base; no time in new ({_no_time(new, case)})"
        elif in_n and tn[case]:
            why = f"no time in base ({_no_time(base, case)})"
        else:
            why = f"no time in either (base {_no_time(base, case)}" + (
                f"; new {_no_time(new, case)})" if in_n else "; missing in new)")
        extra.append({"case": case, "base_ms": b_ms, "new_ms": n_ms, "ratio": np.nan, "verdict": why})
    if extra:
        out = pd.concat([out, pd.DataFrame(extra).set_index("case")])
    out["fails"] = out["verdict"].map(lambda v: v.startswith(FAILING))
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench compare", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("base", type=Path, help="the earlier run's CSV")
    p.add_argument("new", type=Path, help="the later run's CSV")
    p.add_argument("--threshold", type=float, default=0.05, help="relative slow-down that counts (0.05 = 5 %%)")
    p.add_argument("--csv", type=Path, default=None, help="write the per-case comparison here")
    args = p.parse_args(argv)
    if args.csv is not None:  # before any work: a directory or an unwritable place is refused here
        ensure_out_file(args.csv, "csv")
    (base, bmeta), (new, nmeta) = load_run(args.base, "base"), load_run(args.new, "new")
    table = compare(base, new, args.threshold)
    for side, m in (("base", bmeta), ("new ", nmeta)):
        print(f"{side}: {m['file']} — machine {m['machine']}, torch {m['torch']}, commit {m['commit']}")
    if bmeta["machine"] != nmeta["machine"]:
        print("warning: the two runs come from different machines: ratios compare machines, not commits",
              file=sys.stderr)
    if not table["ratio"].notna().any():
        raise ValueError("new: no case in common with base that both runs timed (different variants, shapes or "
                         "modes, or no time on either side)")
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_colwidth", 120):
        print(table.drop(columns="fails").to_string(float_format=lambda v: f"{v:.3f}"))
    if args.csv:
        atomic_write_csv(table.reset_index(), args.csv)
    regressions = table["verdict"].str.startswith("regression")
    lost = table["fails"] & ~regressions
    for case in table.index[lost]:
        print(f"error: {case}: {table.loc[case, 'verdict']} (a case the base run timed)", file=sys.stderr)
    compared = int(table["ratio"].notna().sum())
    print(f"{int(regressions.sum())} regression(s) beyond {100 * args.threshold:g} % and the runs' IQR; "
          f"{int(table['verdict'].str.startswith('improvement').sum())} improvement(s); {compared} cases compared; "
          f"{int(lost.sum())} case(s) of the base run not compared")
    return 1 if table["fails"].any() else 0


if __name__ == "__main__":
    sys.exit(main())
