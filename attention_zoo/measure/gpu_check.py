"""The prepared script for a lent GPU: ``tox -e gpu`` (``python -m attention_zoo.measure.gpu_check``).

One run of at most ten minutes on one H200 that gets the most from a machine lent for a short time; a failure in
one step is reported and the next step runs. Estimated times (H200, warm pip cache excluded):

1. **dtype smoke loop** (≈ 1 min): every variant and control, as a layer and a 2-layer Decoder, one fwd+bwd under
   bf16 autocast, fp16 autocast and with bf16 weights; each failure printed with the file:line it came from.
2. **GPU tests and a profiler pass** (≈ 3 min): ``pytest -m gpu``; then the Table 2 WMT decoder cell (B 32, T 256,
   D 128, 4 layers, bf16 autocast) for MHA, THA, DCMHA and MoA under ``torch.profiler``: kernel count, summed
   kernel time and the SDPA kernels that ran, beside the harness's own median for the same step.
3. **Measurements** (≈ 5 min): Table 2 at the CIFAR setting for five variants, and the quick benchmark in bf16.

Everything is written under ``--out`` (default ``results/gpu/``), with the device named in every file; the exit
status is the number of steps that failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

STEP_TIMEOUT_S = {"pytest": 240, "table2": 240, "quick": 200}
WMT = dict(kind="decoder", batch=32, seq_len=256, d_model=128, n_heads=8, d_ff=256, n_layers=4, vocab_size=256)


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame in this package (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "attention_zoo" in f.filename] or frames
    f = ours[-1] if ours else None
    return f"{Path(f.filename).name}:{f.lineno}" if f else "?"


def dtype_loop(device: str) -> list[str]:
    from ..registry import list_attentions
    from .latency import step_fn
    from .workload import build_workload, workload_spec

    failures = []
    for name in list_attentions(include_controls=True):
        for kind in ("attention", "decoder"):
            for label, extra in (("bf16 autocast", {"amp": "bfloat16"}), ("fp16 autocast", {"amp": "float16"}),
                                 ("bf16 weights", {"dtype": "bfloat16"})):
                spec = workload_spec(kind=kind, attention=name, causal=True, batch=2, seq_len=64, d_model=64,
                                     n_heads=4, n_layers=2, **extra)
                try:
                    loss = step_fn(build_workload(spec, device), "fwd_bwd")()
                    if torch.device(device).type == "cuda":
                        torch.cuda.synchronize()
                    if not torch.isfinite(loss).item():
                        raise FloatingPointError("non-finite loss")
                except Exception as exc:  # noqa: BLE001 — every failure is listed, the loop goes on
                    failures.append(f"{name} {kind} {label}: {type(exc).__name__}: {exc} ({_where(exc)})")
    return failures


def profile_wmt(device: str, names=("mha", "tha", "dcmha", "moa")) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from .latency import measure_latency, step_fn
    from .workload import build_workload, workload_spec

    rows = []
    for name in names:
        try:
            fn = step_fn(build_workload(workload_spec(attention=name, amp="bfloat16", **WMT), device), "fwd_bwd")
            median = measure_latency(fn, device, warmup=3, min_time_s=0.5).median_ms
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            sdpa = sorted({e.name for e in kernels if any(k in e.name.lower() for k in
                                                           ("flash", "fmha", "attention", "cudnn", "sdpa"))})
            rows.append({"variant": name, "harness_median_ms": median, "kernels": len(kernels),
                         "kernel_time_ms": sum(e.device_time for e in kernels) / 1e3,
                         "sdpa_kernels": "; ".join(sdpa)})
        except Exception as exc:  # noqa: BLE001
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc} ({_where(exc)})"})
    return rows


def _run(cmd: list[str], timeout: int, log: Path) -> str | None:
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    log.write_text(proc.stdout + proc.stderr)
    print(f"  {' '.join(cmd[1:4])}…: exit {proc.returncode} in {time.time() - t0:.0f} s (log: {log})")
    return None if proc.returncode == 0 else f"exit {proc.returncode} (see {log})"


def _ok(out) -> bool:
    """A step's result: None (a command that passed), an error string, failure strings, or profile rows."""
    if out is None:
        return True
    if isinstance(out, str):
        return False
    return not any(isinstance(x, str) or "error" in x for x in out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.measure.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("results") / "gpu")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device visible", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(torch.device(args.device))
    report = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "steps": {}}
    failed = 0
    steps = [
        ("1 dtype smoke loop", lambda: dtype_loop(args.device)),
        ("2a pytest -m gpu", lambda: _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py",
                                           "tests/test_hardening4.py"], STEP_TIMEOUT_S["pytest"],
                                          args.out / "pytest_gpu.log")),
        ("2b profiler pass (WMT decoder cell)", lambda: profile_wmt(args.device)),
        ("3a Table 2, CIFAR setting", lambda: _run(
            [sys.executable, "reproduce/table2_efficiency.py", "--device", args.device, "--settings", "cifar",
             "--variants", "mha,tha,dcmha,moa,damcha", "--out", str(args.out / "table2_efficiency")],
            STEP_TIMEOUT_S["table2"], args.out / "table2.log")),
        ("3b quick benchmark, bf16", lambda: _run(
            [sys.executable, "-m", "attention_zoo.measure.quick", "--device", args.device, "--variants", "*",
             "--dtype", "bf16", "--csv", str(args.out / "quick_bf16.csv"), "--md", str(args.out / "quick_bf16.md")],
            STEP_TIMEOUT_S["quick"], args.out / "quick.log")),
    ]
    for title, step in steps:
        print(f"[{title}] on {name}")
        t0 = time.time()
        try:
            out = step()
        except Exception as exc:  # noqa: BLE001 — the next step still runs
            out = f"{type(exc).__name__}: {exc} ({_where(exc)})"
        bad = not _ok(out)
        failed += bad
        report["steps"][title] = {"seconds": round(time.time() - t0, 1), "ok": not bad, "result": out}
        for line in (out if isinstance(out, list) else [out] if out else []):
            print(f"  {line}")
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"{failed} of {len(steps)} steps failed; report: {args.out / 'gpu_check.json'} (device {name})")
    return failed


if __name__ == "__main__":
    sys.exit(main())
