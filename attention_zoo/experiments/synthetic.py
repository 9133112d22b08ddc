"""Appendix I, Figures 12–13 of the DAMCHA paper: synthetic regression (test MSE vs λ) and classification
(accuracy vs d_e), every registered attention on the same tiny encoder, paired by seed.

Tasks: ``attention_zoo.data.synthetic`` (equations in its docstring; the paper gives no generators [U]). Model:
``AttentionStack(d_model=4·d_e, n_heads=4, norm="pre")`` fed the raw features (no input projection, so head i's
positional slice is subspace i; DAMCHA's stack-shared metric reads the same raw stack input), a final LayerNorm,
mean pooling over tokens and a linear head. AdamW with cosine decay to 0.1·lr, the same budget for every
variant; minibatch order and model init are seeded by the cell's seed, and the data of a (λ or d_e, seed) are
identical across variants.

Reported per seed: test MSE (noisy targets; floor σ² = 0.01) and the noise-free test MSE, test accuracy, and
parameter counts. Relative gain over MHA is paired by seed, gain = (MSE_MHA − MSE_v)/MSE_MHA in %
(classification: accuracy difference in points), with a 95 % Student-t interval across seeds.
The paper [Q]: DAMCHA vs MHA gain −1.7 % at λ = 0.2 and +4.8 % at λ = 1; DAMCHA leads at every d_e and
degrades more slowly as d_e grows.

Sweeps: the sweeps named on the command line run (``--lambda`` → regression, ``--de`` → classification); naming
neither runs both at the preset's grids (``--task`` overrides). A cell (task, variant, flavour, λ or d_e, seed)
is stored as it finishes; a rerun skips finished cells; cells run in parallel worker processes on CPU.
"""

from __future__ import annotations

import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .. import report
from ..data import synthetic as syn
from ..envinfo import environment_record, resolve_device, set_seed
from ..measure.params import count_params
from ..measure.status import free_memory, is_oom, short_message
from ..models import AttentionStack, StackConfig
from ..registry import resolved_options_json, split_options
from ..results import ResultStore
from ..workers import die_with_parent
from .common import (
    base_parser,
    cli_main,
    non_negative_float,
    open_store,
    positive_int,
    select_variants,
    setup_threads,
    variant_flavours,
)
from .synthetic_report import METRIC, NAME, write_report

TASKS = ("regression", "classification")


@dataclass(frozen=True)
class Preset:
    lambdas: tuple[float, ...]
    des: tuple[int, ...]
    reg_d_e: int  # regression subspace width (D = 4·reg_d_e)
    seq_len: int
    n_train: int
    n_test: int
    n_layers: int
    steps: int
    batch_size: int
    lr: float
    weight_decay: float = 0.01
    noise: float = 0.1  # regression target noise σ
    kappa: float = 2.0  # classification latent energy
    attention_options: dict = field(default_factory=dict)  # to every variant that accepts an option


PRESETS = {
    # Seconds per cell on one CPU core; the DAMCHA generator is narrowed to keep it in that budget.
    "smoke": Preset(lambdas=(0.0, 0.25, 0.5, 0.75, 1.0), des=(4, 8, 12, 16, 20), reg_d_e=8, seq_len=16,
                    n_train=4096, n_test=1024, n_layers=1, steps=200, batch_size=64, lr=5e-3,
                    attention_options={"hidden_dims": (64, 64)}),
    "paper": Preset(lambdas=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), des=(4, 8, 12, 16, 20), reg_d_e=8, seq_len=32,
                    n_train=16384, n_test=4096, n_layers=2, steps=3000, batch_size=128, lr=3e-3),
}


# ---- model and one cell -------------------------------------------------------------------------------------
class SyntheticModel(nn.Module):
    """Raw features -> attention stack -> LayerNorm -> mean over tokens -> linear head; returns (out, aux)."""

    def __init__(self, d_model: int, n_layers: int, attention: str, attention_options: dict, n_out: int):
        super().__init__()
        self.stack = AttentionStack(StackConfig(d_model=d_model, n_layers=n_layers, n_heads=syn.N_SUBSPACES,
                                                attention=attention, attention_options=attention_options))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out)

    def forward(self, x):
        h, aux = self.stack(x)  # (B, T, D)
        return self.head(self.ln_f(h).mean(1)), aux  # (B, n_out)


@lru_cache(maxsize=4)
def _data(task: str, setting: float, seed: int, n_train: int, n_test: int, reg_d_e: int, seq_len: int,
          noise: float, kappa: float) -> syn.SyntheticData:
    if task == "regression":
        return syn.make_regression(n_train, n_test, reg_d_e, seq_len, setting, noise, seed=seed)
    return syn.make_classification(n_train, n_test, int(setting), seq_len, kappa, seed=seed)


def _predict(model: nn.Module, x: torch.Tensor, device: torch.device, chunk: int = 1024) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x[i:i + chunk].to(device))[0].float().cpu() for i in range(0, len(x), chunk)])


def train_cell(cell: dict, preset: Preset, device: torch.device) -> list[dict]:
    """Train one (task, variant, flavour, λ or d_e, seed) cell; returns its result rows."""
    task, seed = cell["task"], cell["seed"]
    data = _data(task, cell["lam"] if task == "regression" else cell["d_e"], seed, preset.n_train, preset.n_test,
                 preset.reg_d_e, preset.seq_len, preset.noise, preset.kappa)
    reg = task == "regression"
    opts, _ = split_options(cell["variant"], {**preset.attention_options, "flavor": cell["flavor"]})
    set_seed(seed)
    model = SyntheticModel(data.x_train.shape[-1], preset.n_layers, cell["variant"], opts,
                           1 if reg else data.n_classes).to(device)
    params = count_params(model)
    opt = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=preset.weight_decay, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, preset.steps, eta_min=0.1 * preset.lr)
    # Batch order: the same for every variant, from a stream other than the data's (torch keeps 32 seed bits).
    order = torch.randint(len(data.x_train), (preset.steps, preset.batch_size),
                          generator=syn.make_generator((seed + 0x9E3779B9) % 2**32))
    common = {"params": params["total_params"], "attention_params": params["attention_params"],
              "attention_options": str(opts), "device": str(device), "threads": torch.get_num_threads(),
              "status": "ok", "message": ""}
    t0, cpu0, losses = time.perf_counter(), time.process_time(), []
    model.train()
    for step, idx in enumerate(order):
        x, y = data.x_train[idx].to(device), data.y_train[idx].to(device)
        out, aux = model(x)
        loss = (F.mse_loss(out.squeeze(-1), y) if reg else F.cross_entropy(out, y)) + aux
        if not torch.isfinite(loss):
            msg = f"non-finite loss at step {step}"
            return [{**common, "metric": METRIC[task], "value": math.nan, "unit": _unit(task), "status": "nan",
                     "message": msg}]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    model.eval()
    pred = _predict(model, data.x_test, device)
    rows = [{"metric": "train_loss_last10pct", "value": float(np.mean(losses[-max(1, len(losses) // 10):])),
             "unit": "mse" if reg else "nats"},
            {"metric": "train_time_s", "value": train_s, "unit": "s"},
            {"metric": "train_cpu_s", "value": train_cpu_s, "unit": "s"}]  # ≈ wall time on an idle core
    if reg:
        rows += [{"metric": "test_mse", "value": F.mse_loss(pred.squeeze(-1), data.y_test).item(), "unit": "mse"},
                 {"metric": "test_mse_clean", "value": F.mse_loss(pred.squeeze(-1), data.y_test_clean).item(),
                  "unit": "mse"}]
    else:
        oracle = syn.oracle_scores(data.x_test, data.constants).argmax(1)
        rows += [{"metric": "test_acc", "value": (pred.argmax(1) == data.y_test).float().mean().item(),
                  "unit": "fraction"},
                 {"metric": "test_loss", "value": F.cross_entropy(pred, data.y_test).item(), "unit": "nats"},
                 {"metric": "oracle_test_acc", "value": (oracle == data.y_test).float().mean().item(),
                  "unit": "fraction"}]
    return [{**common, **r} for r in rows]


def _unit(task: str) -> str:
    return "mse" if task == "regression" else "fraction"


def _guarded_cell(cell: dict, preset: Preset, device: str) -> tuple[dict, list[dict] | None, str]:
    """Worker entry: (cell, rows, error). An OOM is a result; any other failure is reported, not stored."""
    try:
        return cell, train_cell(cell, preset, torch.device(device)), ""
    except Exception as exc:  # noqa: BLE001 - an OOM becomes a row; other errors go back to the parent
        if is_oom(exc):
            free_memory(device)
            return cell, [{"metric": METRIC[cell["task"]], "value": math.nan, "unit": _unit(cell["task"]),
                           "status": "oom", "message": short_message(exc)}], ""
        return cell, None, short_message(exc)


def _init_worker(threads: int, parent: int) -> None:
    die_with_parent(parent)  # a killed parent leaves no worker behind
    torch.set_num_threads(threads)


# ---- grid ---------------------------------------------------------------------------------------------------
def config_tag(preset_name: str, preset: Preset) -> str:
    """Identifies the training configuration; the report only mixes cells of one configuration."""
    return (f"{preset_name}/L{preset.n_layers}/T{preset.seq_len}/n{preset.n_train}/steps{preset.steps}"
            f"/bs{preset.batch_size}/lr{preset.lr:g}")


def build_cells(args, preset: Preset, preset_name: str) -> list[dict]:
    tasks = _tasks(args)
    pairs = variant_flavours(select_variants(args.variants), args.flavour)
    lambdas = preset.lambdas if args.lambdas is None else tuple(args.lambdas)
    des = preset.des if args.de is None else tuple(args.de)
    if any(d < 1 for d in des):
        raise ValueError(f"de: expected positive subspace widths, got {list(des)}")
    if not all(math.isfinite(lam) for lam in lambdas):
        raise ValueError(f"lambda: expected finite weights, got {list(lambdas)}")
    settings = {"regression": [{"lam": float(lam), "d_e": preset.reg_d_e} for lam in lambdas],
                "classification": [{"lam": None, "d_e": int(d)} for d in des]}
    tag = config_tag(preset_name, preset)
    return [{"experiment": NAME, "config": tag, "task": task, **s, "seed": seed, "variant": v, "flavor": f,
             "attention_options": resolved_options_json(v, {"flavor": f})}
            for task in tasks for s in settings[task] for seed in args.seeds for v, f in pairs]


def _tasks(args) -> tuple[str, ...]:
    if args.task == "both":
        return TASKS
    if args.task != "auto":
        return (args.task,)
    named = tuple(t for t, given in zip(TASKS, (args.lambdas is not None, args.de is not None)) if given)
    return named or TASKS


def run_cells(cells: list[dict], store: ResultStore, preset: Preset, device: torch.device, workers: int,
              threads: int, quiet: bool) -> list[str]:
    """Run the unfinished cells, storing each as it completes; returns the error messages of failed cells."""
    todo = [c for c in cells if store.claim(c)]  # not done, and not being run by another process on this --out
    errors: list[str] = []

    def finish(cell, rows, err, bar):
        if rows is not None:
            store.add(cell, rows)
        else:
            store.release(cell)
            errors.append(f"{cell['task']}/{cell['variant']}/{cell['flavor']}/λ={cell['lam']}/d_e={cell['d_e']}"
                          f"/seed {cell['seed']}: {err}")
        bar.update(1)

    def progress():
        return tqdm(total=len(cells), initial=len(cells) - len(todo), desc=NAME, disable=quiet, unit="cell")

    try:
        _run_todo(todo, finish, progress, preset, device, workers, threads)
    finally:  # claims of cells not run (Ctrl-C, a crash) go back
        for cell in todo:
            store.release(cell)
    return errors


def _run_todo(todo, finish, progress, preset, device, workers, threads) -> None:
    if workers <= 1 or len(todo) <= 1:
        bar = progress()
        for cell in todo:
            finish(*_guarded_cell(cell, preset, str(device)), bar)
        bar.close()
    else:
        # fork (Linux, CPU) skips re-importing torch in every worker; CUDA needs spawn. Workers start before
        # tqdm's monitor thread.
        method = "fork" if sys.platform == "linux" and device.type == "cpu" else "spawn"
        pool = ProcessPoolExecutor(workers, mp_context=get_context(method), initializer=_init_worker,
                                   initargs=(threads, os.getpid()))
        try:
            futures = [pool.submit(_guarded_cell, c, preset, str(device)) for c in todo]
            bar = progress()
            for fut in as_completed(futures):
                finish(*fut.result(), bar)
            bar.close()
        finally:  # on Ctrl-C the finished cells are already stored; queued ones are dropped
            pool.shutdown(wait=True, cancel_futures=True)


# ---- CLI ----------------------------------------------------------------------------------------------------
def build_parser():
    p = base_parser(NAME, "Appendix I, Figures 12–13: synthetic regression (λ sweep) and classification (d_e "
                          "sweep), every registered attention, paired by seed.", default_seeds=[0, 1, 2, 3, 4])
    p.set_defaults(flavour="paper")
    p.add_argument("--lambda", dest="lambdas", type=non_negative_float, nargs="+", default=None,
                   help="regression cross-term weights λ, each finite and >= 0 (default: the preset's grid; "
                        "smoke 0 … 1 step 0.25, paper 0 … 1 step 0.2). Naming it alone runs only the regression sweep")
    p.add_argument("--de", type=positive_int, nargs="+", default=None,
                   help="classification subspace widths d_e, D = 4·d_e (default 4 8 12 16 20). Naming it alone "
                        "runs only the classification sweep")
    p.add_argument("--task", choices=("auto", "regression", "classification", "both"), default="auto",
                   help="auto: the sweeps named by --lambda/--de, or both when neither is named")
    p.add_argument("--steps", type=positive_int, default=None, help="override the preset's optimizer steps")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="parallel worker processes, one cell each (default: CPU cores up to 8 on cpu, 1 on cuda)")
    p.epilog = ("Defaults: every registered variant, baselines in the paper flavour (--flavour both adds the "
                "damcha_repo versions), seeds 0-4. Example: python reproduce/synthetic.py --lambda 0.2 1.0")
    return p


def run(args) -> int:
    """Run the grid and write the report; 0, or 1 if a cell failed (not stored: a rerun retries it)."""
    t0 = time.perf_counter()
    device = resolve_device(args.device)
    preset = PRESETS[args.preset]
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"steps: expected a positive int, got {args.steps}")
        preset = Preset(**{**asdict(preset), "steps": args.steps})
    cells = build_cells(args, preset, args.preset)
    cpus = os.cpu_count() or 1
    workers = args.workers or (min(cpus, 8) if device.type == "cpu" else 1)
    threads = args.threads or max(1, cpus // workers)
    setup_threads(threads)
    out, tag = Path(args.out), config_tag(args.preset, preset)
    env = environment_record(device, preset=args.preset, config=tag, workers=workers, threads_per_worker=threads,
                             preset_config=asdict(preset))
    # --workers only spreads cells over processes (each runs one cell with `threads` threads, in the fingerprint)
    store = open_store(args, NAME, device, env, selection=("lambdas", "de", "task", "workers"), preset=asdict(preset))
    n_todo = len(store.pending(cells))
    try:
        errors = run_cells(cells, store, preset, device, workers, threads, args.quiet)
    except KeyboardInterrupt:
        print(f"{NAME}: interrupted; finished cells are stored in {store.path}, rerun to continue", file=sys.stderr)
        return 130
    comp, statements = write_report(out, store, env, tag)  # every cell of this context: sweeps accumulate
    print(report.format_comparison(comp, floatfmt=".2f"))
    for r in statements.itertuples():
        print(f"{r.statement:<48} paper: {r.paper:<4} ours: {r.ours}")
    print(f"{NAME}: {len(cells)} cells ({n_todo} run now, {workers} workers × {threads} threads) in "
          f"{time.perf_counter() - t0:.0f} s; tables and plots in {out}")
    for e in errors:
        print(f"{NAME}: failed cell {e}", file=sys.stderr)
    return int(bool(errors))


@cli_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
