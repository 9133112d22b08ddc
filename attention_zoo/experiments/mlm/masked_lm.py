"""A masked character LM (bidirectional) for the baselines' own claims: Talking-Heads Attention's masked-LM gain, its
pre/post ablation and its head sweep; MoA's masked-LM gain and its sweep over experts; ColMHA against concatenated
heads over the key width; MMA in the encoder setting its backward heads need.

A cell is (arm, seed): one 2-layer bidirectional model (``presets`` says the recipe and the arms; ``task`` the data
and scores) trained to a validation plateau and scored at its best validation checkpoint: masked-character
cross-entropy (nats) and perplexity on the validation and test windows, the unigram reference, the expert-load
statistics of MoA arms, steps run, best step, CPU seconds, parameters and FLOPs.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...engine import result_identity
from ...envinfo import environment_record, resolve_device
from ..arm_plan import (
    SELECTION,
    add_arm_arguments,
    arm_label,
    preset_setup,
    prior_seconds,
    resolve_matches,
    select_arms,
    setting_cells,
)
from ..arms import build_decoder, matched_d_ff, model_costs
from ..common import base_parser, experiment_main, open_store, run_context, setup_threads
from ..ensemble_units import ensemble_on, ensemble_units
from ..protocol import Plan, add_launcher_arguments, default_workers, execute
from ..token_cells import Backbone, run_unit
from ..tuning import execute_stages, is_waiting
from .presets import EVAL_SHARE, EXPECTED_STEP_FRACTION, MARGIN, PRESETS, STEP_SECONDS, TUNING
from .report import NAME, write_report
from .task import MaskedLMTask

# Seed ensembles are opt-in (--ensemble): at these sizes grouping does not pay (one thread, ten members of one arm,
# CPU ms per member-step grouped vs alone: MHA 21.5 vs 21.7, THA 35.6 vs 32.7, MoA 30.7 vs 36.2, ColMHA D̃ = 16
# 24.0 vs 26.4; MQAR's MHA at T = 64 37.2 vs 33.6), so the presets train one cell at a time; --ensemble groups every
# arm that allows it and falls back per arm.
ENSEMBLE: frozenset[str] = frozenset()


def build_parser():
    p = base_parser(NAME, __doc__.split("\n")[0], variants=False, presets=tuple(PRESETS),
                    default_seeds={"decide": list(range(10)), "*": [0]})
    add_arm_arguments(p)
    p.add_argument("--train", nargs="*", default=[], metavar="KEY=VALUE",
                   help="TrainConfig overrides, e.g. --train lr=3e-3 eval_every=50")
    p.epilog = ("The decide run: python reproduce/masked_lm.py --preset decide --out results/masked_lm_decide (one "
                "paper's arms: --paper tha|moa|colmha|mma). Arms: attention_zoo/experiments/mlm/presets.py.")
    return add_launcher_arguments(p)


def _setup(args):
    return preset_setup(args, PRESETS, TUNING)


@functools.lru_cache(maxsize=4)
def _task(preset_name: str, eval_max_batches: int | None) -> MaskedLMTask:
    p = PRESETS[preset_name]
    return MaskedLMTask(p.seq_len, p.mask_rate, p.eval_batch, eval_max_batches, p.final_batches, p.dataset)


def _solver(preset, task: MaskedLMTask):
    """``solve(control, target) -> d_ff``: the matched control's FFN width at the preset's sizes."""
    def solve(control, target) -> int:
        with torch.device("meta"):
            dec, _ = build_decoder(task.vocab_size, preset.d_model, preset.n_layers, preset.n_heads, task.seq_len,
                                   target, causal=False)
        return matched_d_ff(control.match[0], model_costs(dec, task.seq_len), task.vocab_size, preset.d_model,
                            preset.n_layers, preset.n_heads, task.seq_len, control, causal=False)
    return solve


def _cells(args, preset, cfg, tuning, records) -> list[dict]:
    task = _task(args.preset, cfg.eval_max_batches)
    arms = resolve_matches(select_arms(preset.arms, args), _solver(preset, task))
    final = tuple(args.seeds) if args.seeds is not None else preset.seeds
    base = {"experiment": NAME, "preset": args.preset, "dataset": preset.dataset, "max_steps": cfg.max_steps}
    return setting_cells(base, arms, [{}], None, tuning, records, lambda arm: final)


def _context_kw(args) -> dict:
    """What besides the cells keys the store (``common.run_context``): the recipe, the preset, the tuning grid."""
    preset, cfg, tuning = _setup(args)
    return dict(selection=(*SELECTION, "train", "steps"), train_config=result_identity(cfg.to_dict()),
                preset=asdict(preset),
                **({"tuning": tuning.provenance()} if tuning else {}))


def unit_rows(unit: list[dict], args) -> list[list[dict]] | None:
    """A work unit (``protocol.Plan.work``): one cell, or one arm's cells of one phase."""
    preset, cfg, _ = _setup(args)
    task = _task(args.preset, cfg.eval_max_batches)
    bb = Backbone(preset.d_model, preset.n_layers, preset.n_heads)
    context = run_context(args, resolve_device(args.device), **_context_kw(args))
    return run_unit(unit, lambda cell: task, bb, cfg, Path(args.out), context, ensemble_on(args, ENSEMBLE),
                    getattr(args, "fresh", False))


def _step_seconds(cell: dict) -> float | None:
    s = STEP_SECONDS.get(cell["arm"])
    return None if s is None else s * MARGIN * (1 + EVAL_SHARE)


def staged_plan(args) -> tuple[Plan, int]:
    """(the plan, how many final cells still wait for their arm's tuning)."""
    t0 = time.perf_counter()
    device = resolve_device(args.device)
    if device.type != "cpu":
        raise ValueError("device: the masked-LM presets are sized for the CPU (one thread per worker); use --device "
                         "cpu")
    preset, cfg, tuning = _setup(args)
    setup_threads(args.threads or 1)
    env = environment_record(device, preset=args.preset, train_config=cfg.to_dict())
    store = open_store(args, NAME, device, env, **_context_kw(args))
    cells = _cells(args, preset, cfg, tuning, store.records() if tuning else [])
    waiting = [c for c in cells if is_waiting(c)]
    if not args.dry_run:  # a dry run prices the waiting cells; a run starts them once their arm is tuned
        cells = [c for c in cells if c not in waiting]
    units = ensemble_units(cells) if ensemble_on(args, ENSEMBLE) else [[c] for c in cells]

    def finish() -> int:
        write_report(Path(args.out), store, env, args.preset, tuning)
        print(f"{NAME}: {len(cells)} cells in {time.perf_counter() - t0:.0f} s; report in {args.out}")
        return 0

    expected = round(cfg.max_steps * EXPECTED_STEP_FRACTION) if cfg.patience else cfg.max_steps
    return Plan(store, units, functools.partial(unit_rows, args=args), finish,
                workers=default_workers(device.type, args.jobs),
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
