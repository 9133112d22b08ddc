"""Training throughput of the synthetic cells (Appendix I): training steps per CPU-second of each arm, per path.

Three paths train the same seeds on the same data and batch order: ``legacy`` is the per-cell loop the sweep ran
before this path existed (one model at a time, default AdamW, ``clip_grad_norm_``, a ``loss.item()`` host sync and a
data gather every step); ``per-seed`` is ``synthetic_fit``'s loop with one seed (foreach AdamW, no per-step sync);
``ensemble`` is the same loop with the seeds grouped into one model (``engine.ensemble``; arms that cannot be grouped
have no ensemble row and say why). Rounds are interleaved (legacy, per-seed, ensemble, next arm, …, next round) in
one process, so machine drift hits every path alike; the table reports the median CPU time per seed-step with its
IQR over rounds and the speed-up against ``legacy`` (median of the per-round ratios).

    python -m attention_zoo.bench train --variants mha,damcha --seeds 10 --steps 40 --rounds 7
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

from ..cli import HelpFormatter, cli_main, non_negative_int, positive_int
from ..envinfo import environment_record, resolve_device, setup_threads
from ..io import atomic_write_csv, atomic_write_json, atomic_write_text
from ..registry import select_attentions
from ..report import markdown_table
from ..results import ensure_out_file
from .synthetic import PRESETS, task_of
from .synthetic_fit import Group

PATHS = ("legacy", "per-seed", "ensemble")


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
    arms = {}
    for v in variants:
        g = Group(t, v, "paper", seeds, preset.n_layers, preset.attention_options, fit, torch.device("cpu"), True)
        solo = [copy.deepcopy(m) for m in g.models]
        legacy = [legacy_stepper(copy.deepcopy(m), g.data["x_train"][i], g.data["y_train"][i], g.orders[i],
                                 g.regression, fit.lr, fit.max_steps) for i, m in enumerate(g.models)]
        per_seed = [_solo_stepper(g, m, i) for i, m in enumerate(solo)]
        ens = g.stepper(g.net, seeds)[0] if g.net is not None else None
        arms[v] = (g, legacy, per_seed, ens)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(warmup + rounds):
        for v, (_, legacy, per_seed, ens) in arms.items():
            paths = {"legacy": lambda i, ls=legacy: [f(i) for f in ls],
                     "per-seed": lambda i, ps=per_seed: [f(i) for f in ps]}
            if ens is not None:
                paths["ensemble"] = ens
            for path, fn in paths.items():
                cpu = _cpu(fn, r * steps, steps) / (steps * n_seeds)
                if r >= warmup:
                    times.setdefault((v, path), []).append(cpu)
    rows = []
    for v, (g, *_rest) in arms.items():
        leg = times[(v, "legacy")]
        for path in PATHS:
            ts = times.get((v, path))
            if ts is None:
                rows.append({"variant": v, "path": path, "status": "unsupported", "message": g.reason})
                continue
            q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
            speedup = statistics.median(a / b for a, b in zip(leg, ts))
            rows.append({"variant": v, "path": path, "status": "ok", "message": "",
                         "ms_per_seed_step": 1000 * statistics.median(ts), "q25_ms": 1000 * q[0],
                         "q75_ms": 1000 * q[2], "seed_steps_per_cpu_s": 1 / statistics.median(ts),
                         "speedup_vs_legacy": speedup, "rounds": len(ts), "seeds": n_seeds, "steps": steps,
                         "task": task, "setting": setting, "d_model": int(g.data["x_train"].shape[-1]),
                         "batch": preset.fit.batch_size, "seq_len": preset.seq_len})
    return pd.DataFrame(rows)


def _solo_stepper(g: Group, model: nn.Module, i: int):
    """The per-seed path for seed ``i`` of ``g`` on its own copy of the model."""
    net = g.net
    g.net = None  # stepper treats any net that is not the grouped one as a single seed's model
    try:
        return g.stepper(model, [i])[0]
    finally:
        g.net = net


def to_markdown(df: pd.DataFrame, env: dict) -> str:
    ok = df[df["status"] == "ok"]
    cols = ["variant", "path", "ms_per_seed_step", "q25_ms", "q75_ms", "seed_steps_per_cpu_s", "speedup_vs_legacy"]
    first = ok.iloc[0] if not ok.empty else {}
    shape = (f"{first.get('task')} (setting {first.get('setting')}), batch {first.get('batch')}, T "
             f"{first.get('seq_len')}, D {first.get('d_model')}, 1 layer") if len(first) else "–"
    head = (f"# Training throughput of the synthetic cells\n\nCPU time per seed-step: median and IQR over "
            f"{first.get('rounds', 0)} interleaved rounds of {first.get('steps', 0)} steps, {first.get('seeds', 0)} "
            f"seeds per arm; shape: {shape}; {env.get('torch_threads')} thread(s); device {env.get('device_name')}; "
            f"1-min load average {env.get('loadavg')} at the end. Speed-up: the median over rounds of legacy time / "
            "path time. Paths: attention_zoo/experiments/train_speed.py.\n\n")
    unsupported = df[df["status"] != "ok"]
    tail = "".join(f"\n- `{r.variant}` has no ensemble path: {r.message}" for r in unsupported.itertuples())
    return head + markdown_table(ok[cols], floatfmt=".3g") + tail + "\n"


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench train", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--variants", default="mha,damcha,controls,tha,dcmha,colmha,mma,moa",
                   help="arms (names, wildcards or the token controls)")
    p.add_argument("--task", choices=("regression", "classification"), default="regression")
    p.add_argument("--setting", type=float, default=1.0, help="λ (regression) or d_e (classification)")
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
    df = measure(select_attentions(args.variants), args.task, args.setting, args.seeds, args.steps, args.rounds,
                 args.warmup)
    env = environment_record(resolve_device("cpu"), loadavg=round(os.getloadavg()[0], 2))
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
