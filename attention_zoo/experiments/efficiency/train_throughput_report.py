"""The training-throughput benchmark's report (``train_throughput``): the targets it is judged by, its markdown table
and its figure. Render-only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...measure.gemm import GEMM_N
from ...plots.style import variant_colour
from ...report import markdown_table
from .throughput_shapes import PRESET_WIDTH, SHAPES, STEP_PATHS


def target_lines(df: pd.DataFrame, task: str) -> list[str]:
    """The issue's targets that this table measures, each with its number (or "not measured")."""
    unit = SHAPES[task].unit
    ok = df[(df["status"] == "ok") & df["path"].isin(["one", "ensemble"])]

    def val(v, d, path, col):
        sel = ok[(ok["variant"] == v) & (ok["d_model"] == d) & (ok["path"] == path)]
        return float(sel[col].iloc[0]) if len(sel) and col in sel and pd.notna(sel[col].iloc[0]) else None

    lines = []
    for v in ("mha", "damcha"):
        for d in (32, 64):
            s = val(v, d, "ensemble", "speedup_vs_one")
            lines.append(f"- ensemble of {int(ok['seeds'].max()) if len(ok) else 0} vs one at a time, {v}, D {d}: "
                         + (f"{s:.2f}× (target ≥ 1.5×)" if s is not None else "not measured"))
    if task == "lm":
        g = val("mha", 128, "one", "gemm_fraction")
        lines.append("- MHA char-LM at D 128, one at a time: " + (f"{100 * g:.0f} % of the one-thread GEMM rate "
                                                                   "(target ≥ 55 %)" if g is not None else
                                                                   "not measured"))
        a, b = val("damcha", PRESET_WIDTH, "one", f"{unit}_per_cpu_s"), val("mha", PRESET_WIDTH, "one",
                                                                           f"{unit}_per_cpu_s")
        lines.append(f"- DAMCHA/MHA time per token at the Table 5 decide shape (D {PRESET_WIDTH}, one at a time): "
                     + (f"{b / a:.2f} (target ≤ 1.6; 1.99 in the Table 5 decide store)" if a and b else
                        "not measured"))
        sel = df[(df["status"] == "ok") & (df["path"] == "one (compiled)") & (df["d_model"] == PRESET_WIDTH)]
        tps = {r.variant: getattr(r, f"{unit}_per_cpu_s") for r in sel.itertuples()}
        if {"mha", "damcha"} <= set(tps):
            lines.append(f"- the same with both compiled (TrainConfig.compile): {tps['mha'] / tps['damcha']:.2f}")
    return lines


def to_markdown(df: pd.DataFrame, env: dict, task: str) -> str:
    unit = SHAPES[task].unit
    ok = df[df["status"] == "ok"].copy()
    step = ok[ok["path"].isin(STEP_PATHS)]
    cols = [c for c in ("variant", "d_model", "path", "ms_per_model_step", "q25_ms", "q75_ms", f"{unit}_per_cpu_s",
                        "gflops", "gemm_fraction", "speedup_vs_one", "compile_s", "message") if c in step]
    first = step.iloc[0] if len(step) else {}
    sh = SHAPES[task]
    what = ("Table 5's char-LM (2 layers, 4 heads, context 64, batch 16, DAMCHA hidden (128, 128), compact rank 4)"
            if task == "lm" else "Table 6's ViT (16² digits, patch 4, 2 layers, 4 heads, d_ff 2·D, batch 64, DAMCHA "
            "hidden (64, 64))")
    head = (f"# Training throughput of the stand-ins: {what}\n\nMachine: {env.get('device_name')} "
            f"({env.get('cores')} cores), torch {env.get('torch')}, one thread; fp32 GEMM "
            f"{env.get('gemm_gflops_1thread')} GFLOP/s on one thread (a {GEMM_N}² GEMM timed in the same rounds, "
            f"median; each row's share uses its task's rounds); 1-min load average {env.get('loadavg')} at the "
            f"end. CPU time per model-step: median and IQR over {int(first.get('rounds', 0))} interleaved rounds of "
            f"{int(first.get('steps', 0))} steps × {int(first.get('seeds', 0))} models; `{unit}_per_cpu_s`: "
            f"{'tokens' if unit == 'tok' else 'images'} per CPU-second ({sh.per_batch} per batch); GFLOP/s: analytic "
            "training FLOPs (3 × forward) per CPU-second, `gemm_fraction` its share of the one-thread GEMM rate; "
            "`one`: the models one at a time (engine.loop.train's step), `ensemble`: one grouped model "
            "(engine.grouped, the decide presets' `--ensemble`). Code: "
            "attention_zoo/experiments/efficiency/train_throughput.py.\n\n")
    md = head + "## Targets\n\n" + "\n".join(target_lines(df, task)) + "\n\n## Per arm and width\n\n"
    md += markdown_table(step[cols], floatfmt=".3g") + "\n"
    procs = ok[~ok["path"].isin(STEP_PATHS)]
    if len(procs):
        md += (f"\n## The machine's two cores ({unit} per wall-second, one model per process, D "
               f"{int(procs['d_model'].iloc[0])}, medians of {int(procs['rounds'].iloc[0])} interleaved rounds)\n\n")
        md += markdown_table(procs[["variant", "path", f"{unit}_per_wall_s"]], floatfmt=".4g") + "\n"
    bad = df[df["status"] != "ok"]
    md += "".join(f"\n- `{r.variant}` D {r.d_model} has no {r.path} row: {r.message}" for r in bad.itertuples())
    return md + "\n"


def plot(df: pd.DataFrame, tasks: list[str], path: Path):
    """One row per task: units per CPU-second against the width (one at a time, ensemble, compiled) per arm; the
    share of the GEMM rate; the machine's two cores (two processes vs two threads). Each arm in the house palette
    (``plots.style.variant_colour``). Returns the figure, saved to ``path``."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"font.size": 9}):
        fig = Figure(figsize=(14, 4.3 * len(tasks)))
        grid = fig.subplots(len(tasks), 3, squeeze=False)
        for task, axes in zip(tasks, grid):
            unit = SHAPES[task].unit
            ok = df[(df["status"] == "ok") & (df["task"] == task)]
            step, procs = ok[ok["path"].isin(STEP_PATHS)], ok[~ok["path"].isin(STEP_PATHS)]
            colors = {v: variant_colour(v) for v in dict.fromkeys(ok["variant"])}  # the house palette
            widths = sorted(step["d_model"].unique())
            for (v, kind), g in step.groupby(["variant", "path"], sort=False):
                g = g.sort_values("d_model")
                style = {"one": "-", "ensemble": "--"}.get(kind, ":")
                axes[0].plot(g["d_model"], g[f"{unit}_per_cpu_s"], style, marker="o", color=colors[v],
                             label=f"{v} ({kind})")
                axes[1].plot(g["d_model"], 100 * g["gemm_fraction"], style, marker="o", color=colors[v])
            axes[0].set(xscale="log", yscale="log", xlabel="d_model", ylabel=f"{unit} per CPU-second",
                        title=f"{task}: solid one at a time, dashed ensemble, dotted compiled")
            axes[1].set(xscale="log", xlabel="d_model", ylabel="% of the one-thread GEMM rate",
                        title=f"{task}: analytic training GFLOP/s vs GEMM")
            for ax in axes[:2]:
                ax.set_xticks(widths, [str(d) for d in widths])
                ax.minorticks_off()
            axes[0].legend(fontsize=6, ncol=2)
            if len(procs):
                labels = ["\n".join([r.variant, *r.path.split(" x ")]) for r in procs.itertuples()]  # narrow bars
                axes[2].bar(range(len(procs)), procs[f"{unit}_per_wall_s"],
                            color=[colors[v] for v in procs["variant"]])
                axes[2].set_xticks(range(len(procs)), labels, fontsize=6)
                axes[2].set(ylabel=f"{unit} per wall-second", title=f"{task}: the machine's two cores")
            else:
                axes[2].axis("off")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


