"""Benchmark your own shapes: ``zoo.benchmark(...)`` and ``python -m attention_zoo.bench``.

One attention layer per case (variant × flavour × shape (B, T, D, H)), eager and optionally compiled
(``torch.compile``), in fp32 or under autocast (bf16/fp16). For every shape the cases are built first and timed in
interleaved rounds (A B C … A B C …) until each has at least ``min_repeats`` calls and ``min_time_s`` seconds of
timed work, with the noise guard of ``measure.latency`` (IQR/median, machine load); peak memory is measured per case
and mode in a fresh process on CPU (peak RSS) or with ``max_memory_allocated`` on CUDA; FLOPs are the modules'
analytic count and FlopCounterMode's. Every row says its unit in the column name (``_ms``, ``_mib``, ``_gflop``).

``python -m attention_zoo.bench train …`` is the training-throughput mode: training steps per CPU-second of the
synthetic cells per arm and path (the legacy per-cell loop, the per-seed loop, the grouped seed ensemble;
``experiments/synthetic/train_speed.py``). ``python -m attention_zoo.bench compare BASE.csv NEW.csv`` compares two
saved runs case by case and exits 1 on a regression beyond noise (``measure/compare.py``); ``python -m
attention_zoo.bench decode`` times cached generation per token against the context length (``measure/decode.py``).
"""

from __future__ import annotations

import argparse
import json
import numbers
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from .cli import DeviceAction, HelpFormatter, cli_main, non_negative_int, positive_float, positive_int
from .envinfo import cpu_model, device_name, environment_record, resolve_device, setup_threads
from .io import atomic_write_csv, atomic_write_json
from .measure.flops import analytic_flops, flop_counter_count
from .measure.gate import announce_refusal, check_variant, gate_status
from .measure.latency import LOAD_KEYS, check_timing, measure_interleaved, step_fn
from .measure.memory import measure_memory_many, memory_item
from .measure.params import count_params
from .measure.status import failure_status, free_memory, short_message
from .measure.workload import build_workload, private_rng, workload_spec
from .plots.bench import plot  # noqa: F401  (attention_zoo.bench.plot: part of the API)
from .plugins import add_include_argument
from .registry import get_attention_spec, select_attentions
from .results import ensure_out_file
from .variants.base import AttentionBase

BASELINE = "mha"
DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}  # benchmark dtype -> autocast dtype
MODES = {"fwd": "forward", "fwd_bwd": "fwd_bwd"}  # benchmark mode -> step_fn / memory mode
COLUMNS = ["variant", "flavor", "batch", "seq_len", "d_model", "n_heads", "causal", "mode", "dtype", "compiled",
           "params", "attention_params", "path",
           "device", "device_name", "cpu_model", "status", "message", "latency_median_ms", "latency_q25_ms",
           "latency_q75_ms", "latency_iqr_ms", "repeats", "unstable", "unstable_reason", *LOAD_KEYS, "compile_s",
           "compile_fallback", "peak_mib", "memory_kind", "fwd_gflop_analytic", "fwd_gflop_counted", "achieved_gflops",
           "latency_vs_mha", "memory_vs_mha", "compiled_vs_eager"]


def _shape(s) -> tuple[int, int, int, int]:
    try:
        B, T, D, H = s
    except (TypeError, ValueError):
        raise ValueError(f"shapes: expected (batch, seq_len, d_model, n_heads) tuples, got {s!r}") from None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (B, T, D, H)):  # 1.5: no int()
        raise ValueError(f"shapes: expected int sizes (batch, seq_len, d_model, n_heads), got {s!r}")
    B, T, D, H = (int(v) for v in (B, T, D, H))  # numpy ints as Python ints
    if min(B, T, D, H) < 1 or D % H:
        raise ValueError(f"shapes: expected positive sizes with d_model % n_heads == 0, got {s!r}")
    return B, T, D, H


def _flavors(name: str, flavors: Sequence[str]) -> list[str]:
    have = get_attention_spec(name).flavors
    return [f for f in flavors if f in have] or ["paper"]


def _case_spec(name: str, flavor: str, shape, causal: bool, amp: str | None) -> dict:
    B, T, D, H = shape
    return workload_spec(attention=name, options={"flavor": flavor}, batch=B, seq_len=T, d_model=D, n_heads=H,
                         causal=causal, amp=amp)


def _failure_row(base: dict, exc: BaseException) -> dict:
    """An ``oom`` or ``nan`` row, or an ``error`` row with the exception for anything else: one case's failure
    never loses the others' rows."""
    return {**base, "status": failure_status(exc) or "error", "message": short_message(exc)}


def compile_fallbacks(model: torch.nn.Module) -> list[str]:
    """The reasons the attentions in ``model`` give for not being compiled (``AttentionBase.compile_fallback``),
    each once; empty when every one compiles."""
    reasons = []
    for m in model.modules():
        hook = getattr(m, "compile_fallback", None)
        reason = hook() if isinstance(m, AttentionBase) and callable(hook) else None
        if reason and reason not in reasons:
            reasons.append(reason)
    return reasons


def compiled_or_eager(model: torch.nn.Module) -> tuple[torch.nn.Module, str | None]:
    """``torch.compile(model)``, or ``model`` itself with the reason when an attention in it declares a
    ``compile_fallback`` (its compiled fwd+bwd is slower than eager)."""
    reasons = compile_fallbacks(model)
    if reasons:
        return model, "; ".join(reasons)
    return torch.compile(model), None


def _time_shape(cases: dict, device: torch.device, modes, compile: bool, timing: dict) -> list[dict]:
    """Build, compile (optionally) and time every case of one shape in interleaved rounds."""
    rows, fns, meta = [], {}, {}
    for key, (base, spec) in cases.items():
        try:
            wl = build_workload(spec, device)
            fwd = analytic_flops(wl.model, wl.batch, wl.seq_len)
            counted = flop_counter_count(wl.model, wl.inputs)[0]
            params = count_params(wl.model)  # what explains most of a variant's memory: said beside it
            base = {**base, "params": params["total_params"], "attention_params": params["attention_params"],
                    "path": wl.compute_path()}
        except Exception as exc:  # noqa: BLE001 - an OOM is a row, anything else propagates
            rows += [_failure_row({**base, "mode": m, "compiled": c}, exc) for m in modes
                     for c in ((False, True) if compile else (False,))]
            free_memory(device)
            continue
        variants = [(False, wl.model, None)]
        if compile:
            compiled_model, fallback = compiled_or_eager(wl.model)
            if fallback:
                print(f"warning: {base['variant']}/{base['flavor']}: --compile falls back to eager ({fallback})",
                      file=sys.stderr)
            variants.append((True, compiled_model, fallback))
        for compiled, model, fallback in variants:
            for mode in modes:
                wl_c = type(wl)(model, wl.inputs, wl.loss, wl.spec)
                fn = step_fn(wl_c, MODES[mode])
                compile_s = None
                if compiled and not fallback:  # the first call compiles: timed apart, reported as compile time
                    t0 = time.perf_counter()
                    try:
                        fn()
                    except Exception as exc:  # noqa: BLE001
                        rows.append(_failure_row({**base, "mode": mode, "compiled": True}, exc))
                        continue
                    compile_s = time.perf_counter() - t0
                label = (key, mode, compiled)
                fns[label] = fn
                meta[label] = {**base, "mode": mode, "compiled": compiled, "compile_s": compile_s,
                               "compile_fallback": fallback if compiled else None,
                               "fwd_gflop_analytic": fwd / 1e9, "fwd_gflop_counted": counted / 1e9}
    results, failures = measure_interleaved(fns, device, **timing)
    for label, exc in failures.items():
        rows.append(_failure_row(meta[label], exc))
    for label, lat in results.items():
        m = meta[label]
        flops = m["fwd_gflop_analytic"] * (1 if m["mode"] == "fwd" else 3)  # backward ≈ 2 × forward
        message = "; ".join(x for x in (f"compiled row timed eager: {m['compile_fallback']}" if m.get(
            "compile_fallback") else "", m.get("gate_note", "")) if x)
        rows.append({**m, "status": "ok", "message": message, "latency_median_ms": lat.median_ms,
                     "latency_q25_ms": lat.q25_ms, "latency_q75_ms": lat.q75_ms, "latency_iqr_ms": lat.iqr_ms,
                     "repeats": lat.repeats, "unstable": lat.unstable, "unstable_reason": lat.unstable_reason,
                     **{k: lat.load.get(k) for k in LOAD_KEYS},
                     "achieved_gflops": flops / (lat.median_ms * 1e-3)})
    fns.clear()
    return rows


def _memory(rows: list[dict], specs: dict, device: torch.device) -> None:
    """Peak memory of one step per eager ok row (fresh process on CPU); compiled rows are not measured."""
    todo = [r for r in rows if r["status"] == "ok" and not r["compiled"]]
    items = [memory_item(specs[(r["variant"], r["flavor"], r["dtype"], r["batch"], r["seq_len"], r["d_model"],
                                r["n_heads"])],
                         MODES[r["mode"]], threads=torch.get_num_threads()) for r in todo]
    kind = "peak_alloc_mib" if device.type == "cuda" else "peak_rss_mib"
    for r, res in zip(todo, measure_memory_many(items, device, workers=1) if items else []):
        r["peak_mib"], r["memory_kind"] = res.get(kind), kind
        if res["status"] != "ok":  # never a NaN marked ok: the row carries the measurement's status and reason
            r["status"], r["message"] = res["status"], f"memory: {res['message']}"
            print(f"warning: {r['variant']}/{r['flavor']} {r['mode']}: peak memory not measured ({res['message']})",
                  file=sys.stderr)


def _ratios(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["batch", "seq_len", "d_model", "n_heads", "causal", "mode", "dtype", "compiled"]
    base = df[(df["variant"] == BASELINE) & (df["status"] == "ok")].set_index(keys)
    idx = pd.MultiIndex.from_frame(df[keys])
    for col, out in (("latency_median_ms", "latency_vs_mha"), ("peak_mib", "memory_vs_mha")):
        ref = base[col].reindex(idx).to_numpy() if not base.empty else float("nan")
        df[out] = pd.to_numeric(df[col], errors="coerce") / ref
    eager = df[~df["compiled"]].set_index(["variant", "flavor", *keys[:-1]])["latency_median_ms"]
    ekeys = pd.MultiIndex.from_frame(df[["variant", "flavor", *keys[:-1]]])
    df["compiled_vs_eager"] = (df["latency_median_ms"] / eager.reindex(ekeys).to_numpy()).where(df["compiled"])
    return df


def benchmark(variants: str | Iterable[str] = "*", shapes: Iterable[Sequence[int]] = ((4, 512, 256, 8),), *,
              device: str | torch.device = "auto", dtype: str | Sequence[str] = "fp32",
              modes: Sequence[str] = ("fwd", "fwd_bwd"),
              compile: bool = False, flavors: Sequence[str] = ("paper",), causal: bool = False, memory: bool = True,
              warmup: int = 2, repeats: int | None = None, min_time_s: float = 1.0, min_repeats: int = 10,
              progress: bool = False) -> pd.DataFrame:
    """Latency (median, IQR, noise-guard verdict), peak memory, analytic and counted FLOPs, achieved FLOP/s and ratios
    to MHA of every variant × flavour × shape × mode; one row each (see ``COLUMNS``).

    ``variants``: names or wildcards (a string "mha,d*" or a list); MHA is always added as the baseline.
    ``shapes``: (batch, seq_len, d_model, n_heads) tuples. ``dtype``: fp32, or bf16/fp16 under autocast, or several
    of them (one row each; the ``dtype`` column says which). ``flavors``: paper and/or damcha_repo (the CLI's
    ``--flavors``). Before any timing each variant × flavour × dtype passes the correctness gate
    (``measure.gate``): a variant that fails gets ``incorrect`` rows with the reason and no speed. Every row carries
    the model's total and attention parameter counts.
    ``compile``: also time ``torch.compile``d modules (compile time in ``compile_s``, ratio in ``compiled_vs_eager``).

    A case whose output (``fwd``) or loss (``fwd_bwd``) is NaN or infinite gives a ``nan`` row, an out-of-memory
    one an ``oom`` row; neither has numbers.

    Raises:
        ValueError: an unknown variant, flavour, mode or dtype, a bad shape (non-int sizes included), a non-bool
            ``compile``/``causal``/``memory``/``progress`` or a bad timing setting (``warmup`` < 0, ``repeats`` or
            ``min_repeats`` < 1, ``min_time_s`` not finite and >= 0).
    """
    for arg, value in (("compile", compile), ("causal", causal), ("memory", memory), ("progress", progress)):
        if not isinstance(value, bool):
            raise ValueError(f"{arg}: expected a bool, got {value!r}")
    check_timing(warmup, repeats, min_time_s, min_repeats, max_repeats=min_repeats)
    names = select_attentions(variants if isinstance(variants, str) else ",".join(variants))
    if BASELINE not in names:
        names = [BASELINE, *names]
    shapes = [_shape(s) for s in shapes]
    if not shapes:
        raise ValueError("shapes: expected at least one (batch, seq_len, d_model, n_heads) tuple")
    dtypes = [dtype] if isinstance(dtype, str) else list(dtype)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"dtype: expected one or more of {', '.join(DTYPES)}, got {dtype!r}")
    modes = [modes] if isinstance(modes, str) else list(modes)
    flavors = [flavors] if isinstance(flavors, str) else list(flavors)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes: expected a non-empty subset of {', '.join(MODES)}, got {list(modes)!r}")
    bad = [f for f in flavors if f not in ("paper", "damcha_repo")]
    if bad or not flavors:
        raise ValueError(f"flavors: expected paper and/or damcha_repo, got {list(flavors)!r}")
    device = resolve_device(str(device))
    timing = {"warmup": warmup, "repeats": repeats, "min_time_s": min_time_s, "min_repeats": min_repeats}
    with private_rng(device):
        rows, specs = _run(names, shapes, device, dtypes, modes, compile, flavors, causal, timing, progress)
    if memory:
        _memory(rows, specs, device)
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    df["compiled"] = df["compiled"].astype(bool)
    return _ratios(df)


def _run(names, shapes, device, dtypes, modes, compile, flavors, causal, timing, progress) -> tuple[list, dict]:
    """Every case's rows, shape by shape, and the workload spec of each (variant, flavour, dtype, shape)."""
    rows, specs, gate, gate_notes = [], {}, {}, {}
    for shape in tqdm(shapes, desc="bench", disable=not progress, unit="shape"):
        cases = {}
        for name in names:
            if causal and not get_attention_spec(name).causal_ok:
                continue
            for flavor in _flavors(name, flavors):
                for dtype in dtypes:
                    base = {"variant": name, "flavor": flavor, "batch": shape[0], "seq_len": shape[1],
                            "d_model": shape[2], "n_heads": shape[3], "causal": causal, "dtype": dtype,
                            "device": device.type, "device_name": device_name(device), "cpu_model": cpu_model()}
                    if (name, flavor, dtype) not in gate:  # correctness before speed, once per variant and dtype
                        amp = DTYPES[dtype]
                        notes = gate_notes.setdefault((name, flavor, dtype), [])
                        gate[(name, flavor, dtype)] = check_variant(
                            name, {"flavor": flavor}, getattr(torch, amp) if amp else torch.float32, device,
                            autocast=amp is not None, notes=notes)
                        if gate[(name, flavor, dtype)]:
                            announce_refusal(f"{name}/{flavor} {dtype}", gate[(name, flavor, dtype)])
                    if gate[(name, flavor, dtype)]:
                        why = gate[(name, flavor, dtype)]
                        rows += [{**base, "mode": m, "compiled": False, "status": gate_status(why),
                                  "message": f"correctness gate: {why}"} for m in modes]
                        continue
                    spec = _case_spec(name, flavor, shape, causal, DTYPES[dtype])
                    specs[(name, flavor, dtype, *shape)] = spec
                    if gate_notes.get((name, flavor, dtype)):  # how the gate compared, said in the row
                        base["gate_note"] = "correctness gate: " + "; ".join(gate_notes[(name, flavor, dtype)])
                    cases[(name, flavor, dtype)] = (base, spec)
        rows += _time_shape(cases, device, modes, compile, timing)
    return rows, specs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter,
                                epilog="python -m attention_zoo.bench train [...]: the training-throughput mode "
                                       "(CPU time per seed-step of the synthetic sweeps' models); train --task lm|vit "
                                       "[...]: the decide presets' stand-ins (Tables 5, 6), one model at a time vs "
                                       "a seed ensemble; train --help lists the flags")
    p.add_argument("--variants", default="*", help="comma-separated names or wildcards; MHA is always added")
    p.add_argument("--flavors", "--flavor", "--flavour", dest="flavors", nargs="+",
                   choices=("paper", "damcha_repo", "both"), default=["paper"],
                   help="baseline flavour(s) (benchmark(flavors=...)); both = paper damcha_repo; variants without "
                        "the flavour run their paper method")
    p.add_argument("--batch", type=positive_int, nargs="+", default=[4], help="batch sizes")
    p.add_argument("--seq-len", type=positive_int, nargs="+", default=[512], help="sequence lengths")
    p.add_argument("--d-model", type=positive_int, nargs="+", default=[256], help="model widths")
    p.add_argument("--heads", type=positive_int, nargs="+", default=[8], help="head counts (must divide d_model)")
    p.add_argument("--causal", action="store_true", help="causal masking")
    p.add_argument("--modes", nargs="+", choices=tuple(MODES), default=list(MODES), help="what is timed")
    p.add_argument("--dtype", nargs="+", choices=tuple(DTYPES), default=["fp32"],
                   help="fp32, or bf16/fp16 under autocast; several values give one row each (dtype column)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd modules")
    p.add_argument("--device", action=DeviceAction, default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed rounds")
    p.add_argument("--repeats", type=positive_int, default=None, help="a fixed number of timed rounds")
    p.add_argument("--min-time", type=positive_float, default=1.0, help="seconds of timed work per case, at least")
    p.add_argument("--min-repeats", type=positive_int, default=10, help="timed calls per case, at least")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory measurement")
    p.add_argument("--results-file", type=Path, default=None, help="CSV of the rows (an .env.json beside it)")
    p.add_argument("--plot", type=Path, default=None,
                   help="PNG: a bar chart of latency and memory for one shape, else latency and memory vs T")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    add_include_argument(p)
    return p


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # the training-throughput modes: the stand-ins (--task lm|vit,
        if any(a == "--task" or a.startswith("--task=") for a in argv[1:]):  # efficiency/train_throughput.py)
            from .experiments.efficiency.train_throughput import main as throughput_main

            return throughput_main(argv[1:])
        from .experiments.synthetic.train_speed import main as train_main  # the synthetic cells

        return train_main(argv[1:])
    if argv[:1] == ["decode"]:  # cached generation: per-token latency and memory vs context (measure/decode.py)
        from .measure.decode import main as decode_main

        return decode_main(argv[1:])
    if argv[:1] == ["compare"]:  # two saved runs, case by case (measure/compare.py)
        from .measure.compare import main as compare_main

        return compare_main(argv[1:])
    args = build_parser().parse_args(argv)
    for arg, path in (("results-file", args.results_file), ("plot", args.plot)):  # before any work
        if path is not None:
            ensure_out_file(path, arg, figure=arg == "plot")
    setup_threads(args.threads)
    shapes = [(b, t, d, h) for b in args.batch for t in args.seq_len for d in args.d_model for h in args.heads]
    flavors = [f for f in ("paper", "damcha_repo") if f in args.flavors or "both" in args.flavors]
    df = benchmark(args.variants, shapes, device=args.device, dtype=args.dtype, modes=args.modes,
                   compile=args.compile, flavors=flavors, causal=args.causal, memory=args.memory,
                   warmup=args.warmup, repeats=args.repeats, min_time_s=args.min_time,
                   min_repeats=args.min_repeats, progress=not args.quiet)
    errors = df[df["status"] == "error"]
    for r in errors.itertuples():
        print(f"warning: {r.variant}/{r.flavor} {r.mode} T={r.seq_len}: failed ({r.message})", file=sys.stderr)
    for r in df[df["unstable"] == True].itertuples():  # noqa: E712 - NaN rows (failed cases) are not unstable
        print(f"warning: {r.variant}/{r.flavor} {r.mode} T={r.seq_len}: unstable timing ({r.unstable_reason})",
              file=sys.stderr)
    if args.results_file:
        atomic_write_csv(df, args.results_file)
        env = environment_record(resolve_device(args.device), command_args=vars(args))
        atomic_write_json(Path(f"{args.results_file}.env.json"), json.loads(json.dumps(env, default=str)))
    if args.plot:
        plot(df, args.plot, "fwd_bwd" if "fwd_bwd" in args.modes else args.modes[0])
    if not args.quiet:
        cols = ["variant", "flavor", "dtype", "batch", "seq_len", "d_model", "n_heads", "mode", "compiled", "params",
                "latency_median_ms", "latency_iqr_ms", "latency_vs_mha", "peak_mib", "memory_vs_mha",
                "achieved_gflops", "unstable"]
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 1 if len(errors) else 0  # as the sweep launchers: every row written, the failure in the exit code


if __name__ == "__main__":
    sys.exit(main())
