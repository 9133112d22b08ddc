"""Training and scoring one cell of a token-sequence stand-in (MQAR, the masked character LM), or, with ensembles on,
one arm's cells of one phase as one grouped model (``engine.grouped``). The families give the task
(``TokenTask``: data, loss, scores, the trivial reference) and the arms (``experiments.arms``); this module builds the
backbone, runs the engine's loop with early stopping on the task's validation score, scores the best checkpoint and
writes the rows every cell stores:

- the task's validation scores (and, outside tuning, its test scores and trivial reference);
- ``steps_run`` and ``best_step`` (early stopping), ``train_time_s`` (wall, inside training steps), ``train_cpu_s``
  (the process's CPU time over the cell's training and validation: what the dry run prices), ``eval_time_s``;
- ``params``, ``attention_params``, ``fwd_flops`` (one sequence, analytic) and ``train_flops`` (3 × forward × the
  sequences trained on: the analytic training compute);
- with ensembles, ``ensemble`` (members trained together; 1 for one at a time) and ``ensemble_reason``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine import TrainConfig, TrainResult, discard_run, load_checkpoint, train
from ..engine.checkpoint import strip_prefixes
from ..engine.ensemble import EnsembleUnsupported
from ..engine.grouped import Member, group_for_training, train_grouped
from ..envinfo import set_seed
from ..measure.params import count_params
from ..results import cell_id
from .arms import build_decoder, model_costs
from .ensemble_units import ensemble_columns, unit_tag


class TokenTask(ABC):
    """What a family gives for one cell: ``vocab_size``, ``seq_len``, ``causal``; ``sampler(seed, batch_size)``
    (training batches addressable by step); ``val_sets()`` (``{name: fn(limit) -> batches}``, the early-stopping and
    tuning score); ``loss_fn(batch, output)`` (an attribute set by the family: the engine's loss, the training loss
    under autograd and the validation score inside ``evaluate``); ``score(model, split)`` (the final rows of a split)
    and ``reference_rows()`` (the trivial predictor's rows, stored beside the test scores)."""

    vocab_size: int
    seq_len: int
    causal: bool = True
    loss_fn: Callable[[tuple, object], torch.Tensor]

    @abstractmethod
    def sampler(self, seed: int, batch_size: int) -> Callable[[int], tuple]: ...

    @abstractmethod
    def val_sets(self) -> dict[str, Callable[[int | None], Iterable[tuple]]]: ...

    @abstractmethod
    def score(self, model, split: str) -> list[dict]: ...

    def reference_rows(self) -> list[dict]:
        return []


@dataclass(frozen=True)
class Backbone:
    """The sizes every arm shares (an arm may override ``n_heads`` and ``d_ff``) and the decoder's other options
    (``options``: e.g. an untied head and Zoology's embedding init for MQAR)."""

    d_model: int
    n_layers: int
    n_heads: int
    options: dict = field(default_factory=dict)


def run_dir_of(out: Path, cell: dict, context: dict | None = None) -> Path:
    """A cell's training directory; its name hashes the run context too (a checkpoint from other settings or another
    kind of machine is never resumed)."""
    return Path(out) / "runs" / f"{cell['arm']}-s{cell['seed']}-{cell_id(cell, context)[:8]}"


def _model(cell: dict, task: TokenTask, bb: Backbone):
    set_seed(cell["seed"])  # the per-seed initialisation, whichever path trains it
    return build_decoder(task.vocab_size, bb.d_model, bb.n_layers, bb.n_heads, task.seq_len, cell, task.causal,
                         **bb.options)


def _cfg(cell: dict, cfg: TrainConfig) -> TrainConfig:
    return cfg.replace(lr=cell["lr"], weight_decay=cell["weight_decay"]) if "phase" in cell else cfg


def _rows(cell: dict, task: TokenTask, model, res: TrainResult, cfg: TrainConfig, cpu_s: float,
          extra: dict) -> list[dict]:
    """The rows of a trained cell whose ``model`` holds the weights to score (the best checkpoint)."""
    params = count_params(model)
    n_params, fwd = model_costs(model, task.seq_len)
    common = {"status": res.status, "message": "", **extra}
    rows = [{"metric": "train_time_s", "value": res.train_time_s, "unit": "s"},
            {"metric": "train_cpu_s", "value": cpu_s, "unit": "CPU-s (training and validation)"},
            {"metric": "eval_time_s", "value": res.eval_time_s, "unit": "s"},
            {"metric": "params", "value": params["total_params"], "unit": "params"},
            {"metric": "attention_params", "value": params["attention_params"], "unit": "params"},
            {"metric": "fwd_flops", "value": fwd, "unit": "FLOP per sequence (analytic forward)"},
            {"metric": "train_flops", "value": 3.0 * fwd * cfg.batch_size * res.step,
             "unit": "FLOP (analytic, 3 × forward × sequences trained)"},
            {"metric": "steps_run", "value": res.step, "unit": "steps"},
            {"metric": "best_step", "value": res.best_step, "unit": "steps"}]
    if res.status == "nan":
        common["message"] = f"non-finite loss or gradient norm at step {res.step + 1}; see {res.log_path}"
        metric = "val_loss" if cell.get("phase") == "tune" else "test_loss"
        return [{**common, **r} for r in rows + [{"metric": metric, "value": float("nan"), "unit": "nats"}]]
    rows += task.score(model, "val")
    if cell.get("phase") != "tune":  # tuning reads validation only
        rows += task.score(model, "test") + task.reference_rows()
    return [{**common, **r} for r in rows]


def _load_best(model, path: Path, cfg: TrainConfig, res: TrainResult) -> None:
    if res.status == "ok" and cfg.patience and path.is_file():  # every score is the best validation checkpoint's
        model.load_state_dict(strip_prefixes(load_checkpoint(path)["model"]))


def run_cell(cell: dict, task: TokenTask, bb: Backbone, cfg: TrainConfig, run_dir: Path, fresh: bool = False,
             extra: dict | None = None) -> tuple[list[dict], TrainResult]:
    """Train one cell (resuming from its directory unless ``fresh``) and score it: (rows, result)."""
    cfg = _cfg(cell, cfg)
    model, opts = _model(cell, task, bb)
    if fresh:
        discard_run(run_dir)
    cpu0 = time.process_time()
    res = train(model, cfg.replace(seed=cell["seed"]), task.sampler(cell["seed"], cfg.batch_size), run_dir,
                eval_sets=task.val_sets(), loss_fn=task.loss_fn, resume=None if fresh else "auto",
                meta={"cell": cell, "attention_options": opts}, desc=f"{cell['arm']}/s{cell['seed']}")
    cpu_s = time.process_time() - cpu0
    if res.status == "interrupted":
        return [], res
    _load_best(model, run_dir / "checkpoints" / "best.pt", cfg, res)
    return _rows(cell, task, model, res, cfg, cpu_s, extra or {}), res


def run_grouped(unit: list[dict], task: TokenTask, bb: Backbone, cfg: TrainConfig, out: Path, context: dict,
                fresh: bool = False):
    """Train ``unit`` (one arm, one phase, one setting) as one grouped model: ([(rows, result)] per cell, "") or
    (None, why it cannot be grouped; the caller runs the cells one at a time)."""
    built = [_model(c, task, bb) for c in unit]
    models = [m for m, _ in built]
    samplers = [task.sampler(c["seed"], cfg.batch_size) for c in unit]
    try:
        grouped = group_for_training(models, (samplers[0](0)[0][:2],))
    except EnsembleUnsupported as exc:
        return None, str(exc)
    run_dirs = [run_dir_of(out, c, context) for c in unit]
    group_dir = Path(out) / "runs" / f"group-{unit[0]['arm']}-{unit[0].get('phase', 'seeds')}-{unit_tag(unit)}"
    if fresh:
        for d in run_dirs:
            discard_run(d)
        (group_dir / "group.pt").unlink(missing_ok=True)
    members = [Member(c["seed"], _cfg(c, cfg).lr, _cfg(c, cfg).weight_decay, smp, d,
                      {"cell": c, "attention_options": o})
               for c, (_, o), smp, d in zip(unit, built, samplers, run_dirs)]
    cpu0 = time.process_time()
    results = train_grouped(models, members, cfg, group_dir, eval_sets=task.val_sets(), loss_fn=task.loss_fn,
                            resume=not fresh, desc=f"{unit[0]['arm']} x{len(unit)}", grouped=grouped)
    if any(r.status == "interrupted" for r in results):
        return [([], r) for r in results], ""
    total_steps = max(1, sum(r.step for r in results))
    cpu = time.process_time() - cpu0
    out_rows = []
    for c, m, res in zip(unit, models, results):
        _load_best(m, res.checkpoint or Path("-"), _cfg(c, cfg), res)
        share = cpu * res.step / total_steps  # the group's CPU time, shared by the steps each member took
        out_rows.append((_rows(c, task, m, res, _cfg(c, cfg), share, ensemble_columns(len(unit))), res))
    return out_rows, ""


def run_unit(unit: list[dict], task_of: Callable[[dict], TokenTask], bb: Backbone, cfg: TrainConfig, out: Path,
             context: dict, ensemble: bool, fresh: bool = False) -> list[list[dict]] | None:
    """A work unit (``protocol.Plan.work``): rows per cell, or None when interrupted (resumable). With ``ensemble``
    a unit of several cells trains as one grouped model where the arm allows it, else cell by cell; the rows say
    which."""
    extra = {}
    if ensemble:
        got, reason = run_grouped(unit, task_of(unit[0]), bb, cfg, out, context, fresh) if len(unit) > 1 \
            else (None, "one cell in its unit")
        if got is not None:
            return None if any(r.status == "interrupted" for _, r in got) else [rows for rows, _ in got]
        extra = ensemble_columns(1, reason)
    rows_out = []
    for cell in unit:
        rows, res = run_cell(cell, task_of(cell), bb, cfg, run_dir_of(out, cell, context), fresh, extra)
        if res.status == "interrupted":
            return None
        rows_out.append(rows)
    return rows_out


__all__ = ["Backbone", "TokenTask", "run_cell", "run_dir_of", "run_grouped", "run_unit"]
