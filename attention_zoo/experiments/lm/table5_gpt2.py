"""Table 5 (DAMCHA paper p. 9): character-level GPT-2-scale pretraining on Enwik8, Text8 and their 50/50 Mix.

Rows MHA, DCMHA, DAMCHA (any registered variant on request); cross-entropy ↓; the paper quotes only relative
figures (docs/experiments.md §4): DAMCHA best everywhere, Mix −5.19 % vs MHA and −3.70 % vs DCMHA, and 1.90–3.70 %
below DCMHA across datasets. A cell is (dataset, variant, flavour, seed): one training run in its own directory
(``runs/<cell>/metrics.jsonl`` + ``checkpoints/``) whose final metrics go to the result store; a finished cell is
skipped on rerun and an interrupted one resumes from its newest valid checkpoint. Under ``torchrun`` every cell
trains with DDP and rank 0 writes.

Presets:
- ``paper``: N=12, d=768, h=12 (d_h=64), context 512, dropout 0.1, GPT-2 pre-LN decoder with learned positions
  and tied embeddings. The paper gives no recipe [U]; ours: AdamW lr 2.5e-4, β=(0.9, 0.95), weight decay 0.1,
  2,000 warm-up steps then cosine to 0.1·lr, clip 0.25, batch 32×512 tokens, 100k steps (1.64 B tokens), bf16
  autocast on CUDA. **DAMCHA generator**: ``hidden_dims=(1536, 1536)`` (w = 2d) and ``compact_rank=4``: the
  "P = output multiplicity" reading of App. D.4 (docs/experiments.md §7: d → w → w → P·d, the only reading under which
  DAMCHA matches MHA's parameter count at N=12, d=768, w=1536). The generator emits U, V ∈ R^{d×r}, i.e. 2r·d
  outputs, so P = 2r; P = 9 is not a rank, r = 4 (P = 8) is the nearest: G ≈ 22d² ≈ 13.0 M and DAMCHA's attention
  parameters are ≈ 0.96× MHA's. A full D² output would cost w·d² ≈ 906 M parameters.
- ``smoke``: the embedded Shakespeare corpus, N=2, d=64, h=4, context 64, 300 steps of 16×64 tokens; the same
  generator rule scaled down (``hidden_dims=(128, 128)``, ``compact_rank=4``). Final evaluation on an evenly
  spread, deterministic subset of the validation/test windows (``--eval-batches 0`` for the whole splits). One
  CPU thread unless ``--threads`` says otherwise: at this size OpenMP overhead outweighs a second core, and with
  other work on the machine two threads ran several times slower than one.
- ``decide``: the smoke model on Shakespeare trained to a validation plateau (early stopping, patience in steps,
  test scored at the best validation checkpoint), every arm tuned on one grid (``TUNING`` in ``lm.presets``;
  ``experiments.tuning``) then ten seeds at its own best. Arms: MHA, DCMHA and DAMCHA (the claims T5.*), ``mha_pm``,
  ``mha_ctx``, ``damcha_bm``. Runs through the protocol's plan, one cell per process (``--jobs``, default one per
  core). Grid: lr {2e-3, 4e-3, 8e-3} × weight decay {0.1, 0.3}, 5,000 steps (a first grid, lr 1e-3..4e-3 × wd
  0.01/0.1 at 3,000 steps, put every arm in its corner 4e-3 / 0.1, still improving at its last step), scored by
  the best-checkpoint validation loss of seeds 1000 and 1001; final seeds 0–9. Sized from that first run's final
  cells (one thread each, 2 workers): 37 (MHA) to 77 s (``mha_pm``) per 3,000 steps, ≈ 360 s for the six arms;
  22 runs per arm × 5/3 × 360 s ≈ 13,200 CPU-s + ≈ 10 % evaluation ≈ 4.0 core-hours ≈ 2.0 h on 2 cores with no
  early stop (the ceiling). No "shared" phase (another 60
  runs: 2.8 h); ``damcha_static`` is left out (Table 5 makes no f(x) claim). The stand-in learns: at 200 steps MHA's
  test loss is already 2.67 nats against the unigram's 3.29 (−19 %), where the gate asks for 1 %.

Options in a preset's ``attention_options`` go to every variant that accepts them (by option name, never by
variant name); each row records the options its variant received.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ... import report
from ...claims import verdict_lines
from ...data.text import DATASETS, load_char_corpus
from ...engine import (
    TrainConfig,
    parse_overrides,
    prune_checkpoints,
    result_identity,
)
from ...engine.distributed import DistInfo, broadcast_object, run_distributed
from ...envinfo import environment_record, resolve_device
from ...measure.status import free_memory, is_oom, short_message
from ...registry import is_attention, resolved_options_json
from ...results import ResultStore
from ..common import (
    FIVE_SEEDS,
    ListAction,
    base_parser,
    experiment_main,
    non_negative_int,
    positive_int,
    run_context,
    select_variants,
    setup_threads,
    variant_flavours,
)
from ..ensemble_units import add_ensemble_argument, ensemble_columns, ensemble_on, ensemble_units
from ..protocol import Plan, add_launcher_arguments, default_workers, execute
from ..tuning import execute_stages, is_waiting, tuned_cells
from .presets import BUDGET_FRACS, DECIDE_ARMS, DEFAULT_VARIANTS, ENSEMBLE, PRESETS, TUNING
from .table5_report import NAME, write_report
from .training import (  # noqa: F401
    _evaluators,
    _peak,
    _reset_peak,
    _status_mib,
    budget_scores_at_best,
    build_model,
    cell_result_rows,
    grouped_unit,
    run_cell,
    run_dir_of,
)


def build_parser():
    p = base_parser(NAME, __doc__.split("\n")[0], default_seeds={"smoke": [0], "decide": list(range(10)),
                                                                  "*": FIVE_SEEDS},
                    presets=("smoke", "decide", "paper"))
    p.set_defaults(variants=None)
    p.add_argument("--datasets", action=ListAction, join=True, default=None,
                   help=f"subset of {', '.join(DATASETS)} (default: the preset's datasets)")
    p.add_argument("--data-dir", default=None,
                   help="where enwik8/text8 are (or get downloaded); default $ATTENTION_ZOO_DATA or "
                        "~/.cache/attention_zoo/data")
    p.add_argument("--no-download", dest="download", action="store_false", help="fail instead of downloading")
    p.add_argument("--steps", dest="max_steps", type=positive_int, default=None,
                   help="override the preset's optimizer steps")
    p.rename("--max-steps", "--steps")
    p.add_argument("--eval-batches", type=non_negative_int, default=None,
                   help="final evaluation: batches per split, evenly spread (0 = the whole splits; default: preset)")
    p.add_argument("--train", nargs="*", default=[], metavar="KEY=VALUE",
                   help="TrainConfig overrides, e.g. --train lr=1e-3 grad_accum=2 amp=off")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep a finished cell's checkpoints (default: delete them once its metrics are stored)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="decide preset: cells trained at once, one process each (default: CPU cores up to 8 on cpu)")
    add_ensemble_argument(p)
    p.epilog = (f"Defaults: variants mha,dcmha,damcha (decide: {DECIDE_ARMS}; those registered); --flavour "
                "damcha_repo runs the baselines as the paper ran them (reproduce/all.py --preset paper does). The "
                "smoke preset uses 1 CPU thread "                "unless --threads is given. "
                "Multi-GPU: torchrun --nproc_per_node=N reproduce/table5_gpt2.py")
    return add_launcher_arguments(p)


def _variants(spec: str | None, preset: str = "smoke") -> list[str]:
    if spec is None:
        return [v for v in (DECIDE_ARMS.split(",") if preset in TUNING else DEFAULT_VARIANTS) if is_attention(v)]
    return select_variants(spec)


def run(args) -> int:
    """Run the grid; exit code 0, 1 if any cell hit NaN/inf, or 128+signal when interrupted (resumable)."""
    setup_threads(args.threads if args.threads is not None else PRESETS[args.preset].threads)
    if args.preset in TUNING:  # tuning parity: the grid, then each arm's seeds at its best
        return execute_stages(lambda: staged_plan(args), args, NAME)
    if args.launcher == "submitit" or args.dry_run or ensemble_on(args, ENSEMBLE):  # the protocol's plan: the
        return execute(plan(args), args, NAME)  # cluster's units, the dry run's, or the grouped seeds' units
    return run_distributed(args.device, lambda info: _run(args, info))


def _setup(args, info: DistInfo):
    """(preset, datasets, TrainConfig, final eval batches, pairs, out, env, context) of a run."""
    preset = PRESETS[args.preset]
    datasets = [d.strip() for d in args.datasets.split(",")] if args.datasets else list(preset.datasets)
    for d in datasets:
        if d not in DATASETS:
            raise ValueError(f"datasets: {d!r} is not one of {', '.join(DATASETS)}")
    overrides = {**preset.train, **parse_overrides(args.train), "progress": not args.quiet and args.preset not in
                 TUNING}  # the decide preset's processes share one terminal: the plan's bar counts cells
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    cfg = TrainConfig.from_dict(overrides)
    final_batches = preset.final_eval_batches if args.eval_batches is None else (args.eval_batches or None)
    pairs = variant_flavours(_variants(args.variants, args.preset), args.flavour)
    env = environment_record(info.device, preset=args.preset, world_size=info.world_size, train_config=cfg.to_dict())
    tuning = TUNING.get(args.preset)
    context = run_context(args, info.device,
                          selection=("datasets", "keep_checkpoints", "download", "data_dir", "train", "jobs",
                                     "ensemble"),
                          train_config=result_identity(cfg.to_dict()), preset=asdict(preset),
                          **({"tuning": tuning.provenance()} if tuning else {}),
                          **({"budget_fracs": BUDGET_FRACS[args.preset]} if args.preset in BUDGET_FRACS else {}))
    return preset, datasets, cfg, final_batches, pairs, Path(args.out), env, context


def _keys(args, ds, pairs, cfg, final_batches, records: list[dict] | None = None) -> list[dict]:
    """The cells of one dataset; a tuned preset's as far as ``records`` (the store) allow, with the final cells of
    arms still tuning marked by lr None."""
    arms = [{"experiment": NAME, "preset": args.preset, "dataset": ds, "variant": variant, "flavor": flavor,
             "attention_options": resolved_options_json(variant, {"flavor": flavor}), "max_steps": cfg.max_steps,
             "eval_batches": final_batches} for variant, flavor in pairs]
    if args.preset in TUNING:
        cells, waiting, _ = tuned_cells(replace(TUNING[args.preset], seeds=tuple(args.seeds)), arms, records or [])
        return cells + waiting
    return [{"experiment": NAME, "preset": args.preset, "dataset": ds, "variant": variant, "flavor": flavor,
             "attention_options": resolved_options_json(variant, {"flavor": flavor}), "seed": seed,
             "max_steps": cfg.max_steps, "eval_batches": final_batches}
            for variant, flavor in pairs for seed in args.seeds]


def _one(key, preset, corpus, cfg, info, out, context, final_batches, fresh):
    """(rows, status, run dir) of one cell; an OOM is a status row on one process."""
    run_dir = run_dir_of(out, key, context)
    try:
        rows, res = run_cell(key, preset, corpus, cfg, info, run_dir, final_batches, fresh)
        return rows, res, run_dir
    except Exception as exc:  # noqa: BLE001 - an OOM is a result; anything else propagates
        if not is_oom(exc) or info.distributed:
            raise
        free_memory(info.device)
        return [{"metric": "test_loss", "value": math.nan, "unit": "nats", "status": "oom",
                 "message": short_message(exc)}], None, run_dir


def _run(args, info: DistInfo) -> int:
    preset, datasets, cfg, final_batches, pairs, out, env, context = _setup(args, info)
    store = ResultStore(out, NAME, context, fresh=args.fresh, env=env) if info.is_main else None
    exit_code = 0
    for ds in datasets:
        corpus = None
        for key in _keys(args, ds, pairs, cfg, final_batches):
            if broadcast_object(store.is_done(key) if store else None, info):
                continue
            corpus = corpus or load_char_corpus(ds, args.data_dir, args.download)
            rows, res, run_dir = _one(key, preset, corpus, cfg, info, out, context, final_batches, args.fresh)
            if res is not None and res.status == "interrupted":
                print(f"{NAME}: interrupted at step {res.step}; rerun the same command to resume from "
                      f"{run_dir}", file=sys.stderr)
                return 128 + res.signal if res.signal else 1
            if store is not None:
                store.add(key, rows)
                if not args.keep_checkpoints:
                    prune_checkpoints(run_dir)
            exit_code = max(exit_code, int(res is not None and res.status == "nan"))
    if store is not None:
        _finish(out, store, env, args)
    return exit_code


def _finish(out, store, env, args) -> int:
    comp, verdicts = write_report(out, store, env, args.preset, run_dir_of, TUNING.get(args.preset))
    print(report.format_comparison(comp))
    print("\n".join(verdict_lines(verdicts)))
    print(f"{NAME}: tables and plots in {out}")
    return 0


def cell_rows(unit: list[dict], args) -> list[list[dict]] | None:
    """A work unit (protocol.Plan.work; a cluster job or a local worker): one process, no DDP. With ``--ensemble``
    a unit of several cells (one arm, one phase) trains as one grouped model where the arm allows it, else cell by
    cell; the rows say which (``ensemble_units``)."""
    info = DistInfo(device=resolve_device(args.device))
    preset, _, cfg, final_batches, _, out, _, context = _setup(args, info)
    extra = {}
    if ensemble_on(args, ENSEMBLE):
        corpus = load_char_corpus(unit[0]["dataset"], args.data_dir, args.download)
        got, reason = (grouped_unit(unit, preset, corpus, cfg, info, out, context, final_batches, args.fresh)
                       if len(unit) > 1 else (None, "one cell in its unit"))
        if got is not None:
            if any(res.status == "interrupted" for _, res in got):
                return None
            if not args.keep_checkpoints:
                for key in unit:
                    prune_checkpoints(run_dir_of(out, key, context))
            return [rows for rows, _ in got]
        extra = ensemble_columns(1, reason)
    rows_out = []
    for key in unit:
        corpus = load_char_corpus(key["dataset"], args.data_dir, args.download)
        rows, res, run_dir = _one(key, preset, corpus, cfg, info, out, context, final_batches, args.fresh)
        if res is not None and res.status == "interrupted":
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
    info = DistInfo(device=resolve_device(args.device))
    preset, datasets, cfg, final_batches, pairs, out, env, context = _setup(args, info)
    store = ResultStore(out, NAME, context, fresh=args.fresh, env=env)
    records = store.records() if args.preset in TUNING else None
    cells = [k for ds in datasets for k in _keys(args, ds, pairs, cfg, final_batches, records)]
    waiting = [c for c in cells if is_waiting(c)]
    if not args.dry_run:  # a dry run prices the waiting cells; a run starts them once their arm is tuned
        cells = [c for c in cells if c not in waiting]
    threads = args.threads or preset.threads or 1
    units = ensemble_units(cells) if ensemble_on(args, ENSEMBLE) else [[c] for c in cells]
    return Plan(store, units, functools.partial(cell_rows, args=args),
                lambda: _finish(out, store, env, args),
                workers=default_workers(info.device.type, args.jobs) if args.preset in TUNING else 1,
                worker_init=functools.partial(torch.set_num_threads, threads),
                describe=lambda u: f"{u[0]['dataset']}/{u[0]['variant']}/{u[0]['flavor']}"
                                   f"{'/' + u[0]['phase'] if 'phase' in u[0] else ''} s{u[0]['seed']}"
                                   f"{f' (+{len(u) - 1} grouped)' if len(u) > 1 else ''}"), len(waiting)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
