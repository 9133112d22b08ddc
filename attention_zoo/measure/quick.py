"""Quick benchmark: ``python -m attention_zoo.measure.quick``.

In one run: the machine's fp32 GEMM rate (2048² matmul, timed as one more case of the interleaved rounds, so a
% of the GEMM rate compares times taken under the same load); forward+backward time and peak memory of single
attention layers (non-causal and causal) at B=4, T=512, D=256, H=8; and of a 4-layer causal Decoder (vocab 256,
stack-shared DAMCHA generator). Achieved GFLOP/s = 3 × analytic forward FLOPs / fwd+bwd median time (backward
≈ 2 × forward). Peak memory is of one forward+backward step (no optimizer): CUDA ``max_memory_allocated`` minus
the baseline, CPU peak RSS of a fresh forked process minus its baseline (MiB).

``ops/step (meta)``: the non-view ATen ops of one fwd+bwd counted on the meta device in bfloat16 (``opcount``: the
kernels an accelerator would launch).

``--variants '*' --flavor both`` runs every variant in each flavour; all cases are built first and timed in
interleaved rounds (A B C … A B C …) in one process, reported as median and IQR with the ratio to MHA's case of the
same kind (layer non-causal, layer causal, decoder), % of the GEMM rate, peak memory and its ratio to MHA's, and
the noise guard's verdict: a case is ``unstable`` when its IQR/median exceeds 10 %, the machine was busy during the
interleaved timing (load average and other processes' CPU time are recorded around it), or its achieved rate
exceeds the GEMM rate. ``--csv`` / ``--md`` write the table.

The performance targets (``TARGETS``: the ratio and GEMM-rate bounds the project holds its variants to) are
checked against the rows that ran and printed with
their verdicts; ``--extra damcha:collapsed_generator=true`` adds the collapsed-generator rows one of them needs.
The CPU model is printed and written with every figure (markdown header, ``cpu_model`` column): ratios differ
between CPU kinds. ``mha_breakdown`` (off with ``--no-breakdown``) splits MHA's layer time into its projection
GEMMs, the SDPA core and the rest (head split/merge copies, bias gradients, autograd), each with its share of the
layer and of the GEMM rate.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from ..cli import DeviceAction, HelpFormatter, cli_main, non_negative_int, positive_int
from ..envinfo import cpu_model, device_name, huge_pages, resolve_device, retain_wanted, setup_threads
from ..io import atomic_write_csv, atomic_write_text
from ..plugins import add_include_argument
from ..registry import get_attention_spec, is_attention, parse_option_rows, select_attentions
from ..results import ensure_out_file
from .breakdown import breakdown_lines, mha_breakdown
from .flops import analytic_flops
from .gate import announce_refusal, check_variant, gate_status
from .gemm import gemm_description, interleaved_with_gemm
from .latency import LOAD_KEYS, step_fn
from .memory import measure_memory_many, memory_item
from .opcount import count_ops
from .params import count_params
from .plain_loop import plain_loop_times
from .status import failure_status, guarded, short_message
from .targets import summary_lines
from .workload import DTYPES, build_workload, workload_spec

BASELINE, METHOD = "mha", "damcha"


def flavors_of(name: str, flavor: str) -> list[str]:
    """The flavours to run for a variant: ``paper``, ``damcha_repo`` or ``both``; a variant without the flavour
    asked for (MHA, DAMCHA: one method each) runs its paper method, as in every other CLI."""
    have = get_attention_spec(name).flavors
    want = have if flavor == "both" else (flavor,)
    return [f for f in want if f in have] or ["paper"]


def cases(names: list[str], args) -> list[tuple[str, dict]]:
    """(label, workload spec) per variant and flavour, then per ``--extra`` option setting: layer non-causal,
    layer causal, N-layer causal Decoder."""
    amp = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}[getattr(args, "dtype", "fp32")]
    base = dict(d_model=args.d_model, n_heads=args.heads, batch=args.batch, seq_len=args.seq_len, amp=amp)
    rows = [(name, f"{name}[{flavor}]" if flavor != "paper" else name, {"flavor": flavor})
            for name in names for flavor in flavors_of(name, getattr(args, "flavor", "paper"))]
    rows += [(name, label, options) for name, options, label in parse_option_rows(getattr(args, "extra", []))]
    out = []
    for name, tag, options in rows:
        opts = {"options": options}
        out.append((f"{tag} layer non-causal", workload_spec(attention=name, causal=False, **opts, **base)))
        if get_attention_spec(name).causal_ok:
            out.append((f"{tag} layer causal", workload_spec(attention=name, causal=True, **opts, **base)))
            out.append((f"{tag} decoder {args.layers}L causal", workload_spec(
                kind="decoder", attention=name, n_layers=args.layers, vocab_size=args.vocab, share_mlp=True,
                **opts, **base)))
    return out


def run_interleaved(todo: list[tuple[str, dict]], device: torch.device, warmup: int, rounds: int
                    ) -> tuple[dict, float]:
    """Build every case, then time one fwd+bwd step of each in turn (A B C … A B C …), ``rounds`` times, so that
    machine-load drift hits every case alike; per case the median and IQR of its rounds (a LatencyResult). The GEMM
    reference is one more case of the same rounds, so a % of the GEMM rate compares times taken alike. Returns
    (rows, GEMM rate in GFLOP/s)."""
    rows, live, gate, notes = {}, {}, {}, {}
    for label, spec in todo:
        key = (spec["attention"], repr(sorted(spec["options"].items())), spec["dtype"], spec["amp"])
        if key not in gate:  # correctness before speed: no time is reported for a variant that fails
            gate[key] = check_variant(spec["attention"], spec["options"], DTYPES[spec["amp"] or spec["dtype"]], device,
                                      autocast=spec["amp"] is not None, notes=notes.setdefault(key, []))
            if gate[key] is not None:
                opts = f" {spec['options']}" if spec["options"] else ""
                announce_refusal(f"{spec['attention']}{opts} {spec['amp'] or spec['dtype']}", gate[key])
        if gate[key] is not None:
            rows[label] = {"status": gate_status(gate[key]), "message": f"correctness gate: {gate[key]}"}
            continue

        def build(spec=spec):
            wl = build_workload(spec, device)
            return {"wl": wl, "spec": spec, "fn": step_fn(wl, "fwd_bwd"),
                    "fwd": analytic_flops(wl.model, wl.batch, wl.seq_len),
                    "params": count_params(wl.model), "launch": count_ops(spec), "path": wl.compute_path()}

        res = guarded(build, device)
        if res["status"] == "ok":
            live[label] = res
        else:
            rows[label] = {"status": res["status"], "message": res.get("message")}
    fns = {label: case["fn"] for label, case in live.items()}
    results, failures, gemm = interleaved_with_gemm(fns, device, warmup, rounds)
    for label, exc in failures.items():  # an OOM or a NaN/inf loss is a row; anything else is a bug
        status = failure_status(exc)
        if status is None:
            raise exc
        rows[label] = {"status": status, "message": short_message(exc)}
    for label, lat in results.items():
        fwd = live[label]["fwd"]
        params = live[label]["params"]
        key = (live[label]["spec"]["attention"], repr(sorted(live[label]["spec"]["options"].items())),
               live[label]["spec"]["dtype"], live[label]["spec"]["amp"])
        note = "correctness gate: " + "; ".join(notes[key]) if notes.get(key) else None
        rows[label] = {"status": "ok", "message": note, "params": params["total_params"],
                       "aten_ops_meta": live[label]["launch"]["ops"], "host_syncs_meta": live[label]["launch"]["syncs"],
                       "path": live[label]["path"],
                       "attention_params": params["attention_params"], "fwd_gflop": fwd / 1e9,
                       "fwd_bwd_ms": lat.median_ms,
                       "iqr_ms": lat.iqr_ms, "q25_ms": lat.q25_ms, "q75_ms": lat.q75_ms,
                       "achieved_gflops": 3 * fwd / (lat.median_ms * 1e-3) / 1e9,
                       "unstable": lat.unstable, "unstable_reason": lat.unstable_reason or None,
                       **{k: lat.load.get(k) for k in LOAD_KEYS}}
    live.clear()  # free the models before the memory is measured
    return {label: rows[label] for label, _ in todo}, gemm


def baseline_label(label: str) -> str:
    """The MHA case of the same kind: 'x[f] layer causal' -> 'mha layer causal'."""
    return f"{BASELINE} {label.split(' ', 1)[1]}"


def check_gemm_bound(rows: dict, gemm: float) -> None:
    """An achieved rate above the machine's GEMM rate is impossible: mark the row unstable and say why."""
    for r in rows.values():
        if r.get("status") == "ok" and r["achieved_gflops"] > gemm:
            why = f"achieved {r['achieved_gflops']:.0f} GFLOP/s > GEMM rate {gemm:.0f} GFLOP/s"
            r["unstable"] = True
            r["unstable_reason"] = f"{r['unstable_reason']}; {why}" if r.get("unstable_reason") else why


def add_ratios(rows: dict) -> None:
    """Per row: fwd+bwd time and peak memory relative to MHA's case of the same kind."""
    for label, r in rows.items():
        base = rows.get(baseline_label(label), {})
        for key, out in (("fwd_bwd_ms", "ms_vs_mha"), ("plain_ms", "plain_vs_mha"), ("plain_step_ms", "step_vs_mha"),
                         ("peak_mib", "mem_vs_mha")):
            ok = r.get(key) is not None and base.get(key) not in (None, 0)
            r[out] = r[key] / base[key] if ok else None


def table_rows(rows: dict, gemm: float) -> list[list[str]]:
    def f(v, spec):
        return "n/a" if v is None else format(v, spec)

    out = []
    for label, r in rows.items():
        if r.get("status") != "ok":
            out.append([label, f"skipped ({str(r.get('status')).upper()}): {r.get('message')}"] + [""] * 15)
            continue
        flag = {True: "UNSTABLE", False: "", None: "n/a"}[r.get("unstable")]
        out.append([label, f(r["params"] / 1e6, ".2f"), f(r["attention_params"] / 1e6, ".2f"),
                    f(r["fwd_gflop"], ".3f"), f(r["fwd_bwd_ms"], ".1f"), f(r["iqr_ms"], ".1f"),
                    f(r.get("ms_vs_mha"), ".2f"), f(r.get("plain_ms"), ".1f"), f(r.get("plain_vs_mha"), ".2f"),
                    f(r.get("plain_step_ms"), ".1f"), f(r.get("step_vs_mha"), ".2f"),
                    f(100 * r["achieved_gflops"] / gemm, ".1f"), f(r.get("peak_mib"), ".1f"),
                    f(r.get("mem_vs_mha"), ".2f"), f(r.get("aten_ops_meta"), "d"), flag])
    return out


HEADER = ["case", "params M", "attn params M", "fwd GFLOP", "fwd+bwd ms", "IQR ms", "x MHA", "plain fwd+bwd ms",
          "plain x MHA", "+AdamW ms", "step x MHA", "% GEMM", "peak MiB", "mem x MHA", "ops/step (meta)", "stability"]


def markdown(rows: dict, gemm: float, title: str) -> str:
    lines = [title, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rows, gemm)]
    return "\n".join(lines) + "\n"


def _ratio(rows: dict, a: str, b: str, key: str) -> float | None:
    ra, rb = rows.get(a, {}), rows.get(b, {})
    if ra.get(key) is None or rb.get(key) in (None, 0):
        return None
    return ra[key] / rb[key]


def plot(rows: dict, path, title: str, memory_unit: str = "peak memory") -> list:
    """Two figures, one panel per kind of case (layer non-causal, layer causal, decoder), each variant in its fixed
    colour, damcha_repo hatched: fwd+bwd time (q25–q75 error bars, unstable timings faded) in ``path``, and the
    peak memory of one fwd+bwd step (one measurement per case, no interval) beside it as ``<stem>_memory.png``."""
    import pandas as pd

    from ..plots import barh_plot

    recs = []
    for label, r in rows.items():
        if r.get("status") != "ok":
            continue
        name, kind = label.split(" ", 1)
        variant, _, flavor = name.partition("[")
        recs.append({"row": f"{variant}/{flavor.rstrip(']') or 'paper'}", "kind": kind, "value": r["fwd_bwd_ms"],
                     "q25": r.get("q25_ms"), "q75": r.get("q75_ms"), "unstable": bool(r.get("unstable")),
                     "peak_mib": r.get("peak_mib")})
    if not recs:
        return []
    df = pd.DataFrame(recs)
    out = [barh_plot(df, "row", "value", path, f"Quick benchmark: fwd+bwd time\n{title}",
                     "fwd+bwd time, median (ms)", panel="kind", flag="unstable", lo="q25", hi="q75")]
    mem = df.dropna(subset=["peak_mib"]).assign(value=lambda d: d["peak_mib"])
    if not mem.empty:
        p = Path(path)
        out.append(barh_plot(mem, "row", "value", p.with_name(f"{p.stem}_memory{p.suffix}"),
                             f"Quick benchmark: peak memory of one fwd+bwd step ({memory_unit}; one measurement "
                             f"per case, no interval)\n{title}", "peak memory (MiB)", panel="kind"))
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.measure.quick", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--device", action=DeviceAction, default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated names/wildcards (default: {BASELINE},{METHOD} where registered)")
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--seq-len", type=positive_int, default=512)
    p.add_argument("--d-model", type=positive_int, default=256)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--layers", type=positive_int, default=4, help="decoder layers")
    p.add_argument("--vocab", type=positive_int, default=256, help="decoder vocabulary")
    p.add_argument("--flavor", default="paper", choices=("paper", "damcha_repo", "both"),
                   help="flavour(s) of each variant; variants without the flavour run their paper method")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="fp32, or the forward under bf16/fp16 autocast (parameters stay fp32)")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed rounds")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed rounds (every case once per round)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--csv", "--out", dest="csv", default=None, help="optional CSV of the rows")
    p.add_argument("--md", default=None, help="optional markdown table of the rows")
    p.add_argument("--extra", nargs="*", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                   help="extra rows for option settings, e.g. damcha:metric_cache=recompute")
    p.add_argument("--plot", default=None, help="optional PNG: fwd+bwd time per case (q25-q75 error bars)")
    p.add_argument("--no-plain-loop", dest="plain_loop", action="store_false",
                   help="skip timing each case as a user's plain AdamW training step in a fresh process")
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                   help="skip timing MHA's parts (projections, SDPA core, the rest)")
    add_include_argument(p)
    args = p.parse_args(argv)
    for arg, path in (("csv", args.csv), ("md", args.md), ("plot", args.plot)):  # before any work
        if path is not None:
            ensure_out_file(path, arg, figure=arg == "plot")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    setup_threads(args.threads)
    device = resolve_device(args.device)
    if args.variants is None:
        names = [n for n in (BASELINE, METHOD) if is_attention(n)]
        for n in (BASELINE, METHOD):
            if not is_attention(n):
                print(f"[skip] '{n}' is not registered yet: its rows are skipped", file=sys.stderr)
    else:
        names = select_attentions(args.variants)
    if is_attention(BASELINE) and BASELINE not in names:
        names = [BASELINE, *names]  # every ratio is to MHA's case of the same kind

    env = (f"device: {device_name(device)} ({device}), CPU: {cpu_model()}, torch {torch.__version__}, "
           f"threads {torch.get_num_threads()}")
    if device.type == "cpu":
        env += f", huge pages {({True: 'on', False: 'off'}).get(huge_pages(), 'unknown')} (THP_MEM_ALLOC_ENABLE)"
        kept = {True: "kept for reuse", False: "returned"}.get(retain_wanted(), "unknown")
        env += f", freed memory {kept} while timing (ATTENTION_ZOO_MALLOC_RETAIN)"
    print(env)
    todo = cases(names, args)
    rows, gemm = run_interleaved(todo, device, args.warmup, args.repeats)
    print(f"{gemm_description(device)}, timed in the same rounds: {gemm:.1f} GFLOP/s")
    timed = [(label, spec) for label, spec in todo if rows[label].get("status") == "ok"]
    mem = measure_memory_many([memory_item(spec, "fwd_bwd", threads=torch.get_num_threads()) for _, spec in timed],
                              device, workers=1)
    unit = "peak_alloc_mib" if device.type == "cuda" else "peak_rss_mib"
    for (label, _), res in zip(timed, mem):
        rows[label]["peak_mib"] = res.get(unit)
        if res["status"] != "ok":
            rows[label]["message"] = (rows[label].get("message") or "") + f" memory: {res['message']}"
            print(f"warning: {label}: peak memory not measured ({res['status']}: {res['message']})", file=sys.stderr)
    if args.plain_loop:  # the speed a user gets: AdamW, zero_grad(set_to_none=True), glibc defaults, fresh process
        for label, res in plain_loop_times(dict(timed), device, args.warmup, args.repeats).items():
            rows[label].update(plain_ms=res.get("median_ms"), plain_iqr_ms=res.get("iqr_ms"),
                               plain_step_ms=res.get("step_median_ms"))
            if res["status"] != "ok":
                print(f"warning: {label}: plain loop not timed ({res['status']}: {res['message']})", file=sys.stderr)
    check_gemm_bound(rows, gemm)
    add_ratios(rows)

    mem_label = "CUDA max_memory_allocated" if device.type == "cuda" else "CPU peak RSS increment"
    title = (f"B={args.batch} T={args.seq_len} D={args.d_model} H={args.heads} {args.dtype}; fwd+bwd median (IQR) of "
             f"{args.repeats} interleaved rounds in the benchmark's timing setting; plain = a user's AdamW loop "
             f"(zero_grad(set_to_none=True), fwd, bwd, step) in a fresh process with the C library's defaults: its "
             f"fwd+bwd median and its whole step with AdamW; memory = {mem_label} of one fwd+bwd step; ratios to "
             f"MHA's case")
    print(f"\n{title}")
    widths = [max([36, *(len(label) for label in rows)]), 8, 13, 10, 11, 8, 7, 16, 12, 10, 10, 7, 9, 10, 15, 9]
    print(" ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(HEADER, widths))))
    for r in table_rows(rows, gemm):
        if len(r) > 2 and r[2] == "":
            print(f"{r[0]:<{widths[0]}} {r[1]}")
            continue
        print(" ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    unstable = [(k, v.get("unstable_reason")) for k, v in rows.items() if v.get("unstable")]
    for label, why in unstable:
        print(f"warning: {label}: unstable timing ({why})", file=sys.stderr)
    parts = None
    if args.breakdown and is_attention(BASELINE):
        parts, parts_gemm = mha_breakdown(device, args.batch, args.seq_len, args.d_model, args.heads, args.warmup,
                                          args.repeats)
        print(f"\nMHA layer, fwd+bwd, where the time goes ({args.repeats} interleaved rounds with the GEMM reference, "
              f"{parts_gemm:.1f} GFLOP/s):")
        for line in breakdown_lines(parts, parts_gemm):
            print(f"  {line}")
    print()
    # the targets were set on CPUs: on another device a launch-bound layer would "miss" them for other reasons
    targets = summary_lines(rows, gemm) if device.type == "cpu" else [
        f"The performance targets were set for CPUs and are not judged on {device.type}."]
    for line in targets:
        print(line)
    if args.csv:
        import pandas as pd

        where = {"gemm_gflops": gemm, "device": str(device), "device_name": device_name(device),
                 "cpu_model": cpu_model(), "threads": torch.get_num_threads()}
        recs = [{"case": k, **v, **where} for k, v in rows.items()]
        recs += [{"case": f"mha breakdown: {part}", "status": "ok", "fwd_bwd_ms": r["ms"], "iqr_ms": r["iqr_ms"],
                  "layer_share": r["share"], **where, "gemm_gflops": parts_gemm} for part, r in (parts or {}).items()]
        frame = pd.DataFrame(recs)
        atomic_write_csv(frame, args.csv)
    if args.plot:  # the figure names the machine too: ratios move with the CPU
        plot(rows, args.plot, f"{device_name(device)}, {torch.get_num_threads()} thread(s); {title}", mem_label)
    if args.md:
        text = markdown(rows, gemm, f"# Quick benchmark\n\n{env}; {gemm_description(device)} {gemm:.1f} GFLOP/s "
                                   f"(median of the same interleaved rounds as the cases)\n\n{title}")
        if parts:
            text += (f"\nMHA layer, fwd+bwd, where the time goes (its own interleaved rounds, with the GEMM reference "
                     f"at {parts_gemm:.1f} GFLOP/s in them):\n\n" + "".join(f"- {x}\n" for x in breakdown_lines(
                         parts, parts_gemm)))
        text += "\n" + "".join(f"- {x}\n" for x in targets)
        atomic_write_text(args.md, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
