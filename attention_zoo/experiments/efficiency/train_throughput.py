"""Training throughput of the decide presets' stand-ins: the char-LM of Table 5 (``--task lm``) and the ViT of
Table 6 (``--task vit``), per arm and width, one model at a time against a seed ensemble, and two processes of one
thread against one process of two threads.

    python -m attention_zoo.bench train --task lm vit --compile --csv results/benchmark/train_throughput.csv \\
        --md results/benchmark/train_throughput.md --plot results/benchmark/train_throughput.png

Models and data are the decide presets' (Table 5: 2 layers, 4 heads, context 64, batch 16, DAMCHA's generator hidden
(128, 128) with compact rank 4, the Shakespeare characters; Table 6: 16² digits in 4² patches, 2 layers, 4 heads,
d_ff = 2·D, batch 64, generator hidden (64, 64)) at the widths ``--d-models`` (default 32, 64, 128; the presets run
64). Paths, timed on one thread in interleaved rounds (every path of every case, then the next round), so load
drift hits all alike; the table gives medians over rounds:

- ``one``: ``--seeds`` models trained one after the other, each step what ``engine.loop.train`` does (the sampler's
  batch, forward, backward, clipping, the host reads of the loss and the gradient norm, AdamW, the schedule);
- ``ensemble``: the same models as one grouped model (``engine.grouped``: one step trains every member on its own
  batch, ``grouped_step`` + ``MemberAdamW``), the path of ``--ensemble`` in the decide presets.

Rows: tokens (images) per CPU-second, the analytic training GFLOP/s (3 × the forward count, ``measure.flops``)
and its share of this CPU's one-thread fp32 GEMM rate (a 2048² GEMM timed as one more case of the same rounds, so
the share compares times taken under the same load), and, for the ensemble and the compiled path, the speed-up
over ``one`` (median of per-round ratios). ``--procs`` adds the machine's throughput per wall-second for
``one`` at the preset width: two processes of one thread each, started together, against one process of two
threads (each in fresh worker processes, rounds interleaved). An arm that cannot be grouped has no ensemble row and
says why. Timings are only comparable on one machine; a figure (``--plot``) draws tokens per CPU-second against
the width, the GEMM share, and the process/thread comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from ...cli import HelpFormatter, non_negative_int, positive_int
from ...engine import TrainConfig
from ...engine.compiled import CompiledForward
from ...engine.ensemble import EnsembleUnsupported
from ...engine.grouped import Member, group_for_training, grouped_step, member_optimizer
from ...engine.loop import _accumulate, lm_loss, lr_factor, make_optimizer
from ...envinfo import environment_record, resolve_device
from ...io import atomic_write_csv, atomic_write_json, atomic_write_text
from ...measure.flops import analytic_flops
from ...measure.gemm import gemm_case
from ...models import Decoder, VisionTransformer
from ...registry import select_attentions, split_options
from ...results import ensure_out_file
from ...workers import child_preexec
from .throughput_shapes import DEFAULT_ARMS, PRESET_WIDTH, SHAPES, STEP_PATHS, TASKS, Shape  # noqa: F401
from .train_throughput_report import plot, target_lines, to_markdown  # noqa: F401


def soft_cross_entropy(batch, output) -> torch.Tensor:
    """Table 6's training loss: cross-entropy against the sampler's soft (label-smoothed) targets."""
    logits = output.logits if hasattr(output, "logits") else output
    return -(batch[-1] * torch.log_softmax(logits.float(), -1)).sum(-1).mean()


def _soft_member_losses(batch, output, n: int) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    return -(batch[-1] * torch.log_softmax(logits.float(), -1)).sum(-1).view(n, -1).mean(1)


soft_cross_entropy.member_losses = _soft_member_losses  # one call for a grouped model's members (engine.grouped)


class _Task:
    """A task's data (loaded once) and its models."""

    def __init__(self, task: str):
        self.shape = SHAPES[task]
        if task == "lm":
            from ...data.text import WindowSampler, load_char_corpus

            self.corpus = load_char_corpus("shakespeare")
            self._sampler = lambda seed: WindowSampler(self.corpus.train, 64, 16, seed=seed)
            self.loss_fn = lm_loss
        else:  # Table 6's decide data (vision.table6_data.load_data, built here from the data layer): the digits
            from ...data.imagefolder import TensorImageSampler  # at 16², the 70 % training split less its 20 %
            from ...data.images import load_digits_images, train_val_split  # validation holdout

            full = load_digits_images(16)
            tr = full.subset(train_val_split(len(full), 0.3, seed=0)[0])
            tr = tr.subset(train_val_split(len(tr), 0.2, seed=1)[0])
            self.num_classes, self.in_chans = len(tr.classes) or int(tr.labels.max()) + 1, tr.images.shape[1]
            self._sampler = lambda seed: TensorImageSampler(tr.images, tr.labels, 64, self.num_classes, seed,
                                                            mean=(0.5,), std=(0.5,), label_smoothing=0.1)
            self.loss_fn = soft_cross_entropy

    def sampler(self, seed: int):
        return self._sampler(seed)

    def model(self, variant: str, d_model: int, seed: int) -> nn.Module:
        opts, _ = split_options(variant, {**self.shape.options, "flavor": "paper"})
        torch.manual_seed(seed)
        if self.shape.task == "lm":
            return Decoder(self.corpus.vocab_size, d_model, 2, 4, attention=variant, attention_options=opts,
                           max_seq_len=64)
        return VisionTransformer(16, 4, self.num_classes, d_model, 2, 4, attention=variant,
                                 attention_options=opts, in_chans=self.in_chans, d_ff=2 * d_model)


def _cfg() -> TrainConfig:
    return TrainConfig(max_steps=10_000, batch_size=1, lr=2e-3, warmup_steps=100, weight_decay=0.1, grad_clip=1.0,
                       progress=False, handle_signals=False)


def one_stepper(model: nn.Module, sampler, loss_fn, cfg: TrainConfig):
    """step(i): what ``engine.loop.train`` does in one step of one model (its batch, ``_accumulate``, clipping, the
    host reads of the loss and the norm, AdamW, the schedule; ``cfg.compile``: the compiled forward)."""
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    dev = torch.device("cpu")
    model.train()
    net = CompiledForward(model, dev) if cfg.compile else model
    step_fn_how = getattr(net, "how", "eager")

    def step(i: int) -> None:
        batch = sampler(i)
        opt.zero_grad(set_to_none=True)
        sums = _accumulate(net, batch, cfg, dev, loss_fn)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if not (torch.isfinite(sums[0]) and torch.isfinite(gnorm)):
            raise FloatingPointError("train_throughput: a non-finite loss")
        float(sums[0])
        opt.step()
        sched.step()

    step.how = lambda: getattr(net, "how", step_fn_how)
    return step


def ensemble_stepper(models: list[nn.Module], samplers: list, loss_fn, cfg: TrainConfig, probe: tuple):
    """step(i): one step of ``engine.grouped.train_grouped`` (every member's batch, ``grouped_step``, the host
    reads of the losses and norms, ``MemberAdamW``)."""
    net = group_for_training(models, probe)
    members = [Member(s, cfg.lr, cfg.weight_decay, smp, Path(".")) for s, smp in enumerate(samplers)]
    opt = member_optimizer(net, members, cfg)
    net.train()

    def step(i: int) -> None:
        parts = [smp(i) for smp in samplers]
        losses, norms, _ = grouped_step(net, opt, parts, [cfg.lr * lr_factor(i, cfg)] * len(parts), cfg, loss_fn)
        if not (torch.isfinite(losses).all() and torch.isfinite(norms).all()):
            raise FloatingPointError("train_throughput: a non-finite loss")
        losses.tolist()
        opt.step()

    return step


def measure(task: str, variants: list[str], widths: list[int], seeds: int, steps: int, rounds: int, warmup: int,
            compile: bool = False) -> pd.DataFrame:
    """Rows per (variant, width, path): CPU seconds per step over interleaved rounds, tokens (images) per
    CPU-second, analytic training GFLOP/s (the GEMM share is added by the caller)."""
    t = _Task(task)
    shape, cfg = t.shape, _cfg()
    cases, rows, flops = {}, [], {}
    for v in variants:
        for d in widths:
            models = [t.model(v, d, s) for s in range(seeds)]
            flops[(v, d)] = 3 * analytic_flops(models[0], shape.batch, shape.seq_len)
            cases[(v, d, "one")] = [one_stepper(t.model(v, d, s), t.sampler(s), t.loss_fn, cfg) for s in range(seeds)]
            if compile:  # the models one at a time with the compiled forward (TrainConfig.compile)
                cases[(v, d, "one (compiled)")] = [one_stepper(t.model(v, d, s), t.sampler(s), t.loss_fn,
                                                               cfg.replace(compile=True)) for s in range(seeds)]
            samplers = [t.sampler(s) for s in range(seeds)]
            try:
                cases[(v, d, "ensemble")] = [ensemble_stepper(models, samplers, t.loss_fn, cfg,
                                                              (samplers[0](0)[0][:2],))]
            except EnsembleUnsupported as exc:
                rows.append({"task": task, "variant": v, "d_model": d, "path": "ensemble", "status": "unsupported",
                             "message": str(exc)})
    times: dict[tuple, list[float]] = {}
    pos, compile_s = 0, {}
    for key, fns in cases.items():  # the first step of each stepper (a compile, where one is asked) outside the rounds
        c0 = time.perf_counter()
        for fn in fns:
            fn(0)
        if key[2] == "one (compiled)":
            compile_s[key] = time.perf_counter() - c0
    gemm, gemm_flop = gemm_case(torch.device("cpu"))
    gemm()
    gemm_rates = []
    pos = 1
    for r in range(warmup + rounds):
        for key, fns in cases.items():
            c0 = time.process_time()
            for i in range(steps):
                for fn in fns:
                    fn(pos + i)
            cpu = (time.process_time() - c0) / (steps * seeds)  # CPU seconds per model-step
            if r >= warmup:
                times.setdefault(key, []).append(cpu)
        c0 = time.process_time()  # the GEMM reference, one more case of the same rounds (same load)
        for _ in range(3):
            gemm()
        if r >= warmup:
            gemm_rates.append(3 * gemm_flop / (time.process_time() - c0) / 1e9)
        pos += steps
    gemm_rate = statistics.median(gemm_rates) if gemm_rates else float("nan")
    for (v, d, path), ts in times.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        row = {"task": task, "variant": v, "d_model": d, "path": path, "status": "ok", "message": "",
               "ms_per_model_step": 1e3 * med, "q25_ms": 1e3 * q[0], "q75_ms": 1e3 * q[2],
               f"{shape.unit}_per_cpu_s": shape.per_batch / med, "gflops": flops[(v, d)] / med / 1e9,
               "rounds": len(ts), "steps": steps, "seeds": seeds, "batch": shape.batch, "seq_len": shape.seq_len,
               "gemm_gflops": gemm_rate, "gemm_fraction": flops[(v, d)] / med / 1e9 / gemm_rate}
        if path != "one":
            one = times[(v, d, "one")]
            row["speedup_vs_one"] = statistics.median(a / b for a, b in zip(one, ts))
        if path == "one (compiled)":
            row["compile_s"] = compile_s[(v, d, path)]
            row["message"] = cases[(v, d, path)][0].how()
        rows.append(row)
    return pd.DataFrame(rows)


# ---- two processes of one thread vs one process of two threads ---------------------------------------------------
def _worker(spec: dict) -> None:
    """A worker process: build the case, say ready, wait for go, time ``steps`` steps of one model, print JSON."""
    torch.set_num_threads(spec["threads"])
    t = _Task(spec["task"])
    step = one_stepper(t.model(spec["variant"], spec["d_model"], spec["seed"]), t.sampler(spec["seed"]), t.loss_fn,
                       _cfg())
    for i in range(spec["warmup"]):
        step(i)
    print("ready", flush=True)
    sys.stdin.readline()
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(spec["steps"]):
        step(spec["warmup"] + i)
    print(json.dumps({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0,
                      "units": spec["steps"] * t.shape.per_batch}), flush=True)


def _run_workers(specs: list[dict]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]),
                                                                      os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-m", __name__, "--worker", json.dumps(s)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, preexec_fn=child_preexec()) for s in specs]
    try:
        for p in procs:  # every worker built and warmed up before any is timed
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("train_throughput: a worker failed before it was ready")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        return [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def measure_processes(task: str, variants: list[str], width: int, steps: int, rounds: int, warmup: int
                      ) -> pd.DataFrame:
    """Units per wall-second of the whole machine: two one-thread processes at once against one two-thread
    process, each training one model (``one``), rounds interleaved."""
    rows = []
    per_batch = SHAPES[task].per_batch
    for v in variants:
        base = {"task": task, "variant": v, "d_model": width, "steps": steps, "warmup": warmup}
        res: dict[str, list[float]] = {"2 processes x 1 thread": [], "1 process x 2 threads": []}
        for _ in range(rounds):
            two = _run_workers([{**base, "threads": 1, "seed": s} for s in range(2)])
            res["2 processes x 1 thread"].append(sum(w["units"] for w in two) / max(w["wall_s"] for w in two))
            one = _run_workers([{**base, "threads": 2, "seed": 0}])[0]
            res["1 process x 2 threads"].append(one["units"] / one["wall_s"])
        for path, vals in res.items():
            rows.append({"task": task, "variant": v, "d_model": width, "path": path, "status": "ok", "message": "",
                         f"{SHAPES[task].unit}_per_wall_s": statistics.median(vals), "rounds": rounds,
                         "steps": steps, "batch": SHAPES[task].batch, "per_batch": per_batch})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench train --task lm|vit",
                                description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--task", choices=TASKS, nargs="+", default=None,
                   help="lm: Table 5's char-LM; vit: Table 6's ViT; both: one table and one figure (required)")
    p.add_argument("--variants", default=DEFAULT_ARMS, help="arms (names, wildcards or the token controls)")
    p.add_argument("--d-models", type=positive_int, nargs="+", default=[32, 64, 128], help="widths (4 heads)")
    p.add_argument("--seeds", type=positive_int, default=10, help="models per case (the ensemble's size)")
    p.add_argument("--steps", type=positive_int, default=4, help="steps per model per round")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed rounds")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed rounds")
    p.add_argument("--procs", default="mha,damcha",
                   help="arms of the 2 processes x 1 thread vs 1 process x 2 threads comparison at D 64 "
                        "('' skips it)")
    p.add_argument("--proc-steps", type=positive_int, default=30, help="steps per worker in that comparison")
    p.add_argument("--proc-rounds", type=positive_int, default=3, help="its interleaved rounds")
    p.add_argument("--compile", action="store_true",
                   help="also time the models one at a time with a compiled forward (TrainConfig.compile)")
    p.add_argument("--csv", type=Path, default=None)
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of the figure")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        _worker(json.loads(args.worker))
        return 0
    if args.task is None:
        p.error("the following arguments are required: --task")
    for name in ("csv", "md", "plot"):
        if getattr(args, name) is not None:
            ensure_out_file(getattr(args, name), name, figure=name == "plot")
    variants = select_attentions(args.variants)
    procs = select_attentions(args.procs) if args.procs else []
    tasks = list(dict.fromkeys(args.task))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import torch._dynamo.config as dynamo_config

    limits = (dynamo_config.cache_size_limit, dynamo_config.accumulated_cache_size_limit)
    # every arm and width is one more compiled graph of the same forward code: room for all of them (restored)
    dynamo_config.cache_size_limit = dynamo_config.accumulated_cache_size_limit = 1024
    try:
        frames = []
        for t in tasks:  # each task's compiled graphs on their own (a task's cases are interleaved, tasks are not)
            torch._dynamo.reset()
            frames.append(measure(t, variants, args.d_models, args.seeds, args.steps, args.rounds, args.warmup,
                                  args.compile))
        torch._dynamo.reset()
    finally:
        torch.set_num_threads(threads)
        dynamo_config.cache_size_limit, dynamo_config.accumulated_cache_size_limit = limits
    frames += [measure_processes(t, procs, PRESET_WIDTH, args.proc_steps, args.proc_rounds, 1) for t in tasks
               if procs]
    df = pd.concat(frames, ignore_index=True)
    env = environment_record(resolve_device("cpu"), loadavg=round(os.getloadavg()[0], 2))
    gemm = df["gemm_gflops"].dropna().median() if "gemm_gflops" in df else float("nan")
    env.update(gemm_gflops_1thread=round(float(gemm), 1), cores=os.cpu_count())
    md = "\n".join(to_markdown(df[df["task"] == t], env, t) for t in tasks)
    print(md)
    if args.csv:
        atomic_write_csv(df, args.csv)
        atomic_write_json(Path(f"{args.csv}.env.json"), json.loads(json.dumps(env, default=str)))
    if args.md:
        atomic_write_text(args.md, md)
    if args.plot:
        plot(df, tasks, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
