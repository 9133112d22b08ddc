"""Table 2 (paper p. 7): efficiency — memory, latency, GFLOPs and parameters per variant and setting.

Model: the authors' decoder (post-LN, sinusoidal positions, GELU FFN, dropout 0.1; docs/variants.md §0.2), vocabulary
256 (byte-level; the paper's tokenisers are not part of the profile), the stack-shared DAMCHA generator with its
default topology (hidden (256, 512)), and the row ``damcha[hidden_dims=()]``: DAMCHA as the paper profiled it
(``mlp_hidden=()``, which the ``paper_model_gflops`` column, the authors' closed form, docs/experiments.md §6, assumes).
- model (``--model``): ``compact``, the config Table 2 was profiled on (D=128, H=8, d_ff=256, N=4), in both presets;
  ``section5.1``: the Section 5.1 decoder (N=10, D=512, H=8, d_ff=2048 [U]: 4·D, not given in the paper);
- ``paper`` preset: the paper's per-setting batches and timing; ``smoke`` on CPU: batch 1 and few repeats, so it
  ends in minutes (on CUDA the smoke preset also takes the paper's batches).
Settings: CIFAR-10/100 T=64 (batch 64; both datasets share this profile), CommonGen T=128 (32), WMT T=256 (32).

Per cell (variant × flavour × setting), in separate passes: peak memory of one inference forward and of one
training step (forward, backward, AdamW created inside the region); forward and forward+backward latency (median,
IQR, mean, raw times); forward FLOPs at batch 1 three ways (analytic, fvcore MACs, FlopCounterMode) and the
paper model; attention-only and whole-model parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...envinfo import environment_record, resolve_device
from ...measure import (
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
from ...report import format_comparison, mark_values, write_tables
from ..common import ListAction, base_parser, experiment_main, open_store, positive_int, setup_threads
from ..launchers import run_whole
from ..protocol import add_launcher_arguments
from .paper_flops import PAPER_METHODS, paper_gflops
from .table2_report import (
    BASELINE,
    INDEX,
    NAME,
    PAPER_GENERATOR,
    TIMING_KEYS,
    gap_notes,
    marks_note,
    notes,
    paper_comparison,
    plots,
    unstable_marks,
    wide_frame,
)
from .timing import (
    RUN_CONTROL,
    add_measure_arguments,
    attention_rows,
    config_record,
    measure_cells,
    timing_for,
)

BASELINE_ATTEMPTS = 3  # MHA's timing is every ratio's denominator: re-measured (up to this often) until stable


@dataclass(frozen=True)
class Setting:
    key: str
    label: str
    seq_len: int
    batch: int  # the authors' profiling batch


SETTINGS = (Setting("cifar", "CIFAR-10/100", 64, 64), Setting("commongen", "CommonGen", 128, 32),
            Setting("wmt", "WMT", 256, 32))


@dataclass(frozen=True)
class Model:
    """The profiled decoder."""

    model: str
    d_model: int
    n_heads: int
    d_ff: int
    n_layers: int


MODELS = {"compact": Model("compact", d_model=128, n_heads=8, d_ff=256, n_layers=4),
          "section5.1": Model("section5.1", d_model=512, n_heads=8, d_ff=2048, n_layers=10)}


def plan(args, device: torch.device) -> dict:
    """Model, batch and timing for the preset and device; command-line overrides win. Repeats adapt to a minimum
    timed duration (``min_time_s``, at least ``min_repeats`` calls) unless ``--repeats`` fixes them."""
    cuda, smoke = device.type == "cuda", args.preset == "smoke"
    return {**config_record(MODELS[args.model]), "vocab_size": args.vocab_size,
            "batch": args.batch if args.batch else (None if cuda or not smoke else 1),  # None: the paper's batch
            **timing_for(args, device).kwargs()}


def decoder_spec(variant: str, flavour: str, setting: Setting, cfg: dict, batch: int, options: dict | None = None
                 ) -> dict:
    return workload_spec(kind="decoder", attention=variant, options={"flavor": flavour, **(options or {})},
                         d_model=cfg["d_model"],
                         n_heads=cfg["n_heads"], n_layers=cfg["n_layers"], d_ff=cfg["d_ff"],
                         vocab_size=cfg["vocab_size"], norm="post", positions="sinusoidal", share_mlp=True,
                         dropout=0.1, batch=batch, seq_len=setting.seq_len)


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
    tries = BASELINE_ATTEMPTS if variant == BASELINE and not options else 1
    for attempt in range(1, tries + 1):
        lat = latency_rows(spec, device, cfg, f"{label or variant}/{flavour} T={setting.seq_len}")
        if attempt == tries or not any(str(r.get("unstable")).lower() == "true" for r in lat):
            break
    rows += [{**r, "attempts": attempt} for r in lat]
    fp = guarded(lambda: {"rows": flop_param_rows(variant, spec, setting, device, counters)}, device)
    rows += fp["rows"] if fp["status"] == "ok" else [_row("fwd_gflops_analytic", None, "GFLOP", fp["status"],
                                                          fp["message"])]
    return rows


def build_parser():
    p = base_parser(NAME, "Table 2: memory, latency, GFLOPs and parameters of every registered attention.",
                    seeds=False)
    p.add_argument("--settings", action=ListAction, join=True, default="cifar,commongen,wmt",
                   help="of cifar, commongen, wmt")
    p.add_argument("--batch", type=positive_int, default=None, help="override every setting's batch")
    p.add_argument("--model", choices=tuple(MODELS), default="compact",
                   help="compact: the config the paper profiled (both presets); section5.1: the Section 5.1 decoder")
    p.add_argument("--vocab-size", type=positive_int, default=256, help="decoder vocabulary (byte-level)")
    p.add_argument("--counters", action=ListAction, join=True, default="fvcore,flop_counter",
                   help="FLOP counters to run besides the analytic count ('' for none)")
    add_measure_arguments(p)
    # DAMCHA's collapsed generator beside the full one, and DAMCHA as the authors' closed form assumes it
    p.set_defaults(extra=["damcha:collapsed_generator=true", f"damcha:{PAPER_GENERATOR.split('[')[1][:-1]}"])
    return add_launcher_arguments(p)


def check(args) -> tuple[list[Setting], tuple[str, ...], list]:
    """(settings, counters, attention rows) of ``args``, every one checked before any work (also by a dry run).

    Raises:
        ValueError: an unknown setting, counter or variant, or a bad ``--extra`` row (the message names the flag).
    """
    plan(args, resolve_device(args.device))  # the timing settings
    counters = tuple(c for c in args.counters.split(",") if c)
    unknown = sorted(set(counters) - {"fvcore", "flop_counter"})
    if unknown:
        raise ValueError(f"counters: unknown {', '.join(unknown)}; expected fvcore and/or flop_counter")
    keys = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = sorted(set(keys) - {s.key for s in SETTINGS})
    if unknown or not keys:
        raise ValueError(f"settings: {'unknown ' + ', '.join(unknown) if unknown else 'none given'}; available: "
                         f"{', '.join(s.key for s in SETTINGS)}")
    return [s for s in SETTINGS if s.key in keys], counters, attention_rows(args)


def run(args) -> int:
    settings, counters, rows = check(args)
    device = resolve_device(args.device)
    setup_threads(args.threads)
    cfg = plan(args, device)
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
    marks = unstable_marks(df, wide)
    write_tables(args.out, NAME, df, wide, store.environment(env, df), "Table 2: efficiency",
                 " ".join(x for x in (notes(cfg, device, counters), gap_notes(df), marks_note(marks)) if x),
                 comparison=comp,
                 md_df=mark_values(wide, marks, INDEX))
    plots(df, Path(args.out))
    if not args.quiet:
        print(format_comparison(comp))
        print(f"wrote {Path(args.out) / (NAME + '.md')}")
    return 0


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run_whole(build_parser().parse_args(argv), NAME, run, check)  # one machine: a cluster job runs it whole


__all__ = ["SETTINGS", "check", "main", "paper_comparison", "plots", "run", "run_cell", "unstable_marks", "wide_frame"]
