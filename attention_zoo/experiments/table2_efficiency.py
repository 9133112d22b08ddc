"""Table 2 (paper p. 7): efficiency — memory, latency, GFLOPs and parameters per variant and setting.

Model: the authors' decoder (post-LN, sinusoidal positions, GELU FFN, dropout 0.1; docs/variants.md §0.2), vocabulary
256 (byte-level; the paper's tokenisers are not part of the profile), the stack-shared DAMCHA generator with its
default topology (hidden (256, 512)) — the paper profiled ``mlp_hidden=()``, which only the ``paper_model_gflops``
column (the authors' closed-form model, docs/experiments.md §6) assumes.
- ``smoke`` preset: the compact config Table 2 was profiled on (D=128, H=8, d_ff=256, N=4);
- ``paper`` preset: the Section 5.1 model (N=10, D=512, H=8, d_ff=2048 [U]: 4·D, not given in the paper).
Settings: CIFAR-10/100 T=64 (batch 64; both datasets share this profile), CommonGen T=128 (32), WMT T=256 (32).
On CPU the smoke preset uses batch 1 and few repeats so it ends in about a minute.

Per cell (variant × flavour × setting), in separate passes: peak memory of one inference forward and of one
training step (forward, backward, AdamW created inside the region); forward and forward+backward latency (median,
IQR, mean, raw times); forward FLOPs at batch 1 three ways (analytic, fvcore MACs, FlopCounterMode) and the
paper model; attention-only and whole-model parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ..envinfo import environment_record, resolve_device
from ..measure import (
    ForkServers,
    build_workload,
    check_consistency,
    count_flops,
    count_params,
    guarded,
    measure_memory_many,
    measure_model_latency,
    memory_item,
    warn_unstable,
    workload_spec,
)
from ..plots import barh_plot
from ..report import UNSTABLE_MARK, comparison_frame, format_comparison, mark_values, write_tables
from .common import base_parser, cli_main, open_store, positive_int, setup_threads
from .efficiency import (
    RUN_CONTROL,
    Timing,
    add_measure_arguments,
    attention_rows,
    config_record,
    measure_cells,
    timing_for,
)
from .launchers import run_whole
from .paper_flops import PAPER_METHODS, PAPER_QUOTED_GFLOPS, paper_gflops
from .protocol import add_launcher_arguments

NAME = "table2_efficiency"
BASELINE = "mha"
PAPER_MEMORY_RATIOS = {("tha", "damcha"): 1.248, ("moa", "damcha"): 1.568}  # CIFAR-10 memory, [D] from [Q]


@dataclass(frozen=True)
class Setting:
    key: str
    label: str
    seq_len: int
    batch: int  # the authors' profiling batch


SETTINGS = (Setting("cifar", "CIFAR-10/100", 64, 64), Setting("commongen", "CommonGen", 128, 32),
            Setting("wmt", "WMT", 256, 32))


@dataclass(frozen=True)
class Preset:
    """The profiled decoder."""

    model: str
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int


PRESETS = {"smoke": Preset("compact", d_model=128, n_heads=8, d_ff=256, n_layers=4),
           "paper": Preset("section5.1", d_model=512, n_heads=8, d_ff=2048, n_layers=10)}


def plan(args, device: torch.device) -> dict:
    """Model, batch and timing for the preset and device; command-line overrides win. Repeats adapt to a minimum
    timed duration (``min_time_s``, at least ``min_repeats`` calls) unless ``--repeats`` fixes them."""
    cuda, smoke = device.type == "cuda", args.preset == "smoke"
    return {**config_record(PRESETS[args.preset]), "vocab_size": args.vocab_size,
            "batch": args.batch if args.batch else (None if cuda or not smoke else 1),  # None: the paper's batch
            **timing_for(args, device).kwargs()}


def decoder_spec(variant: str, flavour: str, setting: Setting, cfg: dict, batch: int, options: dict | None = None
                 ) -> dict:
    return workload_spec(kind="decoder", attention=variant, options={"flavor": flavour, **(options or {})},
                         d_model=cfg["d_model"],
                         n_heads=cfg["n_heads"], n_layers=cfg["n_layers"], d_ff=cfg["d_ff"],
                         vocab_size=cfg["vocab_size"], norm="post", positions="sinusoidal", share_mlp=True,
                         dropout=0.1, batch=batch, seq_len=setting.seq_len)


TIMING_KEYS = ("warmup", "repeats", "min_time_s", "min_repeats")


def _row(metric: str, value, unit: str, status: str = "ok", message: str = "", **extra) -> dict:
    value = float("nan") if value is None else float(value)
    return {"metric": metric, "value": value, "unit": unit, "status": status, "message": message, **extra}


def memory_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in results:
        tag = "fwd" if res["mode"] == "forward" else "train"
        keys = ("peak_alloc_mib", "peak_reserved_mib") if res["device"].startswith("cuda") else ("peak_rss_mib",)
        for k in keys:
            rows.append(_row(f"peak_{tag}_{k[5:]}", res.get(k), "MiB", res["status"], res["message"],
                             mode=res["mode"]))
    return rows


def latency_rows(spec: dict, device: torch.device, cfg: dict, label: str = "") -> list[dict]:
    """Median/IQR/mean rows (with the noise guard's verdict and load) and raw per-repeat rows of both modes."""
    rows, results = [], {}
    for mode in ("forward", "fwd_bwd"):
        def measure(mode=mode):
            wl = build_workload(spec, device)
            return {"lat": measure_model_latency(wl, mode, device, **{k: cfg[k] for k in TIMING_KEYS})}

        results[mode] = guarded(measure, device)
    if all(r["status"] == "ok" for r in results.values()):
        check_consistency(results["forward"]["lat"], results["fwd_bwd"]["lat"])
    for (mode, res), tag in zip(results.items(), ("fwd", "fwd_bwd")):
        if res["status"] != "ok":
            rows += [_row(f"latency_{tag}_{s}_ms", None, "ms", res["status"], res["message"], mode=mode)
                     for s in ("median", "q25", "q75", "mean")]
            continue
        lat = res["lat"]
        warn_unstable(f"{label} {tag}".strip(), lat)
        for stat in ("median", "q25", "q75", "mean"):
            rows.append(_row(f"latency_{tag}_{stat}_ms", getattr(lat, f"{stat}_ms"), "ms", mode=mode,
                             **lat.guard_fields()))
        rows += [_row(f"latency_{tag}_raw_ms", t, "ms", mode=mode, repeat=i) for i, t in enumerate(lat.times_ms)]
    return rows


def flop_param_rows(variant: str, spec: dict, setting: Setting, device: torch.device, counters) -> list[dict]:
    wl = build_workload({**spec, "batch": 1}, device)  # FLOPs at batch 1, as the paper's model
    rep = count_flops(wl.model, wl.inputs, 1, setting.seq_len, counters=counters)
    s = rep.summary()
    rows = [_row("fwd_gflops_analytic", s["fwd_gflops_analytic"], "GFLOP"),
            _row("fvcore_gmacs", s["fvcore_gmacs"], "GMAC"),
            _row("flop_counter_gflops", s["flop_counter_gflops"], "GFLOP")]
    for flag in ("fvcore_agrees", "flop_counter_agrees"):
        if s[flag] is not None:
            rows.append(_row(flag, s[flag], "bool", message=s["flops_message"]))
    if variant in PAPER_METHODS:  # the authors' model exists for the paper's seven methods only
        rows.append(_row("paper_model_gflops", paper_gflops(variant, setting.seq_len), "GFLOP",
                         message="authors' closed-form model (e6c19f1), compact config, batch 1"))
    rows += [_row(k, v, "params") for k, v in count_params(wl.model).items()]
    return rows


def run_cell(variant: str, flavour: str, setting: Setting, cfg: dict, device: torch.device, counters,
             servers: ForkServers | None, batch: int, options: dict | None = None, label: str | None = None
             ) -> list[dict]:
    spec = decoder_spec(variant, flavour, setting, cfg, batch, options)
    items = [memory_item(spec, mode, optimizer_in_region=True, threads=torch.get_num_threads())
             for mode in ("forward", "train")]
    rows = memory_rows(measure_memory_many(items, device, servers=servers))
    rows += latency_rows(spec, device, cfg, f"{label or variant}/{flavour} T={setting.seq_len}")
    fp = guarded(lambda: {"rows": flop_param_rows(variant, spec, setting, device, counters)}, device)
    rows += fp["rows"] if fp["status"] == "ok" else [_row("fwd_gflops_analytic", None, "GFLOP", fp["status"],
                                                          fp["message"])]
    return rows


# ---- report ------------------------------------------------------------------------------------------------------
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


LATENCY_COLUMNS = {"fwd": "fwd ms (median)", "fwd_bwd": "fwd+bwd ms (median)"}


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


def unstable_marks(df: pd.DataFrame) -> dict[tuple, set[str]]:
    """{(setting, seq_len, batch, variant, flavour): {wide latency column}} for the markdown's † marks."""
    marks: dict[tuple, set[str]] = {}
    for _, r in _unstable(df).iterrows():
        tag = r["metric"].removeprefix("latency_").removesuffix("_median_ms")
        marks.setdefault(tuple(r[k] for k in INDEX), set()).add(LATENCY_COLUMNS[tag])
    return marks


def paper_comparison(df: pd.DataFrame, preset: str, device: torch.device | None = None) -> pd.DataFrame:
    entries = [{"what": f"{m.upper()} {d} GFLOPs (authors' model)", "paper": v, "ours": paper_gflops(m, T)}
               for (m, d, T), v in PAPER_QUOTED_GFLOPS.items()]
    ok = df[(df["status"] == "ok")] if not df.empty else df
    if preset == "smoke" and not ok.empty:  # our modules' analytic count on the same compact config
        for (m, d, T), v in PAPER_QUOTED_GFLOPS.items():
            sel = ok[(ok["variant"] == m) & (ok["seq_len"] == T) & (ok["metric"] == "fwd_gflops_analytic")]
            sel = sel.sort_values("flavour")  # damcha_repo sorts first: the baselines the paper ran
            if not sel.empty:
                entries.append({"what": f"{m.upper()} {d} GFLOPs (our modules, {sel['flavour'].iloc[0]})",
                                "paper": v, "ours": float(sel["value"].iloc[0])})
    if not ok.empty:
        mem = ok[ok["metric"].isin(["peak_train_alloc_mib", "peak_train_rss_mib"]) & (ok["seq_len"] == 64)]
        for (a, b), v in PAPER_MEMORY_RATIOS.items():
            va = mem[mem["variant"] == a].sort_values("flavour")  # damcha_repo sorts first: the paper's baselines
            vb = mem[mem["variant"] == b]
            if not va.empty and not vb.empty:
                kind = "CPU peak RSS" if va["metric"].iloc[0].endswith("rss_mib") else "GPU allocation"
                entries.append({"what": f"{a.upper()}/{b.upper()} train memory, CIFAR ({va['flavour'].iloc[0]})",
                                "paper": v, "ours": float(va["value"].iloc[0] / vb["value"].iloc[0]),
                                "note": f"ours: {kind} ratio; paper: GPU allocation ratio"})
    return comparison_frame(entries)


PANEL_NAMES = {"peak_fwd_rss_mib": "inference forward", "peak_train_rss_mib": "training step",
               "peak_fwd_alloc_mib": "inference forward", "peak_train_alloc_mib": "training step (allocated)",
               "peak_train_reserved_mib": "training step (reserved)", "latency_fwd_median_ms": "forward",
               "latency_fwd_bwd_median_ms": "forward + backward", "fwd_gflops_analytic": "analytic",
               "flop_counter_gflops": "FlopCounterMode", "paper_model_gflops": "authors' closed form",
               "fvcore_gmacs": "fvcore"}


def plots(df: pd.DataFrame, out: Path) -> list[Path]:
    """Per setting: memory, latency, GFLOP and GMAC figures (one unit per axis: GMACs never share an axis with
    GFLOPs), one panel per measurement, one bar per variant/flavour in its fixed colour (damcha_repo hatched);
    latency bars carry q25–q75 error bars and unstable timings are faded."""
    ok = df[(df["status"] == "ok") & df["value"].notna()].copy()
    if ok.empty:
        return []
    ok["row"] = ok["variant"] + "/" + ok["flavour"]
    quart = ok[ok["metric"].str.match(r"latency_(fwd|fwd_bwd)_q(25|75)_ms$")]
    q = quart.assign(stat=quart["metric"].str.extract(r"_(q25|q75)_ms$")[0],
                     metric=quart["metric"].str.replace(r"_q(25|75)_ms$", "_median_ms", regex=True))
    q = q.pivot_table(index=["setting", "row", "metric"], columns="stat", values="value").reset_index()
    groups = {"memory": (ok["unit"] == "MiB", "peak memory increment (MiB)"),
              "latency": (ok["metric"].isin(["latency_fwd_median_ms", "latency_fwd_bwd_median_ms"]),
                          "median latency (ms)"),
              "gflops": (ok["unit"] == "GFLOP", "forward GFLOP at batch 1"),
              "gmacs": (ok["unit"] == "GMAC", "forward GMAC at batch 1 (fvcore)")}
    paths = []
    for setting, sub in ok.groupby("setting"):
        for kind, (mask, xlabel) in groups.items():
            part = sub[mask.loc[sub.index]].copy()
            if part.empty:
                continue
            part["panel"] = part["metric"].map(PANEL_NAMES).fillna(part["metric"])
            lo = hi = None
            if kind == "latency" and not q.empty:
                part = part.merge(q, on=["setting", "row", "metric"], how="left")
                lo, hi = ("q25", "q75") if {"q25", "q75"} <= set(part.columns) else (None, None)
            name = f"{NAME}_{kind}_{setting.split('/')[0].lower()}.png"
            paths.append(barh_plot(part, "row", "value", out / name, f"Table 2, {setting}: {kind}", xlabel,
                                   panel="panel", flag="unstable" if kind == "latency" else None, lo=lo, hi=hi))
    return paths


def _marks_note(marks: dict) -> str:
    if not marks:
        return ""
    return (f" {UNSTABLE_MARK} = timing marked unstable by the noise guard (IQR/median > 10 % or a busy machine; "
            "the `timing` column and the long CSV's `unstable_reason` say why).")


def notes(cfg: dict, device: torch.device, counters) -> str:
    batch = "the paper's per-setting batch" if cfg["batch"] is None else f"batch {cfg['batch']} (reduced)"
    return (f"Model: {cfg['model']} decoder (D={cfg['d_model']}, H={cfg['n_heads']}, d_ff={cfg['d_ff']}, "
            f"N={cfg['n_layers']}; post-LN, sinusoidal positions, dropout 0.1, vocab {cfg['vocab_size']}); "
            f"DAMCHA: stack-shared default generator, hidden (256, 512). Device {device}; {batch}; latency: "
            f"{Timing(**{k: cfg[k] for k in TIMING_KEYS}).rule()}, median (q25–q75 in the long CSV). "
            "Memory: increment over the baseline (model and inputs built) of one eval forward / one training step "
            "(forward, backward, AdamW created inside the region); CUDA max_memory_allocated (reserved also "
            "shown), CPU peak RSS of a fresh forked process (not comparable with CUDA). GFLOPs: forward at batch 1; "
            "analytic = the modules' formulas, 2 FLOPs/MAC, softmax/norm/elementwise excluded; fvcore counts MACs; "
            f"counters run: {', '.join(counters) or 'none'}. paper-model = the authors' closed form (compact "
            "config, `mlp_hidden=()`). Flavours: `paper` = published method, `damcha_repo` = the DAMCHA authors' "
            "baseline code. Ratios are vs MHA in the same setting.")


def build_parser():
    p = base_parser(NAME, "Table 2: memory, latency, GFLOPs and parameters of every registered attention.",
                    seeds=False)
    p.add_argument("--settings", default="cifar,commongen,wmt", help="comma-separated: cifar, commongen, wmt")
    p.add_argument("--batch", type=positive_int, default=None, help="override every setting's batch")
    p.add_argument("--vocab-size", type=positive_int, default=256, help="decoder vocabulary (byte-level)")
    p.add_argument("--counters", default="fvcore,flop_counter",
                   help="FLOP counters to run besides the analytic count (comma-separated; '' for none)")
    add_measure_arguments(p)
    return add_launcher_arguments(p)


def run(args) -> int:
    device = resolve_device(args.device)
    setup_threads(args.threads)
    cfg = plan(args, device)
    counters = tuple(c for c in args.counters.split(",") if c)
    keys = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = sorted(set(keys) - {s.key for s in SETTINGS})
    if unknown:
        raise ValueError(f"settings: unknown {', '.join(unknown)}; available: {', '.join(s.key for s in SETTINGS)}")
    settings = [s for s in SETTINGS if s.key in keys]
    rows = attention_rows(args)
    env = environment_record(device, preset=args.preset, **{k: v for k, v in cfg.items() if k != "model"},
                             model=cfg["model"], counters=list(counters))
    store = open_store(args, NAME, device, env, selection=("settings", "extra", *RUN_CONTROL), **cfg)
    cells, plan_of = [], {}
    for s in settings:
        for row in rows:
            cell = {**row.cell_fields(), "setting": s.label, "seq_len": s.seq_len, "batch": cfg["batch"] or s.batch,
                    "preset": args.preset, "model": cfg["model"], "device": device.type,
                    "counters": ",".join(counters)}
            cells.append(cell)
            plan_of[(row.label, s.label)] = (row, s)

    def measure(cell, servers):
        row, s = plan_of[(cell["variant"], cell["setting"])]
        return run_cell(row.name, row.flavor, s, cfg, device, counters, servers, cell["batch"], row.options, row.label)

    if not args.quiet:
        print(f"{len(cells)} cells, {len(cells) - len(store.pending(cells))} already measured here with these "
              f"settings; {notes(cfg, device, counters)[:160]}…")
    measure_cells(store, cells, measure, device, args.memory_workers, NAME, args.quiet)
    df = store.frame()  # every cell of this context, also those other runs on this --out measured
    wide = wide_frame(df)
    comp = paper_comparison(df, args.preset, device)
    marks = unstable_marks(df)
    write_tables(args.out, NAME, df, wide, store.environment(env, df), "Table 2: efficiency",
                 notes(cfg, device, counters) + _marks_note(marks), comparison=comp,
                 md_df=mark_values(wide, marks, INDEX))
    plots(df, Path(args.out))
    if not args.quiet:
        print(format_comparison(comp))
        print(f"wrote {Path(args.out) / (NAME + '.md')}")
    return 0


@cli_main
def main(argv: list[str] | None = None) -> int:
    return run_whole(build_parser().parse_args(argv), NAME, run)  # one machine: a cluster runs it as one job


__all__ = ["SETTINGS", "main", "run", "run_cell", "wide_frame"]
