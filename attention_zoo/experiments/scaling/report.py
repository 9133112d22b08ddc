"""The scale ladder's report (render-only): the long CSV and a table of cells, the rungs, tuning and calibration,
the fits and the multiplier leaderboard, the gap trend, the verdicts, and two figures — test loss against training
compute per arm with its fit and seed band, and each arm's multiplier over MHA against compute with its interval."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ... import report
from ...claims import frame_verdicts, verdict_markdown
from ...io import atomic_write_csv
from ...plots import atomic_savefig
from ...plots.style import variant_colour
from ..tuning import calibration_lines, report_lines
from .fit import N_BOOT, REFERENCE, analyse, final_rows, points
from .presets import FINAL_SEEDS, PRESETS, tuning
from .rows import SUMMARY

NAME = "scaling"
CELL_KEYS = ("variant", "flavor", "d_model", "n_layers", "seed", "phase", "lr", "weight_decay", "max_steps")
DCFORMER = (1.7, 2.0)  # DCFormer's quoted multiplier range (DC.compute)


def cells_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: its keys and summary columns (the long CSV carries both on every row)."""
    keys = [k for k in CELL_KEYS if k in df]
    cols = keys + [c for c in SUMMARY if c in df] + [c for c in ("status", "ensemble", "run_id") if c in df]
    return df[cols].drop_duplicates(keys).sort_values(keys).reset_index(drop=True)


def _fmt(v: float) -> str:
    return "∞" if isinstance(v, float) and math.isinf(v) else f"{v:.3g}"


def leaderboard(mult: pd.DataFrame, reading: str) -> pd.DataFrame:
    """Arm × rung: "multiplier [low, high]" (``*``: read off MHA's curve outside the compute MHA was measured at)."""
    part = mult[mult["reading"] == reading]
    if part.empty:
        return pd.DataFrame()
    text = part.assign(cell=[f"{_fmt(r.multiplier)} [{_fmt(r.low)}, {_fmt(r.high)}]{'*' if r.extrapolated else ''}"
                             for r in part.itertuples()],
                       rung=[f"D{d}×{n}" for d, n in zip(part["d_model"], part["n_layers"])])
    order = list(dict.fromkeys(text.sort_values(["d_model", "n_layers"])["rung"]))
    wide = text.pivot(index="arm", columns="rung", values="cell")
    return wide[[c for c in order if c in wide]].reset_index()


def write_report(out: Path, store, env: dict, preset_name: str, n_boot: int = N_BOOT) -> list:
    df = store.frame()
    env = store.environment(env, df)
    if df.empty:
        return []
    preset = PRESETS[preset_name]
    records = store.records()
    tuned = []
    for rung in preset.rungs:
        mine = [r for r in records if (r["cell"].get("d_model"), r["cell"].get("n_layers")) == (rung.d_model,
                                                                                                 rung.n_layers)]
        if mine:
            lines = report_lines(tuning(preset_name, rung, FINAL_SEEDS[preset_name]), mine,
                                 lambda c: f"{c['variant']}/{c['flavor']}")
            tuned += report.table_blocks([lines[0].replace("## Tuning", f"### Tuning at {rung.name}")] + lines[1:])
    final = final_rows(df)
    head = final[final["eval_set"].fillna(final["dataset"]) == final["dataset"]] if "eval_set" in final else final
    pts = points(df)
    fits = analyse(df, n_boot)
    verdicts = frame_verdicts(NAME, preset_name, head, store.path, store.context_id) if not head.empty else []
    notes = [f"Preset `{preset_name}`: the character-LM stand-in of Table 5 at every rung (docstring of "
             "attention_zoo/experiments/scaling/ladder.py). Test loss in nats at the best validation checkpoint; "
             "training FLOPs = 3 × analytic forward FLOPs per batch × steps to the best checkpoint (output layer and "
             "every variant's extra work included); CPU-seconds likewise up to the best checkpoint. Multipliers: "
             f"C_MHA(L_arm) / C_arm read off MHA's fitted curve, 95 % percentile intervals from {n_boot} "
             "seed-stratified bootstrap resamples (both curves refitted); * = MHA's curve read outside the compute "
             "MHA was measured at (an extrapolation)."]
    if not pts.empty:
        notes += ["## Rungs and arms (final seeds: mean test loss, compute, how the cells stopped)", "",
                  report.markdown_table(pts, floatfmt=".4g")]
    for reading in ("FLOPs", "CPU-s"):
        board = leaderboard(fits["multipliers"], reading) if not fits["multipliers"].empty else pd.DataFrame()
        if not board.empty:
            notes += [f"## Compute multiplier over MHA ({reading} reading): multiplier [95 % interval] per rung", "",
                      report.markdown_table(board)]
    if not fits["curves"].empty:
        notes += ["## Fitted curves L(C) = E + A·C^(−α) (form loglog: E = 0)", "",
                  report.markdown_table(fits["curves"], floatfmt=".4g")]
    if not fits["gaps"].empty:
        notes += ["## Gap to MHA at equal compute: slope per decade (nats) [95 % interval], where the line reaches 0",
                  "", report.markdown_table(fits["gaps"], floatfmt=".4g")]
    notes += [*tuned, *report.table_blocks(calibration_lines(head, "test_loss", "trivial_loss", True,
                                                               "a unigram of the training text",
                                                               ("variant", "d_model"))),
              "## Verdicts", "", verdict_markdown(verdicts) if verdicts else "_(no claims decided yet)_"]
    cells = cells_frame(df)
    atomic_write_csv(cells, Path(out) / f"{NAME}_cells.csv")
    wide = pts if not pts.empty else pd.DataFrame({"note": ["no final cells yet"]})
    report.write_tables(out, NAME, df, wide, env, "The scale axis: compute multipliers on the char-LM ladder",
                        "\n\n".join(notes), main_table=False)
    if not pts.empty:
        _figures(Path(out), head, fits, preset_name, env)
    return verdicts


def _log_x(ax) -> None:
    """A log x axis with ticks at 1, 2 and 5 of each decade (all eight minor labels of a short span overlap)."""
    from matplotlib.ticker import LogLocator

    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))


def _figures(out: Path, head: pd.DataFrame, fits: dict, preset: str, env: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = head[head["status"].fillna("ok") == "ok"]
    cells = ok.drop_duplicates(["variant", "d_model", "n_layers", "seed"])
    where = f"{preset}; {env.get('device_name')}"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, (col, unit) in zip(axes, (("train_flops", "FLOPs"), ("best_cpu_s", "CPU-s"))):
        curves = fits["curves"][fits["curves"]["reading"] == unit] if not fits["curves"].empty else pd.DataFrame()
        for arm, g in cells.groupby("variant", sort=False):
            g = g.dropna(subset=[col, "test_loss"])
            if g.empty:
                continue
            colour = variant_colour(arm)
            ax.scatter(g[col], g["test_loss"], s=8, color=colour, alpha=0.35)
            m = g.groupby(["d_model", "n_layers"]).agg(c=(col, "mean"), lo=("test_loss", "mean"),
                                                       sd=("test_loss", "std"), n=("test_loss", "count"))
            m = m.sort_values("c")
            half = 1.96 * m["sd"].fillna(0) / np.sqrt(m["n"])
            ax.fill_between(m["c"], m["lo"] - half, m["lo"] + half, color=colour, alpha=0.15, linewidth=0)
            ax.plot(m["c"], m["lo"], "o", color=colour, markersize=4, label=arm)
            fit = curves[curves["arm"] == arm] if not curves.empty else curves
            if not fit.empty:
                f = fit.iloc[0]
                xs = np.geomspace(m["c"].min() / 1.5, m["c"].max() * 1.5, 60)
                ax.plot(xs, f["E"] + f["A"] * xs ** (-f["alpha"]), color=colour, linewidth=1.2,
                        linestyle="-" if arm in (REFERENCE, "damcha", "dcmha") else "--")
        _log_x(ax)
        ax.set_xlabel(f"training compute to the best checkpoint ({unit}, log)")
        ax.set_ylabel("test loss (nats/char)")
        ax.set_title(f"test loss vs {unit}: seeds (dots), means with 95 % band, fits (lines)", fontsize=9)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle(f"Scale ladder ({where}): each arm's test loss against its training compute", fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, out / f"{NAME}_loss_vs_compute.png", dpi=120)
    plt.close(fig)
    mult = fits["multipliers"]
    if mult.empty:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    arms = [a for a in dict.fromkeys(mult["arm"]) if a != REFERENCE]
    for ax, unit in zip(axes, ("FLOPs", "CPU-s")):
        part = mult[mult["reading"] == unit]
        ax.axhspan(*DCFORMER, color="#029e73", alpha=0.12, linewidth=0, label="DCFormer's claim 1.7–2.0×")
        ax.axhline(1.0, color="#4d4d4d", linewidth=0.9, label="= MHA")
        finite = part[["multiplier", "high"]].replace(np.inf, np.nan)
        ceiling = float(np.nanmax(finite.to_numpy())) * 3 if finite.notna().any().any() else 10.0
        for i, arm in enumerate(arms):
            g = part[part["arm"] == arm].sort_values("compute")
            if g.empty:
                continue
            shift = 1 + 0.03 * (i - len(arms) / 2)  # arms side by side at a rung
            shown = g["multiplier"].replace(np.inf, ceiling)  # beyond MHA's fitted floor: drawn at the ceiling
            hi = g["high"].replace(np.inf, ceiling).fillna(ceiling)
            below = (shown - g["low"]).clip(lower=0).fillna(0)
            above = (hi - shown).clip(lower=0).fillna(0)
            colour = variant_colour(arm)
            ax.errorbar(g["compute"] * shift, shown, yerr=[below, above], fmt="o-", color=colour, markersize=4,
                        capsize=2, linewidth=1, label=arm)
            inf = np.isinf(g["multiplier"])
            ax.plot(g["compute"][inf] * shift, shown[inf], "^", color=colour, markersize=9, fillstyle="none")
        _log_x(ax)
        ax.set_yscale("log")
        ax.set_xlabel(f"the arm's training compute ({unit}, log)")
        ax.set_ylabel("multiplier over MHA (log)")
        ax.set_title(f"{unit} reading; bars: 95 % bootstrap intervals", fontsize=9)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle(f"Scale ladder ({where}): compute multiplier C_MHA(L_arm) / C_arm at each rung\n(> 1: the arm "
                 "reaches its loss with less compute than MHA; open triangle: below MHA's fitted floor, ∞; a bar "
                 "reaching the top: open above)", fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, out / f"{NAME}_multipliers.png", dpi=120)
    plt.close(fig)


__all__ = ["cells_frame", "leaderboard", "write_report"]
