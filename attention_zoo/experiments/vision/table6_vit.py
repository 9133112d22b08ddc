"""Table 6 (DAMCHA paper p. 9): ViT classification on ImageNet-1K — MHA, DCMHA, DAMCHA (any registered variant).

Top-1 / top-5 accuracy (%) on the validation split after 100 and 500 epochs. The paper quotes DAMCHA only:
70.93 / 89.71 (100 epochs) and 82.10 / 96.23 (500), best in both columns [Q]. A cell is (variant, flavour, preset,
epochs, seed): one training run in its own directory (``runs/<cell>/metrics.jsonl`` + ``checkpoints/``) whose
final-weights accuracy goes to the result store; a finished cell is skipped on rerun and an interrupted one resumes
from its newest checkpoint. 100 and 500 epochs are separate runs, each with its own cosine schedule. Under
``torchrun`` every cell trains with DDP and rank 0 writes; each rank decodes only its slice of the global batch
(attention_zoo/data/imagefolder.py).

Presets (the paper gives no recipe [U]):
- ``paper``: ImageNet-1K from ``--data-dir`` (ImageFolder layout), ViT-B/16 as the authors' ``create_vit_base``
  (224², patch 16, d 768, N 12, h 12, d_ff 3072, dropout 0.1, pre-LN, CLS token, learned positions) and DeiT's
  recipe: AdamW β = (0.9, 0.999), lr 5e-4·batch/512 at batch 1024, weight decay 0.05, 5 warm-up epochs then cosine
  to 1e-5, no gradient clipping, label smoothing 0.1, mixup 0.8 / CutMix 1.0, RandAugment(2, 9), random erasing
  0.25, bf16 autocast on CUDA; 100 and 500 epochs. Left out of DeiT: stochastic depth (the backbone has dropout 0.1
  as the authors' ViT), repeated augmentation, EMA, and exempting the position embedding and CLS token from weight
  decay (the engine decays every tensor with ≥ 2 dims). DAMCHA uses its default generator (hidden (256, 512),
  full D² output); ``--attn-options`` changes it.
- ``cifar10``: CIFAR-10 (found in ``--data-dir`` or downloaded; the test split is the validation split), 32²,
  patch 4, d 256, N 6, h 8, d_ff 512, dropout 0.1; random crop (pad 4) + flip, label smoothing 0.1, batch 128,
  lr 5e-4, 5 warm-up epochs, 100 epochs.
- ``smoke``: scikit-learn digits (embedded; 70/30 split) at 16² (a 12² digit in a 2-px border), patch 4, d 64,
  N 2, h 4, d_ff 128, DAMCHA generator hidden (64, 64); no augmentation (±2 px translation of a 12-px digit halves
  the accuracy reached in this budget), label smoothing 0.1, batch 64, lr 2e-3, 8 epochs (152 steps). Seconds of
  compute per variant on a 2-core CPU, with one torch thread (matrices this small gain nothing from a second, and
  on a busy machine OpenMP's spinning threads slow each step tenfold); not comparable with the paper.
- ``decide``: the smoke model and recipe to a validation plateau: 20 % of the digits' training images become a
  validation split (early stopping with patience 10 epochs, the tuning's score), the smoke's 30 % stays the test
  split (top-1/top-5 of the best validation checkpoint); at most 100 epochs. Every arm tuned on one grid
  (``TUNING``, ``experiments.tuning``), then ten seeds at its own best and, as the secondary row, at the smoke
  setting (lr 2e-3, weight decay 0.05). Arms: MHA, DCMHA and DAMCHA (the claims T6.*), ``mha_pm``, ``mha_ctx``,
  ``damcha_bm``; one cell per process (``--jobs``). Sized from one-thread step times at batch 64 (10–27 ms, ``mha_pm``
  ≈ 70 ms, on a loaded 2-core host) × 15 steps per epoch × 100 epochs × 32 runs per arm (12 tuning, 10 tuned, 10
  shared) ≈ 2.6 core-hours ≈ 1.3 h on 2 cores with no early stop (the ceiling; plateaus come earlier).
"""

from __future__ import annotations

import ast
import functools
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ... import report
from ...claims import verdict_lines
from ...engine import (
    TrainConfig,
    parse_overrides,
    prune_checkpoints,
    result_identity,
)
from ...engine.distributed import DistInfo, broadcast_object, run_distributed
from ...envinfo import environment_record, resolve_device
from ...registry import is_attention, resolved_options_json
from ...results import ResultStore, ensure_out_dir
from ..common import (
    FIVE_SEEDS,
    ListAction,
    base_parser,
    experiment_main,
    positive_int,
    run_context,
    select_variants,
    setup_threads,
    variant_flavours,
)
from ..ensemble_units import add_ensemble_argument, ensemble_columns, ensemble_on, ensemble_units
from ..protocol import Plan, add_launcher_arguments, default_workers, execute
from ..tuning import execute_stages, is_waiting, tuned_cells
from .presets import (
    BUDGET_FRACS,
    DECIDE_ARMS,
    DEFAULT_VARIANTS,
    ENSEMBLE,
    PATIENCE_EPOCHS,
    PRESETS,
    TUNING,
    VAL_HOLDOUT,
)
from .table6_data import (  # noqa: F401
    ImageData,
    classification_loss,
    evaluate_topk,
    evaluate_topk_members,
    load_data,
    topk_correct,
)
from .table6_report import NAME, write_report
from .training import build_model, cell_result_rows, grouped_unit, run_cell, run_dir_of, train_config  # noqa: F401


def build_parser():
    p = base_parser(NAME, __doc__.split("\n")[0], default_seeds={"smoke": [0], "decide": list(range(10)),
                                                                  "*": FIVE_SEEDS})
    p.set_defaults(variants=None)
    for action in p._actions:  # base_parser knows smoke/paper only; this table adds a mid-size preset
        if action.dest == "preset":
            action.choices = tuple(PRESETS)
            action.help = ("smoke: digits, seconds per variant on a CPU; decide: digits to a plateau, tuned, ten "
                           "seeds; cifar10: mid-size; paper: ImageNet ViT-B/16")
    p.add_argument("--data-dir", default=None, help="ImageNet root (train/ and val/ class folders) or where CIFAR is "
                   "(or gets downloaded); default $ATTENTION_ZOO_DATA or ~/.cache/attention_zoo/data")
    p.add_argument("--no-download", dest="download", action="store_false", help="fail instead of downloading CIFAR")
    p.add_argument("--epochs", action=ListAction, item=positive_int, default=None,
                   help="training lengths (default: the preset's)")
    p.add_argument("--steps", type=positive_int, default=None, help="override the optimizer steps of every cell")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="global batch (lr scales linearly); default: preset")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="ImageNet decoding processes per rank (default min(8, CPUs / ranks))")
    p.add_argument("--eval-batches", type=positive_int, default=None,
                   help="final evaluation: at most this many validation batches (default: the whole split)")
    p.add_argument("--attn-options", nargs="*", default=[], metavar="KEY=VALUE",
                   help="attention options (Python literals) for every variant that accepts them, e.g. "
                        "--attn-options 'hidden_dims=(128,)' collapsed_generator=True")
    p.add_argument("--train", nargs="*", default=[], metavar="KEY=VALUE",
                   help="TrainConfig overrides, e.g. --train amp=off grad_accum=4 stop_at=100")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep a finished cell's checkpoints (default: delete them once its metrics are stored)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="decide preset: cells trained at once, one process each (default: CPU cores up to 8 on cpu)")
    add_ensemble_argument(p)
    p.epilog = ("Defaults: variants mha,dcmha,damcha (those registered); --flavour damcha_repo runs the baselines as "
                "the paper ran them (reproduce/all.py --preset paper does). "
                "Multi-GPU: torchrun --nproc_per_node=N reproduce/table6_vit.py --preset paper --data-dir DIR")
    return add_launcher_arguments(p)


def parse_attn_options(items: list[str]) -> dict:
    """``["hidden_dims=(64,)", "compact_rank=4"]`` -> dict of Python literals (bare words stay strings)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"attn-options: expected key=value, got {item!r}")
        try:
            out[key.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = raw.strip()
    return out


def run(args) -> int:
    """Run the grid; exit code 0, 1 if any cell hit NaN/inf, or 128+signal when interrupted (resumable)."""
    setup_threads(args.threads or PRESETS[args.preset].threads)
    if args.preset in TUNING:  # tuning parity: the grid, then each arm's seeds at its best (and the shared setting)
        return execute_stages(lambda: staged_plan(args), args, NAME)
    if args.launcher == "submitit" or args.dry_run or ensemble_on(args, ENSEMBLE):  # the protocol's plan: the
        return execute(plan(args), args, NAME)  # cluster's units, the dry run's, or the grouped seeds' units
    return run_distributed(args.device, lambda info: _run(args, info))


def _setup(args, info: DistInfo):
    """(preset, pairs, attention options, overrides, data, batch, out, env, context) of a run."""
    preset = PRESETS[args.preset]
    default = DECIDE_ARMS if args.preset in TUNING else DEFAULT_VARIANTS
    names = select_variants(args.variants) if args.variants else [v for v in default if is_attention(v)]
    pairs = variant_flavours(names, args.flavour)
    attn_options, overrides = parse_attn_options(args.attn_options), parse_overrides(args.train)
    data = load_data(preset, args.data_dir, args.download, args.workers, VAL_HOLDOUT.get(args.preset))
    batch = args.batch_size or preset.batch_size
    env = environment_record(info.device, preset=args.preset, world_size=info.world_size, n_train=data.n_train,
                             n_val=data.n_val)
    tuning = TUNING.get(args.preset)
    context = run_context(args, info.device,
                          selection=("keep_checkpoints", "download", "data_dir", "epochs", "train", "jobs", "ensemble"),
                          preset=asdict(preset), train_overrides=result_identity(overrides),
                          **({"tuning": tuning.provenance(),
                              "holdout": VAL_HOLDOUT[args.preset], "patience_epochs": PATIENCE_EPOCHS[args.preset],
                              "budget_fracs": BUDGET_FRACS[args.preset]}
                             if tuning else {}))
    return preset, pairs, attn_options, overrides, data, batch, Path(args.out), env, context


def _config(args, preset, overrides, data, batch, key: dict) -> TrainConfig:
    """A cell's TrainConfig; a tuned preset's cell trains at its own lr and weight decay, with early stopping."""
    tuned = args.preset in TUNING  # its cells run in parallel processes: the plan's bar counts them, not tqdm
    cfg, spe = train_config(preset, data.n_train, key["epochs"], batch, args.steps,
                            {**overrides, "progress": not args.quiet and not tuned})
    if not tuned:
        return cfg
    cfg = cfg.replace(patience=PATIENCE_EPOCHS[args.preset] * spe)
    if key["lr"] is None:  # waiting for its arm's tuning: priced by a dry run, never trained
        return cfg
    return cfg.replace(lr=key["lr"], min_lr_ratio=min(1.0, preset.min_lr / key["lr"]),
                       weight_decay=key["weight_decay"])


def _cells(args, preset, pairs, attn_options, overrides, data, batch, records: list[dict] | None = None):
    """[(cell key, TrainConfig)] of the grid, in run order; a tuned preset's as far as ``records`` allow."""
    out = []
    for epochs in args.epochs or preset.epochs:
        cfg, spe = train_config(preset, data.n_train, epochs, batch, args.steps,
                                {**overrides, "progress": not args.quiet})
        if args.preset in TUNING:
            arms = [{"experiment": NAME, "preset": args.preset, "dataset": preset.dataset, "variant": variant,
                     "flavor": flavor, "epochs": epochs, "max_steps": cfg.max_steps, "batch_size": batch,
                     "steps_per_epoch": spe, "eval_batches": args.eval_batches,
                     "attn_options": json.dumps(attn_options, sort_keys=True, default=str),
                     "attention_options": resolved_options_json(variant, {"flavor": flavor})}
                    for variant, flavor in pairs]
            cells, waiting, _ = tuned_cells(replace(TUNING[args.preset], seeds=tuple(args.seeds)), arms, records or [])
            out += [(c, _config(args, preset, overrides, data, batch, c)) for c in cells + waiting]
            continue
        for variant, flavor in pairs:
            for seed in args.seeds:
                out.append(({"experiment": NAME, "preset": args.preset, "dataset": preset.dataset, "variant": variant,
                             "flavor": flavor, "epochs": epochs, "seed": seed, "max_steps": cfg.max_steps,
                             "batch_size": batch, "steps_per_epoch": spe, "eval_batches": args.eval_batches,
                             "attn_options": json.dumps(attn_options, sort_keys=True, default=str),
                             "attention_options": resolved_options_json(variant, {"flavor": flavor})}, cfg))
    return out


def _run(args, info: DistInfo) -> int:
    if info.is_main:
        ensure_out_dir(args.out)  # before the data is loaded (or downloaded)
    preset, pairs, attn_options, overrides, data, batch, out, env, context = _setup(args, info)
    store = ResultStore(out, NAME, context, fresh=args.fresh, env=env) if info.is_main else None
    exit_code = 0
    for key, cfg in _cells(args, preset, pairs, attn_options, overrides, data, batch):
        if broadcast_object(store.is_done(key) if store else None, info):
            if not args.quiet and info.is_main:
                print(f"{NAME}: {key['variant']}/{key['flavor']} e{key['epochs']} s{key['seed']} already done, skipped")
            continue
        run_dir = run_dir_of(out, key, context)
        rows, res = run_cell(key, preset, data, cfg, info, run_dir, attn_options, args.eval_batches, args.fresh)
        if res.status == "interrupted":
            print(f"{NAME}: interrupted at step {res.step}; rerun the same command to resume from {run_dir}",
                  file=sys.stderr)
            return 128 + res.signal if res.signal else 1
        if store is not None:
            store.add(key, rows)
            if not args.keep_checkpoints:
                prune_checkpoints(run_dir)
        exit_code = max(exit_code, int(res.status == "nan"))
    if store is not None:
        _finish(out, store, env, args)
    return exit_code


def _finish(out, store, env, args) -> int:
    comp, verdicts = write_report(out, store, env, args.preset, run_dir_of, DEFAULT_VARIANTS, TUNING.get(args.preset))
    print(report.format_comparison(comp))
    print("\n".join(verdict_lines(verdicts)))
    print(f"{NAME}: tables and plots in {out}")
    return 0


def cell_rows(unit: list[dict], args) -> list[list[dict]] | None:
    """A work unit (protocol.Plan.work; a cluster job or a local worker): one process, no DDP. With ``--ensemble``
    a unit of several cells (one arm, one phase) trains as one grouped model where the arm allows it, else cell by
    cell; the rows say which (``ensemble_units``)."""
    info = DistInfo(device=resolve_device(args.device))
    preset, pairs, attn_options, overrides, data, batch, out, env, context = _setup(args, info)
    cfgs = [_config(args, preset, overrides, data, batch, key) for key in unit]
    extra = {}
    if ensemble_on(args, ENSEMBLE):
        got, reason = (grouped_unit(unit, preset, data, cfgs, info, out, context, attn_options, args.eval_batches,
                                    args.fresh) if len(unit) > 1 else (None, "one cell in its unit"))
        if got is not None:
            if any(res.status == "interrupted" for _, res in got):
                return None
            if not args.keep_checkpoints:
                for key in unit:
                    prune_checkpoints(run_dir_of(out, key, context))
            return [rows for rows, _ in got]
        extra = ensemble_columns(1, reason)
    rows_out = []
    for key, cfg in zip(unit, cfgs):
        run_dir = run_dir_of(out, key, context)
        rows, res = run_cell(key, preset, data, cfg, info, run_dir, attn_options, args.eval_batches, args.fresh)
        if res.status == "interrupted":
            return None
        if not args.keep_checkpoints:
            prune_checkpoints(run_dir)
        rows_out.append([{**r, **extra} for r in rows])
    return rows_out


def plan(args) -> Plan:
    """The cells as cluster jobs (``--launcher submitit``) or, for the decide preset, local processes; other local
    runs keep the DDP-aware loop of ``_run``."""
    return staged_plan(args)[0]


def staged_plan(args) -> tuple[Plan, int]:
    """(the plan, how many final cells still wait for their arm's tuning: ``tuning.execute_stages``)."""
    ensure_out_dir(args.out)
    info = DistInfo(device=resolve_device(args.device))
    preset, pairs, attn_options, overrides, data, batch, out, env, context = _setup(args, info)
    store = ResultStore(out, NAME, context, fresh=args.fresh, env=env)
    records = store.records() if args.preset in TUNING else None
    cells = [k for k, _ in _cells(args, preset, pairs, attn_options, overrides, data, batch, records)]
    waiting = [c for c in cells if is_waiting(c)]
    if not args.dry_run:  # a dry run prices the waiting cells; a run starts them once their arm is tuned
        cells = [c for c in cells if c not in waiting]
    threads = args.threads or preset.threads or 1
    units = ensemble_units(cells) if ensemble_on(args, ENSEMBLE) else [[c] for c in cells]
    return Plan(store, units, functools.partial(cell_rows, args=args),
                lambda: _finish(out, store, env, args),
                workers=default_workers(info.device.type, args.jobs) if args.preset in TUNING else 1,
                worker_init=functools.partial(torch.set_num_threads, threads),
                describe=lambda u: f"{u[0]['variant']}/{u[0]['flavor']}{'/' + u[0]['phase'] if 'phase' in u[0] else ''}"
                                   f" e{u[0]['epochs']} s{u[0]['seed']}"
                                   f"{f' (+{len(u) - 1} grouped)' if len(u) > 1 else ''}"), len(waiting)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
