"""Table 2's report: the wide table with ratios vs MHA, the unstable marks, the paper comparison, the notes that
explain counter and memory gaps, and the figures. Everything here reads the long rows the measurement wrote."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...plots import barh_plot
from ...registry import get_attention_spec
from ...report import NOT_COMPARABLE, UNSTABLE_MARK, comparison_frame
from .paper_flops import PAPER_QUOTED_GFLOPS, paper_gflops
from .timing import Timing

NAME = "table2_efficiency"
BASELINE = "mha"
PAPER_MEMORY_RATIOS = {("tha", "damcha"): 1.248, ("moa", "damcha"): 1.568}  # CIFAR-10 memory, [D] from [Q]
PAPER_GENERATOR = "damcha[hidden_dims=()]"  # the row built as the authors' closed form assumes (no hidden layer)
TIMING_KEYS = ("warmup", "repeats", "min_time_s", "min_repeats")

WIDE_COLUMNS = {  # metric -> column label (units in the header)
    "attention_params": "attn params", "total_params": "total params", "fwd_gflops_analytic": "GFLOPs analytic",
    "fvcore_gmacs": "fvcore GMACs", "flop_counter_gflops": "FlopCounter GFLOPs",
    "paper_model_gflops": "paper-model GFLOPs", "latency_fwd_median_ms": "fwd ms (median)",
    "latency_fwd_bwd_median_ms": "fwd+bwd ms (median)", "peak_fwd_alloc_mib": "fwd MiB (alloc)",
    "peak_train_alloc_mib": "train MiB (alloc)", "peak_train_reserved_mib": "train MiB (reserved)",
    "peak_fwd_rss_mib": "fwd MiB (RSS)", "peak_train_rss_mib": "train MiB (RSS)",
}
RATIOS = {"latency_fwd_median_ms": "fwd latency / MHA", "latency_fwd_bwd_median_ms": "fwd+bwd latency / MHA",
          "peak_train_alloc_mib": "train memory / MHA", "peak_train_rss_mib": "train memory / MHA",
          "fwd_gflops_analytic": "GFLOPs / MHA"}
LATENCY_COLUMNS = {"fwd": "fwd ms (median)", "fwd_bwd": "fwd+bwd ms (median)"}
LATENCY_RATIOS = {"fwd": "fwd latency / MHA", "fwd_bwd": "fwd+bwd latency / MHA"}
INDEX = ["setting", "seq_len", "batch", "variant", "flavour"]


def wide_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Rows = setting × variant × flavour; columns = WIDE_COLUMNS, ratios vs MHA, counter agreement."""
    if df.empty:
        return pd.DataFrame()
    extra = ["fvcore_agrees", "flop_counter_agrees"] + [f"latency_{m}_{q}_ms" for m in ("fwd", "fwd_bwd")
                                                         for q in ("q25", "q75")]
    summary = df[df["metric"].isin(list(WIDE_COLUMNS) + extra)]
    wide = summary.pivot_table(index=INDEX, columns="metric", values="value", aggfunc="mean")
    wide = wide.reset_index()
    for m, label in (("fwd", "fwd IQR ms"), ("fwd_bwd", "fwd+bwd IQR ms")):
        if f"latency_{m}_q75_ms" in wide:
            wide[label] = wide.pop(f"latency_{m}_q75_ms") - wide.pop(f"latency_{m}_q25_ms")
    for metric, label in RATIOS.items():
        if metric not in wide:
            continue
        base = wide[wide["variant"] == BASELINE].groupby("setting")[metric].first()
        wide[label] = wide[metric] / wide["setting"].map(base)
    flags = [c for c in ("fvcore_agrees", "flop_counter_agrees") if c in wide]
    wide["counters agree (±2%)"] = wide[flags].apply(
        lambda r: "–" if r.isna().all() else ("yes" if (r.dropna() == 1).all() else "NO"), axis=1) if flags else "–"
    wide = wide.drop(columns=flags).rename(columns=WIDE_COLUMNS)
    for col in ("attn params", "total params"):
        if col in wide:
            wide[col] = wide[col].map(lambda v: v if pd.isna(v) else int(v)).astype(object)
    order = [c for c in ["attn params", "total params", "GFLOPs analytic", "fvcore GMACs", "FlopCounter GFLOPs",
                         "paper-model GFLOPs", "fwd ms (median)", "fwd IQR ms", "fwd+bwd ms (median)",
                         "fwd+bwd IQR ms", *WIDE_COLUMNS.values()] if c in wide]
    rest = [c for c in wide.columns if c not in INDEX and c not in order]
    wide = wide[INDEX + list(dict.fromkeys(order)) + rest]
    wide["timing"] = _timing_notes(df, wide)
    failed = df[df["status"] != "ok"]
    for _, r in failed.iterrows():  # human tables: "skipped (OOM)" instead of a number
        col = WIDE_COLUMNS.get(r["metric"])
        if col in wide:
            hit = (wide["setting"] == r["setting"]) & (wide["variant"] == r["variant"]) & \
                  (wide["flavour"] == r["flavour"])
            wide[col] = wide[col].astype(object)
            wide.loc[hit, col] = f"skipped ({r['status'].upper()})"
    return wide.sort_values(["seq_len", "variant", "flavour"]).reset_index(drop=True)


def _unstable(df: pd.DataFrame) -> pd.DataFrame:
    """The median-latency rows the noise guard marked unstable."""
    if "unstable" not in df:
        return df.iloc[0:0]
    med = df[df["metric"].isin([f"latency_{m}_median_ms" for m in LATENCY_COLUMNS])]
    return med[med["unstable"].astype(str).str.lower() == "true"]


def _timing_notes(df: pd.DataFrame, wide: pd.DataFrame) -> pd.Series:
    notes = {}
    for _, r in _unstable(df).iterrows():
        key = (r["setting"], r["variant"], r["flavour"])
        tag = r["metric"].removeprefix("latency_").removesuffix("_median_ms")
        notes.setdefault(key, []).append(f"{tag} unstable: {r['unstable_reason']}")
    return wide.apply(lambda w: "; ".join(notes.get((w["setting"], w["variant"], w["flavour"]), [])), axis=1)


def unstable_marks(df: pd.DataFrame, wide: pd.DataFrame | None = None) -> dict[tuple, set[str]]:
    """{(setting, seq_len, batch, variant, flavour): {wide column}} for the markdown's † marks: an unstable
    timing, and every latency ratio of a setting whose MHA timing (the ratios' denominator) is unstable."""
    marks: dict[tuple, set[str]] = {}
    unstable = _unstable(df)
    for _, r in unstable.iterrows():
        tag = r["metric"].removeprefix("latency_").removesuffix("_median_ms")
        marks.setdefault(tuple(r[k] for k in INDEX), set()).update({LATENCY_COLUMNS[tag], LATENCY_RATIOS[tag]})
    if wide is not None and not wide.empty:
        for _, r in unstable[unstable["variant"] == BASELINE].iterrows():
            tag = r["metric"].removeprefix("latency_").removesuffix("_median_ms")
            for _, w in wide[wide["setting"] == r["setting"]].iterrows():
                marks.setdefault(tuple(w[k] for k in INDEX), set()).add(LATENCY_RATIOS[tag])
    return marks


def _rows_of(ok: pd.DataFrame, variant: str, seq_len: int, metric: str) -> pd.DataFrame:
    sel = ok[(ok["variant"] == variant) & (ok["seq_len"] == seq_len) & (ok["metric"] == metric)]
    return sel.sort_values("flavour")  # damcha_repo sorts first: the baselines the paper ran


def paper_comparison(df: pd.DataFrame, preset: str, device=None) -> pd.DataFrame:
    """The authors' closed form against the paper's quoted GFLOPs; on the compact config our modules' analytic
    count, like for like (DAMCHA built as the closed form assumes, ``hidden_dims=()``; our default generator is
    shown as not comparable); the paper's memory ratios, which a CPU RSS at batch 1 cannot be compared with."""
    entries = [{"what": f"{m.upper()} {d} GFLOPs (authors' model)", "paper": v, "ours": paper_gflops(m, T)}
               for (m, d, T), v in PAPER_QUOTED_GFLOPS.items()]
    ok = df[(df["status"] == "ok")] if not df.empty else df
    if preset == "smoke" and not ok.empty:
        for (m, d, T), v in PAPER_QUOTED_GFLOPS.items():
            like = PAPER_GENERATOR if m == "damcha" else m
            sel = _rows_of(ok, like, T, "fwd_gflops_analytic")
            if not sel.empty:
                entries.append({"what": f"{m.upper()} {d} GFLOPs (our modules, {like}/{sel['flavour'].iloc[0]})",
                                "paper": v, "ours": float(sel["value"].iloc[0])})
            default = _rows_of(ok, m, T, "fwd_gflops_analytic") if m == "damcha" else sel.iloc[0:0]
            if not default.empty:
                entries.append({"what": f"DAMCHA {d} GFLOPs (our default generator, hidden (256, 512))",
                                "paper": v, "ours": float(default["value"].iloc[0]),
                                "note": f"{NOT_COMPARABLE}: the paper's model has no generator hidden layer"})
    if not ok.empty:
        mem = ok[ok["metric"].isin(["peak_train_alloc_mib", "peak_train_rss_mib"]) & (ok["seq_len"] == 64)]
        for (a, b), v in PAPER_MEMORY_RATIOS.items():
            va, vb = mem[mem["variant"] == a].sort_values("flavour"), mem[mem["variant"] == b]
            if va.empty or vb.empty:
                continue
            cpu = va["metric"].iloc[0].endswith("rss_mib")
            batch = int(va["batch"].iloc[0]) if "batch" in va and pd.notna(va["batch"].iloc[0]) else None
            entries.append({"what": f"{a.upper()}/{b.upper()} train memory, CIFAR ({va['flavour'].iloc[0]})",
                            "paper": v, "ours": float(va["value"].iloc[0] / vb["value"].iloc[0]),
                            "note": (f"{NOT_COMPARABLE}: ours is a CPU peak RSS increment ratio"
                                     f"{f' at batch {batch}' if batch else ''}; paper: GPU allocation ratio at "
                                     "batch 64") if cpu else "ours and paper: GPU allocation ratio"})
    return comparison_frame(entries)


def _variant_of(label: str) -> str:
    return label.split("[", 1)[0]


def gap_notes(df: pd.DataFrame) -> str:
    """Explanations, declared by the variants (``flop_count_note``, ``memory_note``), for the variants whose FLOP
    counters disagree with the analytic count or whose training memory is below MHA's."""
    if df.empty:
        return ""
    flags = df[df["metric"].isin(["fvcore_agrees", "flop_counter_agrees"]) & (df["value"] == 0)]
    out = []
    for v in sorted({_variant_of(x) for x in flags["variant"]}):
        note = getattr(get_attention_spec(v).cls, "flop_count_note", "")
        out.append(f"{v.upper()} counters vs analytic: {note or 'no explanation declared'}")
    mem = df[(df["metric"] == "peak_train_rss_mib") | (df["metric"] == "peak_train_alloc_mib")]
    base = mem[mem["variant"] == BASELINE].groupby("setting")["value"].first()
    low = mem[(mem["variant"] != BASELINE) & (mem["value"] < 0.9 * mem["setting"].map(base))]
    for v in sorted({_variant_of(x) for x in low["variant"]}):
        note = getattr(get_attention_spec(v).cls, "memory_note", "")
        if note:
            out.append(f"{v.upper()} training memory below MHA's: {note}")
    return " ".join(f"{s}." if not s.endswith(".") else s for s in out)


PANEL_NAMES = {"peak_fwd_rss_mib": "inference forward", "peak_train_rss_mib": "training step",
               "peak_fwd_alloc_mib": "inference forward", "peak_train_alloc_mib": "training step (allocated)",
               "peak_train_reserved_mib": "training step (reserved)", "latency_fwd_median_ms": "forward",
               "latency_fwd_bwd_median_ms": "forward + backward", "fwd_gflops_analytic": "analytic",
               "flop_counter_gflops": "FlopCounterMode", "paper_model_gflops": "authors' closed form"}


def _first(sub: pd.DataFrame, col: str, default="?"):
    vals = sub[col].dropna().unique() if col in sub else []
    return vals[0] if len(vals) else default


def plots(df: pd.DataFrame, out: Path) -> list[Path]:
    """Per setting: memory, latency and GFLOP figures, one panel per measurement, one bar per variant/flavour in
    its fixed colour (damcha_repo hatched). fvcore's MACs are half the FlopCounterMode FLOPs by construction (the
    tables keep them), so they get no figure. Latency bars carry q25–q75 error bars and unstable timings are faded;
    memory is one measurement per cell, so its bars carry none; GFLOP panels share one scale."""
    ok = df[(df["status"] == "ok") & df["value"].notna()].copy()
    if ok.empty:
        return []
    ok["row"] = ok["variant"] + "/" + ok["flavour"]
    quart = ok[ok["metric"].str.match(r"latency_(fwd|fwd_bwd)_q(25|75)_ms$")]
    q = quart.assign(stat=quart["metric"].str.extract(r"_(q25|q75)_ms$")[0],
                     metric=quart["metric"].str.replace(r"_q(25|75)_ms$", "_median_ms", regex=True))
    q = q.pivot_table(index=["setting", "row", "metric"], columns="stat", values="value").reset_index()
    paths = []
    for setting, sub in ok.groupby("setting"):
        device, preset, batch = _first(sub, "device"), _first(sub, "preset"), _first(sub, "batch")
        cpu = str(device).startswith("cpu")
        kind_of_memory = "CPU RSS increment" if cpu else "CUDA allocation"
        groups = {"memory": (sub["unit"] == "MiB", f"peak memory (MiB, {kind_of_memory})"),
                  "latency": (sub["metric"].isin(["latency_fwd_median_ms", "latency_fwd_bwd_median_ms"]),
                              "median latency (ms); bars: q25–q75"),
                  "gflops": (sub["unit"] == "GFLOP", "forward GFLOP at batch 1")}
        about = {"memory": f"{kind_of_memory}, batch {batch}, one measurement per cell (no interval)",
                 "latency": f"batch {batch}", "gflops": "counted, not timed"}
        for kind, (mask, xlabel) in groups.items():
            part = sub[mask].copy()
            if part.empty:
                continue
            part["panel"] = part["metric"].map(PANEL_NAMES).fillna(part["metric"])
            lo = hi = None
            if kind == "latency" and not q.empty:
                part = part.merge(q, on=["setting", "row", "metric"], how="left")
                lo, hi = ("q25", "q75") if {"q25", "q75"} <= set(part.columns) else (None, None)
            name = f"{NAME}_{kind}_{setting.split('/')[0].lower()}.png"
            T = int(sub["seq_len"].iloc[0])
            title = f"Table 2, {setting} setting (T = {T}): {kind} — {preset} preset, {device}; {about[kind]}"
            paths.append(barh_plot(part, "row", "value", out / name, title, xlabel, panel="panel",
                                   flag="unstable" if kind == "latency" else None, lo=lo, hi=hi,
                                   sharex=kind == "gflops"))
    return paths


def marks_note(marks: dict) -> str:
    if not marks:
        return ""
    return (f" {UNSTABLE_MARK} = timing marked unstable by the noise guard (IQR/median > 10 % or a busy machine; "
            "the `timing` column and the long CSV's `unstable_reason` say why); a latency ratio is marked when "
            "either its timing or MHA's is.")


def notes(cfg: dict, device, counters) -> str:
    batch = "the paper's per-setting batch" if cfg["batch"] is None else f"batch {cfg['batch']} (reduced)"
    return (f"Model: {cfg['model']} decoder (D={cfg['d_model']}, H={cfg['n_heads']}, d_ff={cfg['d_ff']}, "
            f"N={cfg['n_layers']}; post-LN, sinusoidal positions, dropout 0.1, vocab {cfg['vocab_size']}); "
            f"DAMCHA: stack-shared default generator, hidden (256, 512); `{PAPER_GENERATOR}` is DAMCHA built as "
            f"the authors' closed form assumes. Device {device}; {batch}; latency: "
            f"{Timing(**{k: cfg[k] for k in TIMING_KEYS}).rule()}, median (q25–q75 in the long CSV). "
            "Memory: increment over the baseline (model and inputs built) of one eval forward / one training step "
            "(forward, backward, AdamW created inside the region), one measurement per cell; CUDA "
            "max_memory_allocated (reserved also shown), CPU peak RSS of a fresh forked process (not comparable "
            "with CUDA). GFLOPs: forward at batch 1; analytic = the modules' formulas, 2 FLOPs/MAC, "
            "softmax/norm/elementwise excluded; fvcore counts MACs (half the FLOPs); "
            f"counters run: {', '.join(counters) or 'none'}. paper-model = the authors' closed form (compact "
            "config, `mlp_hidden=()`): computed, not measured. Flavours: `paper` = published method, "
            "`damcha_repo` = the DAMCHA authors' baseline code. Ratios are vs MHA in the same setting.")


__all__ = ["INDEX", "gap_notes", "marks_note", "notes", "paper_comparison", "plots", "unstable_marks",
           "wide_frame"]
