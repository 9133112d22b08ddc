"""Table 7 (App. D.3): complexity of MHA vs DAMCHA, measured scaling, and parameter counts under readings of P.

1. The reconstructed complexity table (docs/variants.md §8) as formulas and as MAC numbers at chosen sizes, per
   layer, for MHA, DAMCHA without sharing and DAMCHA with stack-wise sharing, non-causal and causal.
2. Measured scaling of single attention layers (every registered variant): forward FLOPs (analytic and
   FlopCounterMode), forward latency (median) and the peak memory of one forward+backward step, swept over T and
   over D; log-log slopes fitted with ``numpy.polyfit`` and plotted.
3. Parameter counts at GPT-2 scale (N=12, d=768, w=1536, P=9) under the three readings of P (docs/experiments.md §7),
   attention-only and whole model, and at N=15 for the "≥ 25 % fewer" claim. The paper's parity claims are
   reported, not asserted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...envinfo import environment_record, resolve_device
from ...io import atomic_write_csv
from ...measure import (
    build_workload,
    count_flops,
    guarded,
    measure_memory_many,
    measure_model_latency,
    memory_item,
    warn_unstable,
    workload_spec,
)
from ...measure.complexity import FORMULAS, complexity_frame, params_frame
from ...plots import line_plot
from ...registry import get_attention_spec, is_attention
from ...report import markdown_table, write_tables
from ..common import ListAction, base_parser, experiment_main, open_store, positive_int, setup_threads
from ..launchers import run_whole
from ..protocol import add_launcher_arguments
from .timing import (
    RUN_CONTROL,
    Timing,
    add_measure_arguments,
    attention_rows,
    config_record,
    measure_cells,
    timing_for,
)

NAME = "table7_complexity"
CONSTANT_DOMINATED = 1.5  # a memory fit whose max/min over the sweep is below this measures constants, not scaling


@dataclass(frozen=True)
class Preset:
    """The scaling sweep: T over ``seq_lens`` at ``d_model``, D over ``d_models`` at ``seq_len``."""

    seq_lens: tuple[int, ...]
    d_model: int
    d_models: tuple[int, ...]
    seq_len: int
    n_heads: int
    batch: int


PRESETS = {
    "smoke": Preset(seq_lens=(128, 256, 512, 1024), d_model=64, d_models=(16, 32, 64, 128, 256), seq_len=256,
                    n_heads=4, batch=1),
    "paper": Preset(seq_lens=(128, 256, 512, 1024, 2048, 4096), d_model=512, d_models=(128, 256, 512, 1024),
                    seq_len=1024, n_heads=8, batch=1),
}


# ---- 2. measured scaling ---------------------------------------------------------------------------------------------
def scaling_rows(spec: dict, device: torch.device, timing: Timing, servers) -> list[dict]:
    rows = []

    def flops_latency():
        wl = build_workload(spec, device)
        rep = count_flops(wl.model, wl.inputs, spec["batch"], spec["seq_len"], counters=("flop_counter",))
        lat = measure_model_latency(wl, "forward", device, **timing.kwargs())
        warn_unstable(f"{spec['attention']} T={spec['seq_len']} D={spec['d_model']} fwd", lat)
        return {"analytic": rep.analytic, "counter": rep.flop_counter, "lat": lat}

    res = guarded(flops_latency, device)
    if res["status"] == "ok":
        rows += [{"metric": "fwd_gflops_analytic", "value": res["analytic"] / 1e9, "unit": "GFLOP"},
                 {"metric": "flop_counter_gflops", "value": res["counter"] / 1e9, "unit": "GFLOP"},
                 {"metric": "latency_fwd_median_ms", "value": res["lat"].median_ms, "unit": "ms",
                  **res["lat"].guard_fields()},
                 {"metric": "latency_fwd_iqr_ms", "value": res["lat"].iqr_ms, "unit": "ms",
                  **res["lat"].guard_fields()}]
    else:
        rows.append({"metric": "latency_fwd_median_ms", "value": float("nan"), "unit": "ms", **res})
    mem = measure_memory_many([memory_item(spec, "fwd_bwd", threads=torch.get_num_threads())], device,
                              servers=servers)[0]
    key = "peak_alloc_mib" if device.type == "cuda" else "peak_rss_mib"
    rows.append({"metric": f"peak_fwd_bwd_{key[5:]}", "value": mem.get(key, float("nan")), "unit": "MiB",
                 "status": mem["status"], "message": mem["message"]})
    return [{"status": "ok", "message": "", **r} for r in rows]


FITTED = {"fwd_gflops_analytic": "FLOPs (analytic)", "flop_counter_gflops": "FLOPs (FlopCounter)",
          "latency_fwd_median_ms": "time", "peak_fwd_bwd_alloc_mib": "memory", "peak_fwd_bwd_rss_mib": "memory"}


def fit_slopes(df: pd.DataFrame, x: str) -> pd.DataFrame:
    """log-log slope of each metric vs ``x`` per (variant, flavour, causal); positive values only, ≥ 2 points;
    ``span``: max/min of the fitted values (a memory span near 1 means constant terms dominate the fit)."""
    out = []
    ok = df[(df["status"] == "ok") & (df["value"] > 0) & df["metric"].isin(list(FITTED))]
    for key, g in ok.groupby(["variant", "flavour", "causal", "metric"]):
        pts = g.groupby(x)["value"].mean()
        if len(pts) >= 2:
            slope = float(np.polyfit(np.log(pts.index.to_numpy(float)), np.log(pts.to_numpy(float)), 1)[0])
            out.append(dict(zip(["variant", "flavour", "causal", "metric"], key), slope=slope, points=len(pts),
                            span=float(pts.max() / pts.min())))
    return pd.DataFrame(out)


def slopes_wide(t_df: pd.DataFrame, d_df: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, flavour, causal): the fitted exponents; a memory exponent whose values span less than
    CONSTANT_DOMINATED over the sweep is listed in ``constant-dominated`` instead of being read as a scaling law."""
    parts = []
    for frame, x in ((t_df, "seq_len"), (d_df, "d_model")):
        s = fit_slopes(frame, x) if not frame.empty else pd.DataFrame()
        if not s.empty:
            s["column"] = s["metric"].map(FITTED) + " ~ " + ("T" if x == "seq_len" else "D") + "^"
            parts.append(s)
    if not parts:
        return pd.DataFrame()
    s = pd.concat(parts)
    keys = ["variant", "flavour", "causal"]
    wide = s.pivot_table(index=keys, columns="column", values="slope").reset_index()
    flat = s[(s["metric"].map(FITTED) == "memory") & (s["span"] < CONSTANT_DOMINATED)]
    notes = flat.groupby(keys).apply(
        lambda g: "; ".join(f"{c}: max/min {v:.2f}" for c, v in zip(g["column"].str.rstrip("^"), g["span"])),
        include_groups=False)
    wide["constant-dominated"] = [notes.get(tuple(r[k] for k in keys), "") for _, r in wide.iterrows()]
    return wide


AXIS = {"seq_len": "sequence length T (tokens, log₂)", "d_model": "model width D (log₂)"}
PLOTTED = {"fwd_gflops_analytic": ("forward GFLOP (analytic)", "forward GFLOP (analytic), log"),
           "latency_fwd_median_ms": ("forward latency", "forward latency, median (ms), log"),
           "peak_fwd_bwd_alloc_mib": ("peak fwd+bwd memory", "peak fwd+bwd memory (MiB, CUDA allocated), log"),
           "peak_fwd_bwd_rss_mib": ("peak fwd+bwd memory", "peak fwd+bwd memory (MiB, CPU RSS), log")}


def _first(frame: pd.DataFrame, col: str, default: str = "?") -> str:
    vals = frame[col].dropna().unique() if col in frame else []
    return str(vals[0]) if len(vals) else default


def scaling_plots(t_df: pd.DataFrame, d_df: pd.DataFrame, out: Path) -> list[Path]:
    """Log-log scaling plots, one per metric and sweep: one line per variant (its fixed colour; damcha_repo dashed,
    option rows dotted) as nested open markers, so coinciding series stay visible, with ∝ x¹ and ∝ x² reference
    slopes; non-causal and causal side by side. One measurement per point (the latency IQR is in the long CSV), so
    no error bars."""
    paths = []
    for frame, x in ((t_df, "seq_len"), (d_df, "d_model")):
        ok = frame[(frame["status"] == "ok") & (frame["value"] > 0)].copy() if not frame.empty else frame
        if ok.empty:
            continue
        ok["row"] = ok["variant"] + "/" + ok["flavour"]
        ok["masking"] = ok["causal"].map({True: "causal", False: "non-causal"})
        ok = ok.sort_values(["causal", "row"], kind="stable")
        sym = "T" if x == "seq_len" else "D"
        fixed = (f"D = {int(ok['d_model'].iloc[0])}" if x == "seq_len" else f"T = {int(ok['seq_len'].iloc[0])}")
        where = (f"{_first(ok, 'preset')} preset, {_first(ok, 'device')}, batch {_first(ok, 'batch')}, "
                 f"H = {_first(ok, 'n_heads')}, {fixed}")
        for metric, g in ok.groupby("metric"):
            if metric not in PLOTTED:
                continue
            what, ylabel = PLOTTED[metric]
            paths.append(line_plot(g, x, "value", "row", out / f"{NAME}_{metric}_vs_{x}.png",
                                   f"Table 7: {what} vs {sym}, single attention layer ({where})", ylabel,
                                   loglog=True, errorbar=None, xlabel=AXIS[x], panel="masking",
                                   ref_slopes={f"∝ {sym}¹": 1.0, f"∝ {sym}²": 2.0}, nested=True))
    return paths


def build_parser():
    p = base_parser(NAME, "Table 7: complexity formulas, measured scaling exponents and parameter counts.",
                    seeds=False)
    p.set_defaults(flavour="paper")
    p.add_argument("--causal", choices=("both", "true", "false"), default="both", help="masking of the sweep")
    p.add_argument("--seq-lens", action=ListAction, item=positive_int, default=None, help="override the T sweep")
    p.add_argument("--d-models", action=ListAction, item=positive_int, default=None, help="override the D sweep")
    add_measure_arguments(p)
    return add_launcher_arguments(p)


def check(args) -> None:
    """Every argument a run checks before any work (also by a dry run): the timing settings and the variants.

    Raises:
        ValueError: an unknown variant, a bad ``--extra`` row or timing setting (the message names the flag).
    """
    timing_for(args, resolve_device(args.device))
    attention_rows(args)


def run(args) -> int:
    check(args)
    device = resolve_device(args.device)
    setup_threads(args.threads)
    preset = PRESETS[args.preset]
    preset = replace(preset, **{k: tuple(v) for k, v in (("seq_lens", args.seq_lens), ("d_models", args.d_models))
                                if v})
    timing = timing_for(args, device)
    sweep = {**config_record(preset), **timing.kwargs()}
    causals = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    points = [(T, preset.d_model) for T in preset.seq_lens]
    points += [(preset.seq_len, D) for D in preset.d_models if (preset.seq_len, D) not in points]
    env = environment_record(device, preset=args.preset, sweep=sweep)
    # the T and D lists only pick cells (each cell has its own seq_len and d_model): runs with other lists share cells
    grid = {k: v for k, v in sweep.items() if k not in ("seq_lens", "d_models")}
    store = open_store(args, NAME, device, env, selection=("seq_lens", "d_models", "causal", "extra", *RUN_CONTROL),
                       sweep=grid)
    cells, row_of = [], {}
    for row in attention_rows(args):
        row_of[row.label] = row
        for causal in causals:
            if causal and not get_attention_spec(row.name).causal_ok:
                continue
            cells += [{**row.cell_fields(), "causal": causal, "seq_len": T, "d_model": D, "n_heads": preset.n_heads,
                       "batch": preset.batch, "preset": args.preset, "device": device.type} for T, D in points]

    def measure(cell, servers):
        row = row_of[cell["variant"]]
        spec = workload_spec(attention=row.name, options=row.module_options, causal=cell["causal"],
                             d_model=cell["d_model"], n_heads=cell["n_heads"], batch=cell["batch"],
                             seq_len=cell["seq_len"])
        return scaling_rows(spec, device, timing, servers)

    measure_cells(store, cells, measure, device, args.memory_workers, NAME, args.quiet)
    df = store.frame()  # every cell of this context, also those other runs on this --out measured
    t_df = df[df["d_model"] == sweep["d_model"]] if not df.empty else df
    d_df = df[df["seq_len"] == sweep["seq_len"]] if not df.empty else df
    wide = slopes_wide(t_df, d_df)
    if not wide.empty:  # the capability that explains the memory exponent in T (fused: ~T, kept logits: ~T²)
        name_of = dict(zip(df["variant"], df["attention"]))  # rows of earlier runs (plugins not loaded now) too
        wide.insert(3, "attention core", wide["variant"].map(
            lambda v: get_attention_spec(name_of[v]).core if is_attention(name_of[v]) else "n/a (not registered)"))
    out = Path(args.out)
    comp, params = complexity_frame(), params_frame()
    atomic_write_csv(comp, out / f"{NAME}_formulas_numbers.csv")
    atomic_write_csv(params, out / f"{NAME}_params.csv")
    write_tables(out, NAME, df, wide, store.environment(env, df), "Table 7: complexity",
                 report_notes(comp, params, {**sweep, **reported_grid(t_df, d_df)}))
    scaling_plots(t_df, d_df, out)
    if not args.quiet:
        print(markdown_table(params[(params["sharing"] == "shared")][["reading of P", "N", "G", "attention ratio",
                                                                       "whole-model ratio"]]))
        print(markdown_table(wide, floatfmt=".2f"))
        print(f"wrote {out / (NAME + '.md')}")
    return 0


def reported_grid(t_df: pd.DataFrame, d_df: pd.DataFrame) -> dict:
    """The T and D values the report holds (this run's and those of earlier runs in the same context)."""
    return {"seq_lens": sorted(int(v) for v in t_df["seq_len"].unique()) if not t_df.empty else [],
            "d_models": sorted(int(v) for v in d_df["d_model"].unique()) if not d_df.empty else []}


def report_notes(comp: pd.DataFrame, params: pd.DataFrame, sweep: dict) -> str:
    formulas = pd.DataFrame(FORMULAS, columns=["component", "MHA", "DAMCHA, no sharing", "DAMCHA, stack-wise sharing"])
    order = list(dict.fromkeys(comp["component"]))  # as built: projections first, totals and params last
    nums = comp.pivot_table(index=["size", "causal", "component"], columns="column", values="value").reset_index()
    nums["_k"] = nums["component"].map(order.index)
    sizes = comp.drop_duplicates("size").set_index("size")[["L", "D", "H", "N"]]
    nums = nums.join(sizes, on="size")
    nums = nums.sort_values(["size", "causal", "_k"])[["size", "L", "D", "H", "N", "causal", "component",
                                                       *dict.fromkeys(comp["column"])]]
    cols = ["reading of P", "N", "sharing", "G", "MHA attention", "DAMCHA attention", "attention ratio",
            "attention reduction %", "MHA whole model", "DAMCHA whole model", "whole-model ratio"]
    return "\n".join([
        "## Complexity (docs/variants.md §8), MACs per layer for one sequence of length L", "",
        markdown_table(formulas), "G_c: MACs of one generator call (fused RowSum: the last layer runs D²/H outputs); "
        "G: generator parameters.", "",
        "### Numbers (MACs per layer; attention params per stack): computed from these formulas, not measured", "",
        "L: sequence length, D: width, H: heads, N: layers of each size below.", "",
        markdown_table(nums, floatfmt=".4g"),
        "## Parameter counts at GPT-2 scale (d=768, w=1536, P=9) under the readings of P (docs/experiments.md §7)", "",
        "Claims (reported, not asserted): (A) parity with MHA at N=12; (B) ≈25 % fewer attention parameters for "
        "N ≥ 15. Whole model = GPT-2 small (vocab 50257, context 1024, tied head, 4d MLP).", "",
        markdown_table(params[params["sharing"] == "shared"][cols], floatfmt=".4f"),
        "Unshared generators (N·G) are in table7_complexity_params.csv.", "",
        f"## Measured scaling exponents (log-log polyfit): single attention layer, batch {sweep['batch']}, "
        f"H={sweep['n_heads']}; T sweep {list(sweep['seq_lens'])} at D={sweep['d_model']}, D sweep "
        f"{list(sweep['d_models'])} at T={sweep['seq_len']}. FLOPs: forward (analytic, FlopCounterMode); time: "
        "forward median; memory: peak of one forward+backward step (CUDA allocated / CPU RSS of a fresh process); "
        "attention core: the registry's capability flags (fused: SDPA keeps no [B,H,T,S] tensor, so memory can grow "
        "~T; full logits / explicit: the [B,H,T,S] weights are kept, ~T²). A memory exponent whose values span less "
        f"than ×{CONSTANT_DOMINATED} over its sweep (column `constant-dominated`) is dominated by constant terms "
        "(parameters, allocator, the process) rather than by the activations, so it is no scaling law. "
        "At smoke sizes on a CPU, per-call overhead dominates the forward time, so the time exponents are not "
        "asymptotic; read them from `--preset paper` on a GPU.",
    ])


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run_whole(build_parser().parse_args(argv), NAME, run, check)  # one machine: a cluster job runs it whole
