"""MQAR, multi-query associative recall (Zoology, Arora, Eyuboglu et al., ICLR 2024): a capability ladder for the
seven variants and the controls, and the stand-in for DCFormer's in-context claim (DC.icl) and its composition
ablation (DC.ablate).

A cell is (arm, rung (T, n), seed): one 2-layer decoder trained on a stream of fresh MQAR sequences to a validation
plateau (``presets`` says the recipe; ``task`` the loss and scores), scored on a fixed test set: query accuracy
(fraction), query cross-entropy (nats), the chance level 1/n, steps run, best step, CPU seconds, parameters and
FLOPs. The store's long CSV names ``arm, variant, seed, phase, seq_len, n_pairs``, the metric and its value.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...data.mqar import MQARSpec
from ...engine import result_identity
from ...envinfo import environment_record, resolve_device
from ..arm_plan import SELECTION, add_arm_arguments, arm_label, preset_setup, prior_seconds, select_arms, setting_cells
from ..common import base_parser, experiment_main, open_store, run_context, setup_threads
from ..ensemble_units import ensemble_on, ensemble_units
from ..protocol import Plan, add_launcher_arguments, default_workers, execute
from ..token_cells import Backbone, run_unit
from ..tuning import execute_stages, is_waiting
from .presets import (
    CLAIM_ARMS,
    EVAL_SHARE,
    EXPECTED_STEP_FRACTION,
    FEWER_SEEDS,
    MARGIN,
    PRESETS,
    STEP_SECONDS,
    TUNE_AT,
    TUNING,
)
from .report import NAME, write_report
from .task import MQARTask

# Seed ensembles are opt-in (--ensemble): at these sizes grouping did not pay for every arm (one thread, members of
# one MQAR arm: MHA 17.8 ms per member-step grouped vs 17.8 alone at T = 32 and 37.2 vs 33.6 at T = 64; DCMHA 27.1 vs
# 36.1 at T = 32), so the presets train one cell at a time; --ensemble groups every arm that allows it.
ENSEMBLE: frozenset[str] = frozenset()


def build_parser():
    p = base_parser(NAME, __doc__.split("\n")[0], seeds=True, variants=False, presets=tuple(PRESETS),
                    default_seeds={"decide": list(range(10)), "*": [0]})
    add_arm_arguments(p)
    p.add_argument("--train", nargs="*", default=[], metavar="KEY=VALUE",
                   help="TrainConfig overrides, e.g. --train lr=3e-3 eval_every=50")
    p.epilog = ("The decide run: python reproduce/mqar.py --preset decide --out results/mqar_decide (one paper's "
                "arms: --paper dcmha). Arms and rungs: attention_zoo/experiments/mqar/presets.py.")
    return add_launcher_arguments(p)


def _setup(args):
    return preset_setup(args, PRESETS, TUNING)


def _seeds(args, preset, tuning):
    final = tuple(args.seeds) if args.seeds is not None else preset.seeds

    def of(arm) -> tuple[int, ...]:
        if tuning is None or arm.label in CLAIM_ARMS:
            return final
        return tuple(s for s in final if s in FEWER_SEEDS) or final[:len(FEWER_SEEDS)]
    return of


def _cells(args, preset, cfg, tuning, records) -> list[dict]:
    arms = select_arms(preset.arms, args)
    settings = [{"seq_len": t, "n_pairs": n} for t, n in preset.rungs]
    base = {"experiment": NAME, "preset": args.preset, "vocab_size": preset.vocab_size, "max_steps": cfg.max_steps}
    tune_at = {"seq_len": TUNE_AT[0], "n_pairs": TUNE_AT[1]} if TUNE_AT in preset.rungs else None
    return setting_cells(base, arms, settings, tune_at, tuning, records, _seeds(args, preset, tuning))


@functools.lru_cache(maxsize=8)
def _task(vocab: int, seq_len: int, n_pairs: int, n_val: int, n_test: int) -> MQARTask:
    return MQARTask(MQARSpec(vocab, seq_len, n_pairs), n_val, n_test)


def task_of(cell: dict, preset) -> MQARTask:
    return _task(cell["vocab_size"], cell["seq_len"], cell["n_pairs"], preset.n_val, preset.n_test)


def unit_rows(unit: list[dict], args) -> list[list[dict]] | None:
    """A work unit (``protocol.Plan.work``): one cell, or one arm's cells of one phase and rung."""
    preset, cfg, _ = _setup(args)
    store_ctx = _context(args)
    bb = Backbone(preset.d_model, preset.n_layers, preset.n_heads, dict(preset.backbone))
    return run_unit(unit, functools.partial(task_of, preset=preset), bb, cfg, Path(args.out), store_ctx,
                    ensemble_on(args, ENSEMBLE), getattr(args, "fresh", False))


def _context_kw(args) -> dict:
    """What besides the cells keys the store (``common.run_context``): the recipe, the preset, the tuning grid."""
    preset, cfg, tuning = _setup(args)
    return dict(selection=(*SELECTION, "train", "steps"), train_config=result_identity(cfg.to_dict()),
                preset=asdict(preset),
                **({"tuning": tuning.provenance()} if tuning else {}))


def _context(args) -> dict:
    return run_context(args, resolve_device(args.device), **_context_kw(args))


def _step_seconds(cell: dict) -> float | None:
    s = STEP_SECONDS.get((cell["arm"], cell["seq_len"]))
    return None if s is None else s * MARGIN * (1 + EVAL_SHARE)


def staged_plan(args) -> tuple[Plan, int]:
    """(the plan, how many final cells still wait for their arm's tuning)."""
    t0 = time.perf_counter()
    device = resolve_device(args.device)
    if device.type != "cpu":
        raise ValueError("device: the MQAR presets are sized for the CPU (one thread per worker); use --device cpu")
    preset, cfg, tuning = _setup(args)
    setup_threads(args.threads or 1)
    env = environment_record(device, preset=args.preset, train_config=cfg.to_dict())
    store = open_store(args, NAME, device, env, **_context_kw(args))
    cells = _cells(args, preset, cfg, tuning, store.records() if tuning else [])
    waiting = [c for c in cells if is_waiting(c)]
    if not args.dry_run:  # a dry run prices the waiting cells; a run starts them once their arm is tuned
        cells = [c for c in cells if c not in waiting]
    units = ensemble_units(cells) if ensemble_on(args, ENSEMBLE) else [[c] for c in cells]
    workers = default_workers(device.type, args.jobs)

    def finish() -> int:
        write_report(Path(args.out), store, env, args.preset, tuning)
        print(f"{NAME}: {len(cells)} cells in {time.perf_counter() - t0:.0f} s; report in {args.out}")
        return 0

    expected = round(cfg.max_steps * EXPECTED_STEP_FRACTION) if cfg.patience else cfg.max_steps
    return Plan(store, units, functools.partial(unit_rows, args=args), finish, workers=workers,
                worker_init=functools.partial(torch.set_num_threads, args.threads or 1),
                describe=lambda u: f"{arm_label(u[0])}{'/' + u[0]['phase'] if 'phase' in u[0] else ''} "
                                   f"s{u[0]['seed']}{f' (+{len(u) - 1} grouped)' if len(u) > 1 else ''}",
                prior=prior_seconds(_step_seconds, lambda c: expected)), len(waiting)


def plan(args) -> Plan:
    return staged_plan(args)[0]


def run(args) -> int:
    if args.preset in TUNING:
        return execute_stages(lambda: staged_plan(args), args, NAME)
    return execute(plan(args), args, NAME)


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
