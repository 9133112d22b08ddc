"""Training throughput of the synthetic cells (Appendix I): training steps per CPU-second of each arm, per path.

Four paths train the same seeds on the same data and batch order: ``legacy`` is the per-cell loop the sweep ran
before the grouped paths existed (one model at a time, default AdamW, ``clip_grad_norm_``, a ``loss.item()`` host
sync and a data gather every step); ``per-seed`` is ``fit``'s loop with one seed (fused AdamW, no per-step
sync); ``ensemble`` is the same loop with every seed grouped into one model (``engine.ensemble``; arms that cannot
be grouped have no ensemble row and say why); ``sweep`` is what the sweep runs: the seeds in ensembles sized by
``fit.ENSEMBLE_FLOPS`` (all of them for a small model, one by one for a large one). Rounds are interleaved
(each path of each arm, next round) in one process, so machine drift hits every path alike; the table reports the
median CPU time per seed-step with its IQR over rounds, the speed-up against ``legacy`` (median of the per-round
ratios), and the achieved GFLOP/s of the analytic training FLOPs (3 × forward) with its share of this CPU's fp32 GEMM
rate, which bounds any path.

    python -m attention_zoo.bench train --variants mha,damcha --shapes regression:1 classification:20
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ...cli import HelpFormatter, cli_main, non_negative_int, positive_int
from ...envinfo import environment_record, resolve_device, setup_threads
from ...io import atomic_write_csv, atomic_write_json, atomic_write_text
from ...measure.flops import analytic_flops
from ...measure.gemm import gemm_gflops
from ...registry import select_attentions
from ...report import markdown_table
from ...results import ensure_out_file
from .fit import Group
from .sweep import PRESETS, task_of

PATHS = ("legacy", "per-seed", "ensemble", "sweep")


def legacy_stepper(model: nn.Module, x, y, order, regression: bool, lr: float, steps: int):
    """The per-cell loop as it was: step(i) runs one update and syncs the loss to the host."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=0.1 * lr)
    losses = []

    def step(i: int) -> None:
        idx = order[i]
        xb, yb = x[idx], y[idx]
        out, aux = model(xb)
        loss = (F.mse_loss(out.squeeze(-1), yb) if regression else F.cross_entropy(out, yb)) + aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())

    return step


def _cpu(fn, start: int, n: int) -> float:
    """CPU seconds of ``fn(start)``, …, ``fn(start + n − 1)``."""
    t = time.process_time()
    for i in range(start, start + n):
        fn(i)
    return time.process_time() - t


def measure(variants: list[str], task: str, setting: float, n_seeds: int, steps: int, rounds: int, warmup: int,
            preset_name: str = "decide") -> pd.DataFrame:
    """Rows per arm and path: CPU seconds per seed-step over ``rounds`` interleaved rounds of ``steps`` steps."""
    preset = PRESETS[preset_name]
    fit = replace(preset.fit, max_steps=(warmup + rounds) * steps + 1)
    cell = {"task": task, "lam": setting if task == "regression" else None,
            "d_e": int(setting) if task == "classification" else preset.reg_d_e}
    t = task_of(cell, preset)
    seeds = list(range(n_seeds))
    arms, data = {}, None
    for v in variants:  # one copy of the data for every arm and path (ten seeds at d_e = 20 hold ≈ 1 GB)
        whole = Group(t, v, "paper", seeds, preset.n_layers, preset.attention_options, fit, torch.device("cpu"), True,
                      ensemble_flops=math.inf, data=data)  # every seed in one ensemble
        data = whole.data
        sweep = Group(t, v, "paper", seeds, preset.n_layers, preset.attention_options, fit, torch.device("cpu"), True,
                      data=data)
        legacy = [legacy_stepper(copy.deepcopy(m), whole.data["x_train"][i], whole.data["y_train"][i],
                                 whole.orders[i], whole.regression, fit.lr, fit.max_steps)
                  for i, m in enumerate(whole.models)]
        paths = {"legacy": legacy, "per-seed": [whole.stepper(copy.deepcopy(m), [i])[0]
                                                for i, m in enumerate(whole.models)]}
        if whole.nets[0] is not None:
            paths["ensemble"] = [whole.stepper(whole.nets[0], seeds)[0]]
            paths["sweep"] = [sweep.stepper(net if net is not None else sweep.models[part[0]], part)[0]
                              for part, net in zip(sweep.parts, sweep.nets)]
        arms[v] = (whole, sweep, paths)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(warmup + rounds):
        for v, (*_groups, paths) in arms.items():
            for path, fns in paths.items():
                cpu = _cpu(lambda i, fns=fns: [f(i) for f in fns], r * steps, steps) / (steps * n_seeds)
                if r >= warmup:
                    times.setdefault((v, path), []).append(cpu)
    rows = []
    for v, (whole, sweep, _paths) in arms.items():
        leg = times[(v, "legacy")]
        for path in PATHS:
            ts = times.get((v, path))
            if ts is None:
                rows.append({"variant": v, "path": path, "status": "unsupported", "message": whole.reason})
                continue
            q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
            speedup = statistics.median(a / b for a, b in zip(leg, ts))
            rows.append({"variant": v, "path": path, "status": "ok",
                         "message": sweep.path if path == "sweep" else "",
                         "ms_per_seed_step": 1000 * statistics.median(ts), "q25_ms": 1000 * q[0],
                         "q75_ms": 1000 * q[2], "seed_steps_per_cpu_s": 1 / statistics.median(ts),
                         "speedup_vs_legacy": speedup, "rounds": len(ts), "seeds": n_seeds, "steps": steps,
                         "task": task, "setting": setting, "d_model": int(whole.data["x_train"].shape[-1]),
                         "batch": preset.fit.batch_size, "seq_len": preset.seq_len,
                         "gflops": 3 * analytic_flops(whole.models[0], preset.fit.batch_size, preset.seq_len)
                         / statistics.median(ts) / 1e9})
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame, env: dict) -> str:
    ok = df[df["status"] == "ok"].copy()
    ok["shape"] = [f"{r.task} {r.setting:g} (D {int(r.d_model)})" for r in ok.itertuples()]
    ok["sweep runs"] = ok["message"].fillna("")
    cols = ["shape", "variant", "path", "ms_per_seed_step", "q25_ms", "q75_ms", "seed_steps_per_cpu_s",
            "speedup_vs_legacy", "gflops", "gemm_fraction", "sweep runs"]
    first = ok.iloc[0] if not ok.empty else {}
    head = (f"# Training throughput of the synthetic cells\n\nCPU time per seed-step (ms): median and IQR over "
            f"{int(first.get('rounds', 0))} interleaved rounds of {int(first.get('steps', 0))} steps, "
            f"{int(first.get('seeds', 0))} seeds per arm; batch {int(first.get('batch', 0))}, T "
            f"{int(first.get('seq_len', 0))}, 1 layer, the decide preset's model; {env.get('torch_threads')} "
            f"thread(s); device {env.get('device_name')} (fp32 GEMM {env.get('gemm_gflops')} GFLOP/s on this thread "
            f"count); 1-min load average {env.get('loadavg')} at the end. Speed-up: the median over rounds of legacy "
            "time / path time. GFLOP/s: analytic training FLOPs (3 × forward) per CPU-second; gemm_fraction: its "
            "share of the GEMM rate. Paths: attention_zoo/experiments/synthetic/train_speed.py.\n\n")
    unsupported = df[df["status"] != "ok"].drop_duplicates("variant")
    tail = "".join(f"\n- `{r.variant}` has no ensemble path: {r.message}" for r in unsupported.itertuples())
    return head + markdown_table(ok[cols], floatfmt=".3g") + tail + "\n"


def shape_arg(text: str) -> tuple[str, float]:
    task, _, setting = text.partition(":")
    if task not in ("regression", "classification") or not setting:
        raise argparse.ArgumentTypeError(f"expected regression:λ or classification:d_e, got {text!r}")
    try:
        value = float(setting)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number after {task}:, got {setting!r}") from None
    if not math.isfinite(value) or value < 0 or (task == "classification" and (value < 1 or value != int(value))):
        raise argparse.ArgumentTypeError(f"expected λ ≥ 0 or a positive integer d_e, got {setting!r}")
    return task, value


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench train", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--variants", default="mha,damcha,controls,tha,dcmha,colmha,mma,moa",
                   help="arms (names, wildcards or the token controls)")
    p.add_argument("--shapes", type=shape_arg, nargs="+", default=[("regression", 1.0)],
                   help="TASK:SETTING pairs: regression:λ (D = 32) or classification:d_e (D = 4·d_e)")
    p.add_argument("--seeds", type=positive_int, default=10, help="seeds per arm (the ensemble's size)")
    p.add_argument("--steps", type=positive_int, default=40, help="steps per path per round")
    p.add_argument("--rounds", type=positive_int, default=7, help="timed rounds")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed rounds")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (the sweep runs one per cell)")
    p.add_argument("--csv", type=Path, default=None)
    p.add_argument("--md", type=Path, default=None)
    args = p.parse_args(argv)
    for name in ("csv", "md"):
        if getattr(args, name) is not None:
            ensure_out_file(getattr(args, name), name)
    setup_threads(args.threads)
    variants = select_attentions(args.variants)
    df = pd.concat([measure(variants, task, setting, args.seeds, args.steps, args.rounds, args.warmup)
                    for task, setting in args.shapes], ignore_index=True)
    # Recorded before the GEMM reference is timed: its timing loop keeps freed memory (docs/conventions.md, "CPU"),
    # the training loops above do not, and the record describes them.
    env = environment_record(resolve_device("cpu"), loadavg=round(os.getloadavg()[0], 2))
    env["gemm_gflops"] = round(gemm_gflops(torch.device("cpu")), 1)
    ok = df["status"] == "ok"
    df.loc[ok, "gemm_fraction"] = df.loc[ok, "gflops"] / env["gemm_gflops"]
    md = to_markdown(df, env)
    print(md)
    if args.csv:
        atomic_write_csv(df, args.csv)
        atomic_write_json(Path(f"{args.csv}.env.json"), json.loads(json.dumps(env, default=str)))
    if args.md:
        atomic_write_text(args.md, md)
    if (df["status"] == "ok").any() and not math.isfinite(float(df["ms_per_seed_step"].max())):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
