"""Tables, figures and verdicts of Table 6 (ViT classification): accuracies with Wilson intervals per run, seed-paired
differences against MHA, and accuracy during training as a difference from MHA."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ... import plots, report
from ...claims import frame_verdicts, verdict_markdown
from ...claims.paired import delta_frame, delta_table, interval_heading
from ...claims.stats import wilson_interval
from ...io import read_jsonl
from ...results import ResultStore
from ..tuning import Tuning, calibration_lines, report_lines

NAME = "table6_vit"
PAPER_METHOD = "damcha"
PAPER = {100: {"top1": 70.93, "top5": 89.71}, 500: {"top1": 82.10, "top5": 96.23}}  # DAMCHA, % [Q]


def paper_comparison(df: pd.DataFrame, preset_name: str, dataset: str) -> pd.DataFrame:
    """paper | ours for DAMCHA's top-1/top-5; a stand-in run (another dataset or epoch count) gets no delta."""
    ok = df[(df["variant"] == PAPER_METHOD) & df["metric"].isin(["top1", "top5"]) & (df["status"] == "ok")]
    entries = []
    for (flavor, epochs, metric), ours in ok.groupby(["flavor", "epochs", "metric"])["value"].mean().items():
        ref = min(PAPER, key=lambda e: abs(e - epochs))
        same = preset_name == "paper" and ref == epochs
        where = f"ImageNet-1K @ {ref} ep" + ("" if same else f" (paper) · {dataset} @ {epochs} ep (ours)")
        note = "" if same else f"not comparable ({dataset} stand-in vs ImageNet-1K ViT-B/16)"
        entries.append({"what": f"{where}: {PAPER_METHOD}/{flavor} top-{metric[3:]} (%)",
                        "paper": PAPER[ref][metric], "ours": ours, "note": note})
    return report.comparison_frame(entries)


def wilson_table(acc: pd.DataFrame) -> pd.DataFrame:
    """Per arm and column: the accuracy of each seed's run as "p [Wilson 95 %]" over its n_eval images, pooled
    over seeds (the runs' correct counts added): inside [0, 100] by construction."""
    rows = {}
    for (v, f, col), g in acc.groupby(["variant", "flavor", "column"]):
        n = g["n_eval"].astype(float)
        k = (g["value"].astype(float) / 100 * n).round()
        p, lo, hi = wilson_interval(float(k.sum()), float(n.sum()))
        rows.setdefault((v, f), {})[col] = f"{100 * p:.2f} [{100 * lo:.2f}, {100 * hi:.2f}] ({len(g)} runs)"
    return pd.DataFrame([{"variant": v, "flavor": f, **c} for (v, f), c in rows.items()])


def _acc_curves(out: Path, store: ResultStore, run_dir_of, preset_name: str) -> pd.DataFrame:
    frames = []
    for rec in store.records():
        cell = rec["cell"]
        if cell["preset"] != preset_name or cell.get("phase", "tuned") != "tuned":  # tuned presets: final seeds
            continue
        for r in read_jsonl(run_dir_of(out, cell, store.context) / "metrics.jsonl"):
            if r.get("event") == "eval" and "loss" in r:
                frames.append({"epochs": cell["epochs"], "epoch": r["step"] / cell["steps_per_epoch"],
                               "variant": cell["variant"], "flavor": cell["flavor"], "seed": cell["seed"],
                               "value": r["loss"], "status": "ok"})
    return pd.DataFrame(frames)


def _rows(wide: pd.DataFrame, order: tuple[str, ...]) -> pd.DataFrame:
    """Drop the empty variant × flavour rows of a pivot; order rows as the paper (MHA, DCMHA, DAMCHA, others) and
    columns by epochs."""
    values = sorted((c for c in wide.columns if c not in ("variant", "flavor")), key=lambda c: (int(c.split()[0]), c))
    wide = wide[["variant", "flavor", *values]].dropna(how="all", subset=values)
    rank = {v: i for i, v in enumerate(order)}
    keys = sorted(wide.index, key=lambda i: (rank.get(wide.at[i, "variant"], len(rank)), wide.at[i, "variant"],
                                             wide.at[i, "flavor"]))
    return wide.loc[keys].reset_index(drop=True)


def _tuning_notes(df: pd.DataFrame, store: ResultStore, tuning: Tuning) -> list[str]:
    """A tuned preset's grid, its calibration against the majority class, and the secondary "shared" rows: every
    arm at the one setting used before tuning, seed-paired against MHA there, to show whether tuning changed it."""
    notes = report.table_blocks(report_lines(tuning, store.records(),
                                      lambda c: f"{c['variant']}/{c['flavor']} ({c['epochs']} ep)"))
    notes += report.table_blocks(calibration_lines(df[df["phase"] == "tuned"], "top1", "chance_top1", False,
                                            "the majority class"))
    shared = df[(df["phase"] == "shared") & df["metric"].isin(["top1", "top5"])]
    if not shared.empty:
        d = delta_frame(shared, ["metric"], {"variant": "mha", "flavor": "paper"}, relative=False)
        setting = f"lr {tuning.shared['lr']:g}, weight decay {tuning.shared['weight_decay']:g}"
        notes += [f"## Secondary: every arm at the shared setting ({setting}), seed-paired difference vs MHA "
                  "(accuracy points)", "", report.markdown_table(delta_table(d, ["metric"])) if not d.empty else "–"]
    return notes


def write_report(out: Path, store: ResultStore, env: dict, preset_name: str, run_dir_of, order: tuple[str, ...],
                 tuning: Tuning | None = None) -> tuple[pd.DataFrame, list]:
    """The report; with ``tuning`` (the decide preset) the tables are of the final seeds at each arm's tuned
    setting, after the grid, the calibration and the shared-setting rows."""
    df = store.frame()
    env = store.environment(env, df)
    df = df[df["preset"] == preset_name] if not df.empty else df
    if df.empty:
        return pd.DataFrame(), []
    tuned = []
    if tuning is not None and "phase" in df:
        tuned = _tuning_notes(df, store, tuning)
        df = df[df["phase"] == "tuned"].copy()
        if df.empty:
            print("\n".join(tuned))
            return pd.DataFrame(), []
    acc = df[df["metric"].isin(["top1", "top5"])]
    acc = acc.assign(column=acc["epochs"].astype(str) + " ep: top-" + acc["metric"].str[3:] + " (%)")
    wide = _rows(report.wide_table(acc, ["variant", "flavor"], ["column"]), order)
    eff = df[df["metric"].isin(["params", "attention_params", "images_per_s", "train_time_s"])]
    eff = _rows(report.wide_table(eff.assign(column=eff["epochs"].astype(str) + " ep: " + eff["metric"]),
                                  ["variant", "flavor"], ["column"]), order)
    eff = eff.astype({c: "Int64" for c in eff.columns if c.endswith("params")})
    cols = [c for c in wide.columns if c not in ("variant", "flavor")]
    dataset = df["dataset"].iloc[0]
    comp = paper_comparison(df, preset_name, dataset)
    verdicts = frame_verdicts(NAME, preset_name, df, store.path, store.context_id)
    seeds = sorted(int(s) for s in df["seed"].unique())
    n_eval = "/".join(str(n) for n in sorted({int(n) for n in acc["n_eval"].dropna()})) if "n_eval" in acc else "?"
    deltas = delta_frame(acc.assign(metric=acc["column"]), ["metric"], {"variant": "mha", "flavor": "paper"},
                         relative=False)
    listed = ", ".join(map(str, seeds))
    notes = [f"Preset `{preset_name}` ({dataset}); n = {len(seeds)} seeds per arm (seeds {listed}) in every table "
             "below:"
             f" top-1 / top-5 accuracy (%) of the final weights on {n_eval} validation images. The "
             "paper quotes DAMCHA only: 70.93 / 89.71 at 100 epochs, 82.10 / 96.23 at 500 (ImageNet-1K, ViT-B/16). "
             "Baselines run in the flavour shown. Presets and the training recipe: attention_zoo/experiments/"
             "vision/.", *tuned,
             "## Verdicts on the paper's claims (Table 6)", "", verdict_markdown(verdicts)]
    if not deltas.empty:
        notes += [f"## Seed-paired difference vs MHA/paper (accuracy points; {interval_heading(deltas)}; higher "
                  "is better)", "", report.markdown_table(delta_table(deltas, ["metric"]))]
    notes += ["## Accuracy pooled over seeds: % [Wilson 95 % interval] (runs)", "",
              report.markdown_table(wilson_table(acc[acc["status"] == "ok"])),
              "## Size and speed (means over seeds)\n\n" + report.markdown_table(eff, floatfmt=".1f")]
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        notes.append("Non-ok cells: " + "; ".join(f"{r.variant}/{r.flavor}/e{r.epochs}: {r.status} {r.message}"
                                                  for r in bad.drop_duplicates(["variant", "flavor", "epochs"])
                                                  .itertuples()))
    notes.append("## Accuracy (seed means)")
    report.write_tables(out, NAME, df, wide, env, "Table 6: ViT classification", "\n\n".join(notes),
                        best={c: "max" for c in cols}, comparison=comp)
    where = f"{preset_name}: {dataset}; n = {len(seeds)} seeds; {env.get('device_name')}"
    note = report.setting_note(df)
    if not deltas.empty:
        plots.delta_plot(deltas.assign(panel=deltas["metric"] + " ↑"), "panel", out / f"{NAME}_delta.png",
                         f"Table 6 ({where}): seed-paired accuracy difference vs MHA/paper, "
                         + plots.interval_title(deltas),
                         "accuracy − accuracy of MHA (percentage points)", reference="MHA/paper",
                         note=note)
    curves = _acc_curves(out, store, run_dir_of, preset_name)
    for epochs, g in (curves.groupby("epochs") if not curves.empty else []):
        d = delta_frame(g, ["epoch"], {"variant": "mha", "flavor": "paper"})
        # early stopping ends seeds at different epochs: a late point pairs the few still running, so it is not shown
        if d.empty:
            continue
        least = int(min(5, d["n"].max()))
        d = d[d["n"] >= least]
        if d["epoch"].nunique() > 1:
            lo, hi = int(d["n"].min()), int(d["n"].max())
            plots.interval_plot(d, "epoch", "arm", out / f"{NAME}_delta_curve_{preset_name}_{epochs}ep.png",
                                f"Table 6 ({where}, {epochs} epochs): validation NLL during training, seed-paired "
                                f"change vs MHA/paper\n(epochs at which ≥ {least} seed pairs still train; early "
                                "stopping)", "change vs MHA (% of MHA's validation NLL)", "epoch",
                                zero=f"0 = MHA/paper (reference); bars: {plots.interval_words(d)} over "
                                     f"{lo if lo == hi else f'{lo}–{hi}'} seed pairs", note=note)
    return comp, verdicts
