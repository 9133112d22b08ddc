"""Tables, figures and verdicts of the synthetic sweeps (Appendix I, Figures 12–13).

Gains over MHA are paired by seed: regression (MSE_MHA − MSE_v)/MSE_MHA in %, classification accuracy difference in
points, each with a 95 % Student-t interval across seeds. Calibration beside every number: the trivial predictor
(the training mean; the majority class) and the oracle (the noise floor; the observer who knows every rotation),
with R² = 1 − MSE/Var(y) and normalised accuracy (acc − chance)/(oracle − chance). The verdicts on the paper's
claims come from ``attention_zoo.claims`` on this store's rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_lines, verdict_markdown
from ...claims.stats import seed_interval, slope, t_interval
from ...io import atomic_write_csv
from ...results import ResultStore

NAME = "synthetic"
REFERENCE = "mha"
PAPER_METHOD = "damcha"
PAPER_GAIN = {0.2: -1.7, 1.0: 4.8}  # Fig. 12: DAMCHA's relative MSE gain over MHA, % [Q]
METRIC = {"regression": "test_mse", "classification": "test_acc"}
_t_band = report.t_band

__all__ = ["METRIC", "NAME", "paired_gains", "print_summary", "summarize", "t_interval", "write_report"]


# ---- statistics ---------------------------------------------------------------------------------------------
def _setting(df: pd.DataFrame) -> pd.Series:
    return df["lam"].where(df["task"] == "regression", df["d_e"]).astype(float)


def paired_gains(df: pd.DataFrame, suffix: str = "", extra_keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """Per seed, every arm vs MHA on the same data: regression (MSE_MHA − MSE_v)/MSE_MHA in %, classification
    (acc_v − acc_MHA) in points. ``suffix`` "@budget" pairs the budget rows (key ``budget``)."""
    wanted = [m + suffix for m in METRIC.values()]
    ok = df[(df["status"] == "ok") & df["metric"].isin(wanted)].copy()
    if ok.empty:
        return pd.DataFrame()
    ok["setting"] = _setting(ok)
    keys = ["task", "setting", "seed", *extra_keys]
    ref = ok[(ok["variant"] == REFERENCE) & (ok["flavor"] == "paper")][keys + ["value"]].rename(
        columns={"value": "ref"})
    pair = ok[ok["variant"] != REFERENCE].merge(ref, on=keys)
    if pair.empty:
        return pd.DataFrame()
    reg = pair["task"] == "regression"
    pair["gain"] = np.where(reg, 100 * (pair["ref"] - pair["value"]) / pair["ref"], 100 * (pair["value"] - pair["ref"]))
    pair["unit"] = np.where(reg, "% MSE reduction", "accuracy points")
    pair["label"] = pair["variant"] + "/" + pair["flavor"]
    return pair[keys + ["variant", "flavor", "label", "gain", "unit"]]


def summarize(df: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """mean, 95 % t-interval and n over seeds for each group."""
    rows = []
    for key, g in df.groupby(by, sort=True):
        mean, lo, hi = t_interval(g[value])
        rows.append({**dict(zip(by, key)), "mean": mean, "ci95_low": lo, "ci95_high": hi, "n_seeds": len(g)})
    return pd.DataFrame(rows)


def _metric(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    m = df[(df["status"] == "ok") & (df["metric"] == metric)].copy()
    if not m.empty:
        m["setting"] = _setting(m)
        m["label"] = m["variant"] + "/" + m["flavor"]
    return m


def _ci_text(g: pd.Series, fmt: str) -> str:
    """mean [95 % t-interval] from 5 seeds, mean (range of the seeds) below: the verdicts' rule."""
    mean, lo, hi, label = seed_interval(g)
    if math.isnan(mean):
        return "–"
    if not math.isfinite(lo):
        return f"{mean:{fmt}} (n={g.notna().sum()})"
    if label.startswith("range"):
        return f"{mean:{fmt}} ({label} [{lo:{fmt}}, {hi:{fmt}}])"
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}] (n={g.notna().sum()})"


def ci_wide(df: pd.DataFrame, value: str, col_name: str, fmt: str) -> pd.DataFrame:
    """Rows arm, columns setting: "mean [95 % CI] (n)"."""
    if df.empty:
        return pd.DataFrame()
    wide = df.groupby(["label", "setting"])[value].apply(lambda g: _ci_text(g, fmt)).unstack("setting")
    wide.columns = [f"{col_name}={c:g}" for c in wide.columns]
    order = plots.sort_labels(wide.index)
    return wide.loc[order].reset_index().rename(columns={"label": "arm"})


def calibration(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and setting: the trivial predictor's and the oracle's scores (means over seeds)."""
    rows = []
    for task, metrics in (("regression", ("trivial_mse", "oracle_mse")),
                          ("classification", ("chance_acc", "oracle_test_acc"))):
        for metric in metrics:
            m = _metric(df[df["task"] == task], metric)
            if not m.empty:
                m = m.drop_duplicates(["setting", "seed"])
                rows += [{"task": task, "setting": s, "metric": metric, "mean": g["value"].mean(), "n": len(g)}
                         for s, g in m.groupby("setting")]
    return pd.DataFrame(rows)


# ---- report -------------------------------------------------------------------------------------------------
def write_report(out: Path, store: ResultStore, env: dict, tag: str) -> dict:
    """Tables and figures of every cell of this context (the whole store for it, whoever ran which cells)."""
    df = store.frame()
    if df.empty:
        return {"verdicts": [], "comparison": pd.DataFrame()}
    df = df[df["config"] == tag].copy()
    if "phase" in df:  # a tuned preset: verdicts at each arm's tuned setting (the grid is reported by the sweep)
        df = df[df["phase"] == "tuned"].copy()
    df["label"] = df["variant"] + "/" + df["flavor"]
    preset = str(env.get("preset") or tag.split("/")[0])
    gains = paired_gains(df)
    verdicts = frame_verdicts(NAME, preset, df, store.path, store.context_id)
    summary = summarize(gains, ["task", "setting", "variant", "flavor", "unit"], "gain") if not gains.empty else gains
    atomic_write_csv(summary, out / f"{NAME}_gains.csv")
    comp = paper_comparison(gains)
    seeds, cpu = df["seed"].nunique(), _metric(df, "train_cpu_s")["value"].sum()
    per_cell = cpu / max(1, len(_metric(df, "train_cpu_s")))
    paths = sorted(set(df["path"].dropna())) if "path" in df else []
    head = (f"Preset `{preset}`, configuration `{tag}` (layers, sequence length, training sequences, maximum steps, "
            f"batch, lr, early stopping every × patience); {seeds} seeds per arm; device {env.get('device_name')} "
            f"({env.get('device')}); training {cpu:,.0f} CPU-s in all ({per_cell:.1f} s per cell); training path: "
            f"{', '.join(paths) or '–'}. Regression: test MSE on noisy targets (floor σ² "
            "= 0.01), R² = 1 − MSE/Var(y); classification: accuracy over 6 balanced classes, normalised "
            "(acc − chance)/(oracle − chance). Gains are paired by seed against MHA with 95 % Student-t intervals. "
            "Generators: attention_zoo/data/synthetic.py (the paper gives none); controls: docs/claims.md.")
    notes = [head, "## Verdicts on the paper's claims (Figures 12–13)", "", verdict_markdown(verdicts)]
    notes += _section_tables(df, gains)
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        notes += ["Non-ok cells: " + "; ".join(f"{r.task}/{r.label}/seed {r.seed}: {r.status} {r.message}"
                                               for r in bad.drop_duplicates(['task', 'label', 'seed']).itertuples())]
    wide = ci_wide(_metric(df, "test_mse"), "value", "λ", ".4f")
    report.write_tables(out, NAME, df, wide, store.environment(env, df), "Appendix I, Figures 12–13: synthetic sweeps",
                        "\n\n".join(notes), comparison=comp, main_table=False)
    _figures(out, df, gains, preset, seeds, env)
    return {"verdicts": verdicts, "comparison": comp}


def _section_tables(df: pd.DataFrame, gains: pd.DataFrame) -> list[str]:
    out = []
    cal = calibration(df)
    for task, name, metric, extra, xcol in (("regression", "Figure 12: regression", "test_mse", "test_r2", "λ"),
                                            ("classification", "Figure 13: classification", "test_acc",
                                             "test_acc_norm", "d_e")):
        sub = df[df["task"] == task]
        if sub.empty:
            continue
        g = gains[gains["task"] == task] if not gains.empty else gains
        unit = "% MSE reduction" if task == "regression" else "accuracy points"
        out += [f"## {name}", "", f"### Gain over MHA ({unit}), seed-paired, mean [95 % CI] (n)", "",
                report.markdown_table(ci_wide(g, "gain", xcol, "+.2f"))]
        out += [f"### {metric} (mean [95 % CI] (n))", "", report.markdown_table(ci_wide(_metric(sub, metric),
                                                                                           "value", xcol, ".4f"))]
        out += [f"### {extra} (mean [95 % CI] (n))", "", report.markdown_table(ci_wide(_metric(sub, extra), "value",
                                                                                          xcol, ".3f"))]
        if task == "regression":
            out += _slope_section(sub)
        c = cal[cal["task"] == task] if not cal.empty else cal
        if not c.empty:
            c = c.pivot_table(index="metric", columns="setting", values="mean").reset_index()
            c.columns = [str(x) if x == "metric" else f"{xcol}={x:g}" for x in c.columns]
            out += ["### Calibration: the trivial predictor and the oracle (means over seeds)", "",
                    report.markdown_table(c)]
        bud = paired_gains(sub, "@budget", ("budget",))
        if not bud.empty:
            bud = bud.assign(label=bud["label"] + f" @{xcol}=" + bud["setting"].map("{:g}".format))
            bud["setting"] = bud["budget"]
            out += [f"### Gain over MHA at fractions of the maximum steps ({unit}; the best validation checkpoint "
                    "within each budget)", "", report.markdown_table(ci_wide(bud, "gain", "budget", "+.2f"))]
    conv = convergence(df)
    if not conv.empty:
        out += ["## Convergence: how much the validation loss still fell in the last quarter of training", "",
                "Per seed: (best validation loss up to 3/4 of the steps run − best validation loss overall) / the "
                "former, in %; median and maximum over seeds and settings. Below about 1 % the run sits on its "
                "plateau; patience-stopped seeds count as converged.", "", report.markdown_table(conv)]
    prec = precision(gains)
    if not prec.empty:
        out += [f"## Precision of the paired gains (target: 95 % half-width ≤ {PRECISION_TARGET:g}, in the gain's "
                "unit)", "", "DAMCHA vs MHA/paper at the paper's quoted λ and at every d_e. The seeds needed are "
                "those that would bring the half-width to the target at the observed SD of the paired gains.", "",
                report.markdown_table(prec)]
    out += ["## Parameters, training FLOPs and cost per arm (means over cells)", "", report.markdown_table(_costs(df))]
    return out


def _slope_section(sub: pd.DataFrame) -> list[str]:
    """Every arm's own slope of its test MSE over λ (per seed, least squares; 95 % t-interval): whether the λ axis
    makes the task harder for it. The separate-towers control (``mha_sep``) must rise for the λ claims to decide."""
    ok = sub[(sub["metric"] == "test_mse") & (sub["status"] == "ok")] if "status" in sub else sub
    ok = ok.assign(label=ok["variant"] + "/" + ok["flavor"])
    rows = []
    for label, g in ok.groupby("label"):
        per = g.groupby(["seed", "lam"])["value"].mean().reset_index()
        slopes = [slope(s["lam"], s["value"]) for _, s in per.groupby("seed") if s["lam"].nunique() > 1]
        if slopes:
            mean, lo, hi, how = seed_interval(slopes)
            rows.append({"arm": label, "slope of test MSE per unit λ": f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}] ({how})",
                         "n": len(slopes)})
    if not rows:
        return []
    return ["### Each arm's test MSE against λ (slope per unit λ; > 0: λ makes the task harder for the arm)", "",
            report.markdown_table(pd.DataFrame(rows))]


def convergence(df: pd.DataFrame) -> pd.DataFrame:
    """Per arm and task: the relative fall of the best validation loss over the last quarter of each seed's steps."""
    curves = df[(df["metric"] == "val_loss@step") & (df["status"] == "ok")]
    if curves.empty or curves["step"].nunique() < 4:
        return pd.DataFrame()
    steps = _metric(df, "steps_run")[["task", "setting", "label", "seed", "value"]].rename(columns={"value": "ran"})
    c = curves.assign(setting=_setting(curves)).merge(steps, on=["task", "setting", "label", "seed"])
    rows = []
    for (task, label), g in c.groupby(["task", "label"], sort=False):
        falls = []
        for _, s in g.groupby(["setting", "seed"]):
            early = s.loc[s["step"] <= 0.75 * s["ran"].iloc[0], "value"]
            if len(early):
                falls.append(100 * (early.min() - s["value"].min()) / early.min())
        if falls:
            rows.append({"task": task, "arm": label, "median fall (%)": float(np.median(falls)),
                         "max fall (%)": float(np.max(falls)), "seeds × settings": len(falls)})
    return pd.DataFrame(rows)


PRECISION_TARGET = 2.0  # percentage points (regression: % of MHA's MSE; classification: accuracy points)


def seeds_for_half_width(sd: float, target: float, confidence: float = 0.95, n_max: int = 100_000) -> int:
    """The smallest n ≥ 2 with t_{(1+c)/2, n−1}·sd/√n ≤ target."""
    from scipy import stats

    if not math.isfinite(sd) or sd <= 0:
        return 2
    n = 2
    while n < n_max and stats.t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n) > target:
        n = n + 1 if n < 64 else int(n * 1.05) + 1
    return n


def precision(gains: pd.DataFrame) -> pd.DataFrame:
    """Half-width of the 95 % interval of DAMCHA's paired gain where the issue of precision is posed: the quoted λ
    (0.2, 1) and every d_e."""
    if gains.empty:
        return pd.DataFrame()
    mine = gains[(gains["variant"] == PAPER_METHOD) & (gains["flavor"] == "paper")]
    rows = []
    for (task, setting), g in mine.groupby(["task", "setting"]):
        if task == "regression" and not any(np.isclose(setting, lam) for lam in PAPER_GAIN):
            continue
        mean, lo, hi = t_interval(g["gain"])
        half, sd = (hi - lo) / 2, float(g["gain"].std(ddof=1)) if len(g) > 1 else math.nan
        rows.append({"comparison": f"{task}, {'λ' if task == 'regression' else 'd_e'} = {setting:g}",
                     "unit": g["unit"].iloc[0], "n": len(g), "gain": mean, "half-width": half, "SD": sd,
                     "meets target": "yes" if half <= PRECISION_TARGET else "no",
                     "seeds for the target": seeds_for_half_width(sd, PRECISION_TARGET)})
    return pd.DataFrame(rows)


def _costs(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    first = df.drop_duplicates(["task", "d_e", "label"])
    for (task, d_e, label), _ in first.groupby(["task", "d_e", "label"], sort=False):
        sub = df[(df["task"] == task) & (df["d_e"] == d_e) & (df["label"] == label)]

        def mean(metric, sub=sub):
            v = sub.loc[sub["metric"] == metric, "value"]
            return float(v.mean()) if len(v) else math.nan

        # ok rows carry the parameter counts; a cell that failed (an error row) has none
        p = sub.dropna(subset=["params"]).iloc[0] if "params" in sub and sub["params"].notna().any() else None
        rows.append({"task": task, "D": 4 * int(d_e), "arm": label,
                     "params (total)": int(p["params"]) if p is not None else None,
                     "params (attention)": int(p["attention_params"]) if p is not None else None,
                     "training GFLOP": mean("train_flops") / 1e9, "steps run": mean("steps_run"),
                     "CPU s per cell": mean("train_cpu_s")})
    out = pd.DataFrame(rows)
    return out.sort_values(["task", "D"], kind="stable") if not out.empty else out


def paper_comparison(gains: pd.DataFrame) -> pd.DataFrame:
    """paper | ours | delta for Fig. 12's two quoted gains (the paper's task with our generators)."""
    mine = gains[gains["variant"] == PAPER_METHOD] if not gains.empty else pd.DataFrame(columns=["task", "setting"])
    entries = []
    for lam, paper in PAPER_GAIN.items():
        sel = mine[(mine["task"] == "regression") & np.isclose(mine["setting"].astype(float), lam)]
        mean, lo, hi, label = seed_interval(sel["gain"]) if not sel.empty else (math.nan,) * 3 + ("",)
        entries.append({"what": f"Fig. 12: {PAPER_METHOD} vs {REFERENCE}/paper MSE gain at λ={lam:g} (%)",
                        "paper": paper, "ours": mean,
                        "note": f"{label} [{lo:.2f}, {hi:.2f}], {len(sel)} seeds" if len(sel) else "not run"})
    return report.comparison_frame(entries)


def print_summary(summary: dict) -> None:
    print(report.format_comparison(summary["comparison"], floatfmt=".2f"))
    for line in verdict_lines(summary["verdicts"]):
        print(line)


# ---- figures ------------------------------------------------------------------------------------------------
def _band(df: pd.DataFrame, value: str, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, g in df.groupby(by):
        mean, lo, hi = t_interval(g[value])
        rows.append({**dict(zip(by, key)), "mean": mean, "low": lo, "high": hi})
    return pd.DataFrame(rows)


def _figures(out: Path, df: pd.DataFrame, gains: pd.DataFrame, preset: str, seeds: int, env: dict) -> None:
    where = f"{preset} preset, n = {seeds} seeds, {env.get('device_name')}"
    note = {t: report.setting_note(df[df["task"] == t]) for t in ("regression", "classification")}
    r2, acc = _metric(df, "test_r2"), _metric(df, "test_acc")
    if not r2.empty:
        oracle = _metric(df, "oracle_mse").merge(_metric(df, "trivial_mse")[["setting", "seed", "value"]],
                                                 on=["setting", "seed"], suffixes=("", "_t"))
        floor = float((1 - oracle["value"] / oracle["value_t"]).mean()) if not oracle.empty else math.nan
        plots.interval_plot(_band(r2, "value", ["label", "setting"]), "setting", "label", out / "figure12_r2.png",
                            f"Fig. 12: synthetic regression, test R² ({where}; 95 % t-intervals)",
                            "test R² = 1 − MSE / Var(y) (dimensionless)", "λ (cross-subspace weight, dimensionless)",
                            zero=False, ref_lines={"oracle (noise floor)": floor, "trivial (training mean)": 0.0},
                            note=note["regression"])
    if not acc.empty:
        orc = _metric(df, "oracle_test_acc").drop_duplicates(["setting", "seed"]).assign(
            label="oracle (knows R; a reference, not a bound)")  # a learner can beat it: docs/synthetic.md
        chance = float(_metric(df, "chance_acc")["value"].mean())
        plots.interval_plot(_band(pd.concat([acc, orc]), "value", ["label", "setting"]), "setting", "label",
                            out / "figure13_accuracy.png",
                            f"Fig. 13: synthetic classification, test accuracy ({where}; 95 % t-intervals)",
                            "test accuracy (fraction)", "d_e (subspace width; D = 4·d_e)", zero=False,
                            ref_lines={"chance (majority class)": chance}, integer_x=True, note=note["classification"])
    if gains.empty:
        return
    for task, name, xlabel, ylabel, integer in (
            ("regression", "figure12_gain.png", "λ (cross-subspace weight, dimensionless)",
             "(MSE_MHA − MSE) / MSE_MHA (%)", False),
            ("classification", "figure13_gain.png", "d_e (subspace width; D = 4·d_e)",
             "accuracy − accuracy_MHA (percentage points)", True)):
        g = gains[gains["task"] == task]
        if g.empty:
            continue
        paper = {f"paper: {PAPER_METHOD}": PAPER_GAIN} if task == "regression" else None
        fig = "Fig. 12" if task == "regression" else "Fig. 13"
        plots.interval_plot(_band(g, "gain", ["label", "setting"]), "setting", "label", out / name,
                            f"{fig}: seed-paired gain over MHA/paper ({where}; 95 % t-intervals)", ylabel, xlabel,
                            paper=paper, integer_x=integer, zero="0 = MHA/paper (reference)", note=note[task])
    _learning_figures(out, df, where, note)


def _learning_figures(out: Path, df: pd.DataFrame, where: str, note: dict[str, str]) -> None:
    """Validation loss vs step (λ = 1 and d_e = 8) and the gain at budget fractions, when the preset records them."""
    curves = df[(df["metric"] == "val_loss@step") & (df["status"] == "ok")].copy()
    if not curves.empty and curves["step"].nunique() > 2:
        sel = curves[((curves["task"] == "regression") & np.isclose(curves["lam"].astype(float), 1.0))
                     | ((curves["task"] == "classification") & (curves["d_e"] == 8))].copy()
        if not sel.empty:
            sel["panel"] = np.where(sel["task"] == "regression", "regression, λ = 1 (MSE)",
                                    "classification, d_e = 8 (nats)")
            plots.line_plot(sel, "step", "value", "label", out / "synthetic_learning_loss.png",
                            f"Appendix I: validation loss during training ({where}; 95 % t-bands)",
                            "validation loss", xlabel="optimizer step", panel="panel",
                            note=report.setting_note(df, arms=("task", "variant", "flavor")))
    for task, metric_x, pick in (("regression", "λ", 1.0), ("classification", "d_e", 8)):
        bud = paired_gains(df[df["task"] == task], "@budget", ("budget",))
        if bud.empty or bud["budget"].nunique() < 2:
            continue
        bud = bud[np.isclose(bud["setting"].astype(float), float(pick))]
        if bud.empty:
            continue
        unit = "% MSE reduction" if task == "regression" else "accuracy points"
        plots.interval_plot(_band(bud, "gain", ["label", "budget"]), "budget", "label",
                            out / f"synthetic_budget_gain_{task}.png",
                            f"Appendix I: seed-paired gain over MHA vs training budget, {task} at {metric_x} = "
                            f"{pick:g} ({where}; 95 % t-intervals)",
                            f"gain over MHA ({unit})", "fraction of the maximum optimizer steps",
                            zero="0 = MHA/paper (reference)", note=note[task])
