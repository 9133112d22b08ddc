"""The character-LM cell, shared by Table 5 (``lm``) and the scale ladder (``scaling``): the decoder, one training run
(or, with ``--ensemble``, the seeds of one arm as one grouped model) with its budget scores, the final evaluation and
the rows a cell stores. The families plan the cells; what differs between them comes in as arguments: the model's
shape (``shape``: any object with ``n_layers, d_model, n_heads, context, dropout, attention_options,
eval_batch_size, eval_stride``, e.g. Table 5's ``Preset``), the budget fractions at which a final cell's test loss
is read, and ``extra_rows(cell, model, result, train_cpu_s) -> rows`` for rows of the family's own.

``train_cpu_s`` (handed to ``extra_rows``): the run's training wall time (``TrainResult.train_time_s``, evaluation
excluded) times the CPU share of this call's training (its process CPU seconds over its wall seconds, both less
those spent in evaluations; ``_CpuClock``): the CPU seconds of the training itself, which another process on the
same core does not inflate as it inflates wall time; a resumed run counts its earlier part at this call's share. In
a seed ensemble each member's ``train_time_s`` is its share of the group's steps (``engine.grouped``), so its CPU
seconds are that share of the group's."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..data.text import WindowEvaluator, WindowSampler, bpc
from ..engine import (
    TrainConfig,
    TrainResult,
    batch_weight,
    discard_run,
    evaluate,
    load_checkpoint,
    train,
)
from ..engine.checkpoint import strip_prefixes
from ..engine.distributed import DistInfo
from ..engine.ensemble import EnsembleUnsupported, group_models
from ..engine.grouped import Member, evaluate_members, group_for_training, train_grouped
from ..envinfo import set_seed
from ..measure.params import count_params
from ..models import Decoder
from ..registry import split_options
from ..results import cell_id
from .ensemble_units import ensemble_columns, unit_tag


def _reset_peak(device: torch.device) -> bool:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:  # Linux >= 4.0: reset VmHWM to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_mib(field_name: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak(device: torch.device, reset_ok: bool) -> tuple[str, float]:
    if device.type == "cuda":
        return "peak_alloc_mib", torch.cuda.max_memory_allocated(device) / 2**20
    if reset_ok:
        return "peak_rss_mib", _status_mib("VmHWM")
    return "peak_rss_mib_since_start", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_dir_of(out: Path, cell: dict, context: dict | None = None) -> Path:
    """The cell's training directory; its name hashes the run context too, so a checkpoint trained with other
    settings or on another kind of machine is never resumed."""
    tag = cell_id(cell, context)[:8]
    return Path(out) / "runs" / f"{cell['dataset']}-{cell['variant']}-{cell['flavor']}-s{cell['seed']}-{tag}"


def build_model(cell: dict, shape, corpus) -> tuple[Decoder, dict]:
    """The cell's model, built after ``set_seed(seed)``, and the options its attention received."""
    opts, _ = split_options(cell["variant"], {**shape.attention_options, "flavor": cell["flavor"]})
    set_seed(cell["seed"])
    return Decoder(corpus.vocab_size, shape.d_model, shape.n_layers, shape.n_heads, attention=cell["variant"],
                   attention_options=opts, max_seq_len=shape.context, dropout=shape.dropout), opts


def _evaluators(shape, corpus) -> dict:
    return {split: {name: WindowEvaluator(arr, shape.context, shape.eval_batch_size, shape.eval_stride)
                    for name, arr in getattr(corpus, split).items()} for split in ("val", "test")}


class _CpuClock:
    """The CPU share of a training call: its process CPU seconds over its wall seconds, both less those spent inside
    evaluations (each evaluation set's batches timed from the first asked for to the last consumed, the forward
    passes running in between; budget scoring as a whole)."""

    def __init__(self):
        self.eval_cpu = self.eval_wall = 0.0
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def _add(self, c0: float, w0: float) -> None:
        self.eval_cpu += time.process_time() - c0
        self.eval_wall += time.perf_counter() - w0

    def sets(self, eval_sets: dict) -> dict:
        return {name: self._timed(fn) for name, fn in eval_sets.items()}

    def _timed(self, fn):
        def batches(limit=None):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                yield from fn(limit)
            finally:
                self._add(c0, w0)
        return batches

    def wrap(self, score):
        if score is None:
            return None

        def timed(net):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return score(net)
            finally:
                self._add(c0, w0)
        return timed

    def share(self) -> float:
        """CPU seconds per wall second of the call's training (1 with one thread on an idle core)."""
        wall = time.perf_counter() - self.wall0 - self.eval_wall
        return (time.process_time() - self.cpu0 - self.eval_cpu) / wall if wall > 0 else float("nan")


def run_cell(cell: dict, shape, corpus, cfg: TrainConfig, info: DistInfo, run_dir: Path,
             final_eval_batches: int | None, fresh: bool = False, budget_fracs: tuple[float, ...] = (),
             extra_rows: Callable | None = None) -> tuple[list[dict], TrainResult]:
    """Train one cell (resuming if its directory has a checkpoint, unless ``fresh``: then from scratch, the old
    checkpoints discarded) and evaluate it; returns (rows, result). ``budget_fracs``: fractions of the step budget
    at which a final cell's test loss is read at its best validation checkpoint so far (a tuning cell reads
    validation only); ``extra_rows``: the family's own rows (module docstring)."""
    variant, flavor, seed = cell["variant"], cell["flavor"], cell["seed"]
    if "phase" in cell:  # a tuned preset: the cell names its setting
        cfg = cfg.replace(lr=cell["lr"], weight_decay=cell["weight_decay"])
    model, opts = build_model(cell, shape, corpus)
    params = count_params(model)
    sampler = WindowSampler(corpus.train, shape.context, cfg.batch_size, seed=seed)
    evaluators = _evaluators(shape, corpus)
    reset_ok = _reset_peak(info.device)
    base_rss = _status_mib("VmRSS") if info.device.type == "cpu" else None
    if fresh and info.is_main:
        discard_run(run_dir)
    fracs = tuple(budget_fracs) if cell.get("phase") != "tune" else ()  # tuning: validation only

    def test_losses(net) -> dict[str, float]:  # the test split as the final score reads it (the mix: its mean)
        losses = {name: evaluate(net, ev(final_eval_batches), info=info, amp=cfg.amp)
                  for name, ev in evaluators["test"].items()}
        return {**losses, cell["dataset"]: sum(losses.values()) / len(losses)}

    clock = _CpuClock()
    res = train(model, cfg.replace(seed=seed), sampler, run_dir, eval_sets=clock.sets(evaluators["val"]),
                resume=None if fresh else "auto", info=info, meta={"cell": cell, "attention_options": opts},
                desc=f"{cell['dataset']}/{variant}/{flavor}/s{seed}", budget_fracs=fracs,
                budget_score=clock.wrap(test_losses) if fracs else None)
    cpu_s = clock.share() * res.train_time_s  # a resumed run: its earlier part at this call's share
    if res.status == "interrupted":
        return [], res
    if res.status == "ok" and cfg.patience:  # early stopping: every score is the best validation checkpoint's
        model.load_state_dict(strip_prefixes(load_checkpoint(run_dir / "checkpoints" / "best.pt")["model"]))

    def losses_of(split: str) -> dict[str, float]:
        reused = budget_scores_at_best(res, cfg) if split == "test" else None
        if reused is not None:  # a budget fraction scored this very checkpoint: its test losses stand
            return {name: reused[name] for name in evaluators[split]}
        return {name: evaluate(model, ev(final_eval_batches), info=info, amp=cfg.amp)
                for name, ev in evaluators[split].items()}

    rows = cell_result_rows(cell, corpus, cfg, info, res, model, params, opts, evaluators, final_eval_batches, fracs,
                            _peak(info.device, reset_ok), base_rss, losses_of)
    return rows + _extra(extra_rows, cell, model, res, cpu_s, rows), res


def _extra(extra_rows, cell, model, res, cpu_s, rows) -> list[dict]:
    """The family's own rows, with the columns every row of the cell carries."""
    if extra_rows is None or not rows:
        return []
    common = {k: v for k, v in rows[0].items() if k not in ("metric", "value", "unit")}
    return [{**common, **r} for r in extra_rows(cell, model, res, cpu_s)]


def budget_scores_at_best(res: TrainResult, cfg: TrainConfig) -> dict | None:
    """The budget scores of the run's best checkpoint when a budget fraction scored exactly it (early stopping: the
    scored weights are the best checkpoint's), else None."""
    if not cfg.patience or not res.budget:
        return None
    return next((sc for step, sc in res.budget.values() if step == res.best_step), None)


def cell_result_rows(cell, corpus, cfg, info, res, model, params, opts, evaluators, final_eval_batches, fracs, peak,
                     base_rss, losses_of, extra: dict | None = None) -> list[dict]:
    """A trained cell's rows: throughput, memory, sizes, the time spent evaluating, and the final validation/test
    losses that ``losses_of(split) -> {eval set: loss}`` computes at the scored weights (the best validation
    checkpoint under early stopping)."""
    t_final = time.perf_counter()
    common = {"attention_options": json.dumps(opts, default=str), "context": model.max_seq_len,
              "world_size": info.world_size, "amp": cfg.amp, "status": res.status, "message": "", **(extra or {})}
    mem_metric, mem = peak
    rows = [{"metric": "tokens_per_s", "value": res.tokens_per_s, "unit": "tok/s"},
            {"metric": "train_time_s", "value": res.train_time_s, "unit": "s"},
            {"metric": "tokens_seen", "value": res.tokens_seen, "unit": "tokens"},
            {"metric": mem_metric, "value": mem, "unit": "MiB"},
            {"metric": "params", "value": params["total_params"], "unit": "params"},
            {"metric": "params_no_emb", "value": model.num_params(exclude_embeddings=True), "unit": "params"},
            {"metric": "attention_params", "value": params["attention_params"], "unit": "params"}]
    if base_rss is not None:
        rows.append({"metric": "baseline_rss_mib", "value": base_rss, "unit": "MiB"})
    if res.status == "nan":
        common["message"] = f"non-finite loss or grad norm at step {res.step + 1}; see {res.log_path}"
        metric = "val_loss" if cell.get("phase") == "tune" else "test_loss"
        rows.append({"metric": metric, "value": float("nan"), "unit": "nats", "eval_set": cell["dataset"]})
        return [{**common, **r} for r in rows]
    if cfg.patience:
        rows += [{"metric": "best_step", "value": res.best_step, "unit": "steps"},
                 {"metric": "steps_run", "value": res.step, "unit": "steps"}]
    for split, sets in evaluators.items():
        if split == "test" and cell.get("phase") == "tune":  # tuning reads validation only
            continue
        losses = losses_of(split)
        if len(losses) > 1:  # mix: the 50/50 mixture's figure is the mean of its parts
            losses[cell["dataset"]] = sum(losses.values()) / len(losses)
        for name, loss in losses.items():
            ev = sets.get(name)
            scored = sum(batch_weight(b) for b in ev(final_eval_batches)) if ev else None
            where = {"eval_set": name, "eval_targets": scored, "split_targets": ev.n_targets if ev else None,
                     "stride": ev.stride if ev else None}
            rows += [{"metric": f"{split}_loss", "value": loss, "unit": "nats", **where},
                     {"metric": f"{split}_bpc", "value": bpc(loss), "unit": "bits/char", **where}]
            if split == "test":  # the learned-at-all gate's reference: a unigram model of the training text
                parts = [name] if ev else list(sets)  # the mix: the mean of its parts, as its loss
                trivial = sum(corpus.unigram_loss(split, p) for p in parts) / len(parts)
                rows.append({"metric": "trivial_loss", "value": trivial, "unit": "nats", **where})
        if split == "test":  # budget fractions the run did not reach (it stopped early): its final best stands
            for f in fracs:
                best_step, scores = (res.budget or {}).get(f, (res.best_step, losses))
                rows.append({"metric": "test_loss@budget", "budget": f, "value": scores[cell["dataset"]],
                             "unit": "nats", "eval_set": cell["dataset"], "best_step_so_far": best_step})
    rows += [{"metric": "eval_time_s", "value": res.eval_time_s, "unit": "s"},  # while training: validation, budgets
             {"metric": "final_eval_time_s", "value": time.perf_counter() - t_final, "unit": "s"}]
    return [{**common, **r} for r in rows]


def grouped_unit(unit: list[dict], shape, corpus, cfg: TrainConfig, info: DistInfo, out: Path,
                 context: dict, final_eval_batches: int | None, fresh: bool = False,
                 budget_fracs: tuple[float, ...] = (), extra_rows: Callable | None = None):
    """Train the cells of ``unit`` (one arm, one phase) as one grouped model (``engine.grouped``); returns
    ([(rows, result)] per cell, "") or (None, the reason it cannot be grouped: the caller runs the cells one by
    one). A result with status ``interrupted`` means the group checkpointed and stops (resumable).
    ``budget_fracs``, ``extra_rows``: as ``run_cell``'s."""
    if info.distributed:
        return None, "DDP: one cell at a time"
    built = [build_model(c, shape, corpus) for c in unit]
    models = [m for m, _ in built]
    samplers = [WindowSampler(corpus.train, shape.context, cfg.batch_size, seed=c["seed"]) for c in unit]
    try:
        grouped = group_for_training(models, (samplers[0](0)[0][:2],))
    except EnsembleUnsupported as exc:
        return None, str(exc)
    params = [count_params(m) for m in models]
    evaluators = _evaluators(shape, corpus)
    run_dirs = [run_dir_of(out, c, context) for c in unit]
    group_dir = Path(out) / "runs" / f"group-{unit[0]['variant']}-{unit[0].get('phase', 'seeds')}-{unit_tag(unit)}"
    if fresh:
        for d in run_dirs:
            discard_run(d)
        (group_dir / "group.pt").unlink(missing_ok=True)
    phase = unit[0].get("phase")
    fracs = tuple(budget_fracs) if phase != "tune" else ()
    ds = unit[0]["dataset"]

    def test_losses(net) -> list[dict[str, float]]:
        per = {name: evaluate_members(net, ev(final_eval_batches), amp=cfg.amp)
               for name, ev in evaluators["test"].items()}
        return [{**{n: v[i] for n, v in per.items()}, ds: sum(v[i] for v in per.values()) / len(per)}
                for i in range(len(next(iter(per.values()))))]

    members = [Member(c["seed"], c.get("lr", cfg.lr) if "phase" in c else cfg.lr,
                      c.get("weight_decay", cfg.weight_decay) if "phase" in c else cfg.weight_decay,
                      smp, d, {"cell": c, "attention_options": o}) for c, (_, o), smp, d in zip(unit, built, samplers,
                                                                                                 run_dirs)]
    reset_ok = _reset_peak(info.device)
    base_rss = _status_mib("VmRSS") if info.device.type == "cpu" else None
    clock = _CpuClock()
    results = train_grouped(models, members, cfg, group_dir, eval_sets=clock.sets(evaluators["val"]),
                            device=info.device, resume=not fresh, budget_fracs=fracs,
                            budget_score=clock.wrap(test_losses) if fracs else None,
                            desc=f"{ds}/{unit[0]['variant']}/{unit[0]['flavor']} x{len(unit)}", grouped=grouped)
    share = clock.share()
    if any(r.status == "interrupted" for r in results):
        return [([], r) for r in results], ""
    peak = _peak(info.device, reset_ok)
    scored = [i for i, r in enumerate(results) if r.status == "ok"]
    for i in scored:  # early stopping: every score is the best validation checkpoint's
        if cfg.patience:
            models[i].load_state_dict(strip_prefixes(load_checkpoint(results[i].checkpoint)["model"]))
    finals: dict[str, dict[str, list[float]]] = {}
    t_final = time.perf_counter()
    if scored:  # the members' final scores, one grouped forward per batch
        net = group_models([models[i] for i in scored]).to(info.device)
        for split in ("val", "test"):
            if split == "test" and phase == "tune":
                continue
            finals[split] = {name: evaluate_members(net, ev(final_eval_batches), amp=cfg.amp)
                             for name, ev in evaluators[split].items()}
    final_share = (time.perf_counter() - t_final) / max(1, len(scored))
    out_rows = []
    for i, (c, res) in enumerate(zip(unit, results)):
        cfg_i = cfg.replace(lr=members[i].lr, weight_decay=members[i].weight_decay)
        k = scored.index(i) if i in scored else None

        def losses_of(split, k=k):
            return {name: v[k] for name, v in finals[split].items()}

        rows = cell_result_rows(c, corpus, cfg_i, info, res, models[i], params[i], built[i][1], evaluators,
                                final_eval_batches, fracs, peak, base_rss, losses_of, ensemble_columns(len(unit)))
        for r in rows:  # the group's final scoring, shared by the members it scored
            if r["metric"] == "final_eval_time_s":
                r["value"] = final_share if k is not None else 0.0
        out_rows.append((rows + _extra(extra_rows, c, models[i], res, share * res.train_time_s, rows), res))
    return out_rows, ""


