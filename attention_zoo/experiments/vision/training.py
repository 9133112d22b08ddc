"""Training and scoring one Table 6 cell (or, with ``--ensemble``, the seeds of one arm as one grouped model): the ViT,
the DeiT-style recipe per cell, the training loop with its budget scores, top-1/top-5 and the rows a cell stores
(``table6_vit`` plans the cells and runs them)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from ...engine import (
    TrainConfig,
    TrainResult,
    discard_run,
    train,
)
from ...engine.checkpoint import load_checkpoint, strip_prefixes
from ...engine.distributed import DistInfo
from ...engine.ensemble import EnsembleUnsupported, group_models
from ...engine.grouped import Member, group_for_training, train_grouped
from ...envinfo import set_seed
from ...measure.params import count_params
from ...models import VisionTransformer
from ...registry import split_options
from ...results import cell_id
from ..ensemble_units import ensemble_columns, unit_tag
from .presets import BUDGET_FRACS, Preset
from .table6_data import (  # noqa: F401
    ImageData,
    classification_loss,
    evaluate_topk,
    evaluate_topk_members,
    load_data,
    topk_correct,
)


def train_config(preset: Preset, n_train: int, epochs: int, batch_size: int, steps: int | None,
                 overrides: dict) -> tuple[TrainConfig, int]:
    """The cell's TrainConfig (epochs -> steps, linear lr scaling) and its steps per epoch."""
    spe = max(1, n_train // batch_size)
    lr = preset.lr * batch_size / preset.lr_ref_batch
    max_steps = steps or epochs * spe
    cfg = dict(preset.train, max_steps=max_steps, batch_size=batch_size, lr=lr,
               min_lr_ratio=min(1.0, preset.min_lr / lr),
               warmup_steps=min(max_steps, round(preset.warmup_epochs * spe)),
               eval_every=preset.eval_every_epochs * spe, eval_max_batches=preset.eval_max_batches,
               ckpt_every=preset.ckpt_every_epochs * spe)
    return TrainConfig.from_dict({**cfg, **overrides}), spe


def run_dir_of(out: Path, cell: dict, context: dict | None = None) -> Path:
    """The cell's training directory; its name hashes the run context too, so a checkpoint trained with other
    settings or on another kind of machine is never resumed."""
    tag = cell_id(cell, context)[:8]
    return Path(out) / "runs" / (f"{cell['preset']}-{cell['variant']}-{cell['flavor']}-e{cell['epochs']}"
                                 f"-s{cell['seed']}-{tag}")


def build_model(cell: dict, preset: Preset, data: ImageData, attn_options: dict) -> tuple[VisionTransformer, dict]:
    """The cell's model, built after ``set_seed(seed)``, and the options its attention received."""
    opts, _ = split_options(cell["variant"], {**preset.attention_options, **attn_options, "flavor": cell["flavor"]})
    set_seed(cell["seed"])
    return VisionTransformer(preset.image_size, preset.patch_size, data.num_classes, preset.d_model, preset.n_layers,
                             preset.n_heads, attention=cell["variant"], attention_options=opts,
                             in_chans=data.in_chans, d_ff=preset.d_ff, dropout=preset.dropout), opts


def run_cell(cell: dict, preset: Preset, data: ImageData, cfg: TrainConfig, info: DistInfo, run_dir: Path,
             attn_options: dict, eval_batches: int | None, fresh: bool = False) -> tuple[list[dict], TrainResult]:
    """Train one cell (resuming from its directory's checkpoint, unless ``fresh``: then from scratch, the old
    checkpoints discarded) and measure top-1/top-5; returns (rows, result)."""
    variant, flavor, seed = cell["variant"], cell["flavor"], cell["seed"]
    phase = cell.get("phase")  # a tuned preset: early stopping and tuning on the validation split carved for it
    model, opts = build_model(cell, preset, data, attn_options)
    params = count_params(model)
    sampler, evaluator = data.sampler(cfg.batch_size, seed, info), data.evaluator(preset.eval_batch_size, info)
    validator = data.validator(preset.eval_batch_size, info) if phase else evaluator
    if fresh and info.is_main:
        discard_run(run_dir)
    fracs = BUDGET_FRACS.get(cell["preset"], ()) if phase and phase != "tune" else ()  # tuning: validation only

    def test_top1(net) -> dict[str, float]:  # every score, so that a final checkpoint scored here is not re-scored
        return evaluate_topk(net, evaluator(eval_batches), info, amp=cfg.amp)

    try:
        res = train(model, cfg.replace(seed=seed), sampler, run_dir, eval_sets={"val": validator},
                    loss_fn=classification_loss, resume=None if fresh else "auto", info=info,
                    meta={"cell": cell, "attention_options": opts},
                    desc=f"{variant}/{flavor}/e{cell['epochs']}/s{seed}", budget_fracs=fracs,
                    budget_score=test_top1 if fracs else None)
    finally:
        sampler.close()
    if res.status == "interrupted":
        return [], res
    if phase and res.status == "ok":  # scored at the best validation checkpoint
        model.load_state_dict(strip_prefixes(load_checkpoint(run_dir / "checkpoints" / "best.pt")["model"]))

    def scores_of(split: str) -> dict[str, float]:
        reused = next((sc for step, sc in (res.budget or {}).values() if step == res.best_step and "top5" in sc),
                      None) if split == "test" and phase else None
        if reused is not None:  # a budget fraction scored this very checkpoint (the best one): its scores stand
            return reused
        return evaluate_topk(model, (validator(None) if split == "val" else evaluator(eval_batches)), info,
                             amp=cfg.amp)

    return cell_result_rows(cell, preset, data, cfg, info, res, params, opts, fracs, scores_of), res


def cell_result_rows(cell, preset, data, cfg, info, res, params, opts, fracs, scores_of, extra: dict | None = None
                     ) -> list[dict]:
    """A trained cell's rows; ``scores_of(split)`` gives ``evaluate_topk``'s scores of the scored weights (the best
    validation checkpoint in a tuned preset) on the validation ("val") or the evaluation ("test") split."""
    phase = cell.get("phase")
    t_final = time.perf_counter()
    timing = [{"metric": "eval_time_s", "value": res.eval_time_s, "unit": "s"}]  # while training
    common = {"attention_options": json.dumps(opts, default=str), "image_size": preset.image_size,
              "patch_size": preset.patch_size, "batch_size": cfg.batch_size, "steps_per_epoch": cell["steps_per_epoch"],
              "world_size": info.world_size, "amp": cfg.amp, "status": res.status, "message": "", **(extra or {})}
    rows = [{"metric": "images_per_s", "value": res.tokens_per_s, "unit": "img/s"},
            {"metric": "train_time_s", "value": res.train_time_s, "unit": "s"},
            {"metric": "params", "value": params["total_params"], "unit": "params"},
            {"metric": "attention_params", "value": params["attention_params"], "unit": "params"}]
    if res.status == "nan":
        common["message"] = f"non-finite loss or grad norm at step {res.step + 1}; see {res.log_path}"
        rows += [{"metric": m, "value": math.nan, "unit": "%"} for m in (("val_loss",) if phase == "tune" else
                                                                          ("top1", "top5"))]
        return [{**common, **r} for r in rows]
    if phase:  # scored at the best validation checkpoint; a tuning cell never reads the test split
        val = scores_of("val")
        rows += [{"metric": "val_loss", "value": val["loss"], "unit": "nats", "n_eval": val["n"]},
                 {"metric": "val_top1", "value": val["top1"], "unit": "%", "n_eval": val["n"]},
                 {"metric": "best_step", "value": res.best_step, "unit": "steps"},
                 {"metric": "steps_run", "value": res.step, "unit": "steps"}]
        if phase == "tune":
            rows += [*timing, {"metric": "final_eval_time_s", "value": time.perf_counter() - t_final, "unit": "s"}]
            return [{**common, **r} for r in rows]
    acc = scores_of("test")
    rows += [{"metric": "top1", "value": acc["top1"], "unit": "%", "n_eval": acc["n"]},
             {"metric": "top5", "value": acc["top5"], "unit": "%", "n_eval": acc["n"]},
             {"metric": "test_loss" if phase else "val_loss", "value": acc["loss"], "unit": "nats", "n_eval": acc["n"]}]
    if data.chance_top1 is not None:  # the learned-at-all gate's reference
        rows.append({"metric": "chance_top1", "value": data.chance_top1, "unit": "%", "n_eval": acc["n"]})
    for f in fracs:  # budget fractions the run did not reach (it stopped early): its final best stands
        best_step, scores = (res.budget or {}).get(f, (res.best_step, acc))
        rows.append({"metric": "top1@budget", "budget": f, "value": scores["top1"], "unit": "%", "n_eval": acc["n"],
                     "best_step_so_far": best_step})
    rows += [*timing, {"metric": "final_eval_time_s", "value": time.perf_counter() - t_final, "unit": "s"}]
    return [{**common, **r} for r in rows]


def grouped_unit(unit: list[dict], preset: Preset, data: ImageData, cfgs: list[TrainConfig], info: DistInfo,
                 out: Path, context: dict, attn_options: dict, eval_batches: int | None, fresh: bool = False):
    """Train the cells of ``unit`` (one arm, one phase; ``cfgs`` their TrainConfigs, equal but for lr and weight
    decay) as one grouped model (``engine.grouped``); ([(rows, result)] per cell, "") or (None, why it cannot be
    grouped: the caller runs the cells one by one)."""
    if info.distributed:
        return None, "DDP: one cell at a time"
    cfg = cfgs[0]
    if any(c.replace(lr=cfg.lr, weight_decay=cfg.weight_decay, min_lr_ratio=cfg.min_lr_ratio) != cfg for c in cfgs):
        return None, "the cells' training configurations differ beyond lr, weight decay and cosine floor"
    built = [build_model(c, preset, data, attn_options) for c in unit]
    models = [m for m, _ in built]
    phase = unit[0].get("phase")
    samplers = [data.sampler(cfg.batch_size, c["seed"], info) for c in unit]
    try:
        try:
            grouped = group_for_training(models, (samplers[0](0)[0][:2],))
        except EnsembleUnsupported as exc:
            return None, str(exc)
        evaluator = data.evaluator(preset.eval_batch_size, info)
        validator = data.validator(preset.eval_batch_size, info) if phase else evaluator
        params = [count_params(m) for m in models]
        run_dirs = [run_dir_of(out, c, context) for c in unit]
        group_dir = Path(out) / "runs" / f"group-{unit[0]['variant']}-{phase or 'seeds'}-{unit_tag(unit)}"
        if fresh:
            for d in run_dirs:
                discard_run(d)
            (group_dir / "group.pt").unlink(missing_ok=True)
        fracs = BUDGET_FRACS.get(unit[0]["preset"], ()) if phase and phase != "tune" else ()
        members = [Member(c["seed"], k.lr, k.weight_decay, smp, d, {"cell": c, "attention_options": o}, k.min_lr_ratio)
                   for c, k, (_, o), smp, d in zip(unit, cfgs, built, samplers, run_dirs)]

        def test_top1(net) -> list[dict[str, float]]:
            return evaluate_topk_members(net, evaluator(eval_batches), amp=cfg.amp)

        results = train_grouped(models, members, cfg, group_dir, eval_sets={"val": validator},
                                loss_fn=classification_loss, device=info.device, resume=not fresh,
                                budget_fracs=fracs, budget_score=test_top1 if fracs else None,
                                desc=f"{unit[0]['variant']}/{unit[0]['flavor']} x{len(unit)}", grouped=grouped)
    finally:
        for smp in samplers:
            smp.close()
    if any(r.status == "interrupted" for r in results):
        return [([], r) for r in results], ""
    scored = [i for i, r in enumerate(results) if r.status == "ok"]
    finals: dict[str, list[dict]] = {}
    t_final = time.perf_counter()
    if scored:
        if phase:  # every score is the best validation checkpoint's
            for i in scored:
                models[i].load_state_dict(strip_prefixes(load_checkpoint(results[i].checkpoint)["model"]))
        net = group_models([models[i] for i in scored]).to(info.device)
        if phase:
            finals["val"] = evaluate_topk_members(net, validator(None), amp=cfg.amp)
        if phase != "tune":
            finals["test"] = evaluate_topk_members(net, evaluator(eval_batches), amp=cfg.amp)
    final_share = (time.perf_counter() - t_final) / max(1, len(scored))
    out_rows = []
    for i, (c, res) in enumerate(zip(unit, results)):
        k = scored.index(i) if i in scored else None
        rows = cell_result_rows(c, preset, data, cfgs[i], info, res, params[i], built[i][1], fracs,
                                lambda split, k=k: finals[split][k], ensemble_columns(len(unit)))
        for r in rows:  # the group's final scoring, shared by the members it scored
            if r["metric"] == "final_eval_time_s":
                r["value"] = final_share if k is not None else 0.0
        out_rows.append((rows, res))
    return out_rows, ""


