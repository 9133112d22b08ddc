"""Quick benchmark (issue 2, "Performance"): ``python -m attention_zoo.measure.quick``.

In one run: the machine's fp32 GEMM rate (2048² matmul); forward+backward time and peak memory of single
attention layers (non-causal and causal) at B=4, T=512, D=256, H=8; and of a 4-layer causal Decoder (vocab 256,
stack-shared DAMCHA generator). Achieved GFLOP/s = 3 × analytic forward FLOPs / fwd+bwd median time (backward
≈ 2 × forward). Peak memory is of one forward+backward step (no optimizer): CUDA ``max_memory_allocated`` minus
the baseline, CPU peak RSS of a fresh forked process minus its baseline (MiB).

Targets it reports on: MHA reaches ≥ 65 % of the GEMM rate; the non-causal DAMCHA layer is no slower than MHA
and counts fewer FLOPs; the causal shared DAMCHA Decoder's peak memory is ≤ 1.5 × the MHA Decoder's.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from ..envinfo import device_name, resolve_device
from ..io import atomic_write_csv
from ..registry import get_attention_spec, is_attention, list_attentions
from .flops import analytic_flops
from .latency import measure_latency, measure_model_latency
from .memory import measure_memory_many, memory_item
from .status import guarded
from .workload import build_workload, workload_spec

BASELINE, METHOD = "mha", "damcha"


def select(spec: str) -> list[str]:
    """Comma-separated names or wildcards -> registered names; ValueError lists the available ones."""
    names = []
    for pat in (s.strip() for s in spec.split(",") if s.strip()):
        hits = list_attentions(pat)
        if not hits:
            raise ValueError(f"variants: {pat!r} matches no registered attention; available: "
                             f"{', '.join(list_attentions())}")
        names += [h for h in hits if h not in names]
    return names


def gemm_gflops(device: torch.device, n: int = 2048, warmup: int = 3, repeats: int = 10) -> float:
    """fp32 GEMM rate of an n×n by n×n matmul (2n³ FLOPs / median time)."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device) for _ in range(2))
    res = measure_latency(lambda: a @ b, device, warmup, repeats)
    return 2 * n**3 / (res.median_ms * 1e-3) / 1e9


def cases(names: list[str], args) -> list[tuple[str, dict]]:
    """(label, workload spec) for each variant: layer non-causal, layer causal, 4-layer causal Decoder."""
    base = dict(d_model=args.d_model, n_heads=args.heads, batch=args.batch, seq_len=args.seq_len)
    out = []
    for name in names:
        out.append((f"{name} layer non-causal", workload_spec(attention=name, causal=False, **base)))
        if get_attention_spec(name).causal_ok:
            out.append((f"{name} layer causal", workload_spec(attention=name, causal=True, **base)))
            out.append((f"{name} decoder {args.layers}L causal", workload_spec(
                kind="decoder", attention=name, n_layers=args.layers, vocab_size=args.vocab, share_mlp=True, **base)))
    return out


def run_case(spec: dict, device: torch.device, warmup: int, repeats: int) -> dict:
    def measure():
        wl = build_workload(spec, device)
        fwd = analytic_flops(wl.model, wl.batch, wl.seq_len)
        lat = measure_model_latency(wl, "fwd_bwd", device, warmup, repeats)
        return {"fwd_gflop": fwd / 1e9, "fwd_bwd_ms": lat.median_ms, "iqr_ms": lat.iqr_ms,
                "achieved_gflops": 3 * fwd / (lat.median_ms * 1e-3) / 1e9}

    return guarded(measure, device)


def _ratio(rows: dict, a: str, b: str, key: str) -> float | None:
    ra, rb = rows.get(a, {}), rows.get(b, {})
    if ra.get(key) is None or rb.get(key) in (None, 0):
        return None
    return ra[key] / rb[key]


def summary_lines(rows: dict, gemm: float, layers: int) -> list[str]:
    def fmt(v, spec=".3f"):
        return "n/a" if v is None else format(v, spec)

    def verdict(ok):
        return "n/a" if ok is None else ("meets target" if ok else "misses target")

    mha = rows.get(f"{BASELINE} layer non-causal", {}).get("achieved_gflops")
    pct = None if mha is None else 100 * mha / gemm
    t = _ratio(rows, f"{METHOD} layer non-causal", f"{BASELINE} layer non-causal", "fwd_bwd_ms")
    f = _ratio(rows, f"{METHOD} layer non-causal", f"{BASELINE} layer non-causal", "fwd_gflop")
    dec = f"decoder {layers}L causal"
    m = _ratio(rows, f"{METHOD} {dec}", f"{BASELINE} {dec}", "peak_mib")
    return [
        f"MHA layer achieved / GEMM rate: {fmt(pct, '.1f')} % (target >= 65 %): "
        f"{verdict(None if pct is None else pct >= 65)}",
        f"DAMCHA/MHA non-causal layer fwd+bwd time: {fmt(t)} (target <= 1): {verdict(None if t is None else t <= 1)}",
        f"DAMCHA/MHA non-causal layer analytic FLOPs: {fmt(f)} (target < 1): {verdict(None if f is None else f < 1)}",
        f"DAMCHA/MHA causal shared decoder peak memory: {fmt(m)} (target <= 1.5): "
        f"{verdict(None if m is None else m <= 1.5)}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.measure.quick", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated names/wildcards (default: {BASELINE},{METHOD} where registered)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=4, help="decoder layers")
    p.add_argument("--vocab", type=int, default=256, help="decoder vocabulary")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=None, help="optional CSV of the rows")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.variants is None:
        names = [n for n in (BASELINE, METHOD) if is_attention(n)]
        for n in (BASELINE, METHOD):
            if not is_attention(n):
                print(f"[skip] '{n}' is not registered yet: its rows are skipped", file=sys.stderr)
    else:
        names = select(args.variants)

    print(f"device: {device_name(device)} ({device}), torch {torch.__version__}, threads {torch.get_num_threads()}")
    gemm = gemm_gflops(device)
    print(f"fp32 GEMM 2048x2048: {gemm:.1f} GFLOP/s")
    todo = cases(names, args)
    rows = {}
    for label, spec in todo:
        rows[label] = run_case(spec, device, args.warmup, args.repeats)
    mem = measure_memory_many([memory_item(spec, "fwd_bwd", threads=torch.get_num_threads()) for _, spec in todo],
                              device, workers=1)
    unit = "peak_alloc_mib" if device.type == "cuda" else "peak_rss_mib"
    for (label, _), res in zip(todo, mem):
        rows[label]["peak_mib"] = res.get(unit)
        if res["status"] != "ok":
            rows[label]["message"] = (rows[label].get("message") or "") + f" memory: {res['message']}"

    print(f"\nB={args.batch} T={args.seq_len} D={args.d_model} H={args.heads}; fwd+bwd median; "
          f"memory = {unit} of one fwd+bwd step")
    header = f"{'case':<34} {'fwd GFLOP':>10} {'fwd+bwd ms':>11} {'IQR ms':>8} {'GFLOP/s':>9} {'% GEMM':>7} {'MiB':>9}"
    print(header)
    for label, r in rows.items():
        if r["status"] != "ok":
            print(f"{label:<34} skipped ({r['status'].upper()}): {r['message']}")
            continue
        peak = "n/a" if r.get("peak_mib") is None else f"{r['peak_mib']:.1f}"
        print(f"{label:<34} {r['fwd_gflop']:>10.3f} {r['fwd_bwd_ms']:>11.2f} {r['iqr_ms']:>8.2f} "
              f"{r['achieved_gflops']:>9.1f} {100 * r['achieved_gflops'] / gemm:>6.1f}% {peak:>9}")
    print()
    for line in summary_lines(rows, gemm, args.layers):
        print(line)
    if args.out:
        import pandas as pd

        frame = pd.DataFrame([{"case": k, **v, "gemm_gflops": gemm, "device": str(device)} for k, v in rows.items()])
        atomic_write_csv(frame, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
