"""``engine.loop.train`` for S members of one arm at once: the members (seeds, or tuning grid points × seeds) train as
one grouped model (``engine.ensemble``: every parameter carries the member axis, the batch is seed-major), each with
its own data, learning rate, weight decay, clipping, early stopping, best checkpoint and budget scores.

What a member gets is what ``train`` gives it alone, to floating-point rounding (tested in float64): its model as
built after ``set_seed(seed)``, its sampler's batches, AdamW (decoupled decay on tensors of ≥ 2 dimensions, the
member's own learning rate and weight decay: ``MemberAdamW``), warm-up then cosine (``lr_factor``), its own
global-norm clipping (``clip_per_seed``), evaluation every ``eval_every`` steps on the same sets, its best
checkpoint (``best.pt`` in its run directory, as ``train`` writes it), its budget scores, and early stopping: a
member that stops (patience since its best evaluation) or diverges (a non-finite loss or gradient norm: status
``nan``, its update skipped) leaves the group alone, and the others train on (``select_members``: the group
shrinks, so a stopped member costs nothing after it stops). Each member's run directory gets the ``metrics.jsonl``
``train`` writes (train, eval, budget, early-stop and status events), so reports read it unchanged.

After the call, ``models[i]`` holds member i's weights at its last step (where it stopped, or the weights that gave
a non-finite loss), as the model handed to ``train`` does after it.

Time: a step's wall time is shared equally by the members it trained, so a member's ``train_time_s`` is its share
and the members' times add up to the group's. Evaluation and checkpointing are outside it, as in ``train``.

Not covered (the caller trains such cells one at a time with ``train``): DDP, and models whose forward draws random
numbers (dropout, noisy gating, sampled metrics), whose members would draw from one stream instead of their own
(``check_deterministic``). The group checkpoints every ``ckpt_every`` steps into ``<out_dir>/group.pt`` (atomic) and
resumes from it with the same results; ``stop_at`` and SIGTERM/SIGINT stop at a step boundary with a checkpoint.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..io import append_jsonl
from .checkpoint import CheckpointManager, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .compiled import CompiledForward
from .config import TrainConfig
from .ensemble import clip_per_seed, group_models, select_members
from .loop import (
    TrainResult,
    _autocast,
    _budget_steps,
    _signal_handlers,
    batch_weight,
    lm_loss,
    lr_factor,
)
from .member_adamw import MemberAdamW
from .members import (  # noqa: F401
    _lm_member_losses,
    _member_losses,
    _seed_major,
    check_deterministic,
    check_samplers,
    evaluate_members,
    group_for_training,
    member_outputs,
)

Batch = tuple[Tensor, ...]


@dataclass
class Member:
    """One member of a group: its seed (the caller built its model after ``set_seed(seed)``), its hyper-parameters,
    its position-addressable sampler ``sampler(step) -> batch`` and the run directory ``train`` would use for it."""

    seed: int
    lr: float
    weight_decay: float
    sampler: Callable[[int], Batch]
    run_dir: Path
    meta: dict = field(default_factory=dict)  # stored in its best.pt, as ``train``'s ``meta``
    min_lr_ratio: float | None = None  # its cosine floor as a fraction of its lr (None: the shared config's)

    def config(self, cfg: TrainConfig) -> TrainConfig:
        """The configuration ``train`` would run this member with."""
        return cfg.replace(lr=self.lr, weight_decay=self.weight_decay, seed=self.seed,
                           min_lr_ratio=cfg.min_lr_ratio if self.min_lr_ratio is None else self.min_lr_ratio)


def _optimizer(net: nn.Module, members: list[Member], cfg: TrainConfig) -> MemberAdamW:
    """``make_optimizer``'s groups (decay on tensors of ≥ 2 dimensions in one model: ≥ 3 with the member axis)."""
    params = [p for p in net.parameters() if p.requires_grad]
    lr = torch.tensor([m.lr for m in members], dtype=torch.float64)
    wd = torch.tensor([m.weight_decay for m in members], dtype=torch.float64)
    groups = [{"params": [p for p in params if p.dim() >= 3], "weight_decay": wd},
              {"params": [p for p in params if p.dim() < 3], "weight_decay": 0.0}]
    return MemberAdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), weight_decay=0.0)


class _Record:
    """One member's progress: what ``train`` keeps in its locals, per member."""

    def __init__(self):
        self.status, self.step, self.tokens, self.time = "ok", 0, 0, 0.0
        self.best, self.best_step, self.evals, self.budget = None, 0, {}, {}
        self.improved, self.improved_step = None, 0  # the last evaluation that reset the patience (min_delta)
        self.best_state: dict[str, Tensor] | None = None
        self.eval_time = 0.0
        self.final_state: dict[str, Tensor] | None = None  # its weights when it left the group
        self.done = False

    def state(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_state(cls, d: dict) -> _Record:
        r = cls()
        r.__dict__.update(d)
        if "improved" not in d:  # a group saved before min_delta existed: its best reset the patience
            r.improved, r.improved_step = r.best, r.best_step
        return r


def _slice_state(net: nn.Module, i: int) -> dict[str, Tensor]:
    """Member ``i``'s parameters, under every name they have (ties included), as one model's tensors."""
    return {k: p.detach()[i].clone() for k, p in net.named_parameters(remove_duplicate=False)}


def _load_members(net: nn.Module, states: list[dict[str, Tensor]]) -> None:
    with torch.no_grad():
        for k, p in net.named_parameters(remove_duplicate=False):
            p.copy_(torch.stack([s[k] for s in states]))


def grouped_step(net: nn.Module, opt: MemberAdamW, parts: list[Batch], rates: list[float], cfg: TrainConfig,
                 loss_fn: Callable = lm_loss, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, float]:
    """One step of a group up to the update: every member's scheduled rate (``rates``, as LambdaLR gives it alone),
    the forward/backward of the members' batches ``parts`` (seed-major, ``grad_accum`` micro-batches) and per-member
    clipping. Returns (losses [S] float64, gradient norms [S], the group's auxiliary loss); ``opt.step()`` follows
    (``train_grouped`` first drops members whose loss or norm is not finite)."""
    device = torch.device(device)
    r = torch.tensor(rates, dtype=torch.float64)
    for g in opt.param_groups:
        g["lr"], g["member_lr"] = 1.0, r
    opt.zero_grad(set_to_none=True)
    n = len(parts)
    losses = torch.zeros(n, dtype=torch.float64, device=device)
    aux_total = 0.0
    for m in range(cfg.grad_accum):
        mb = [tuple(t.chunk(cfg.grad_accum)[m] for t in p) for p in parts]
        batch = tuple(t.to(device, non_blocking=True) for t in _seed_major(mb))
        with _autocast(device, cfg.amp):
            out = net(*batch[:-1])
            per = _member_losses(loss_fn, batch, out, n)
            aux = getattr(out, "aux_loss", None)
        total = per.sum() if not torch.is_tensor(aux) else per.sum() + aux
        (total / cfg.grad_accum).backward()
        losses += per.detach().double() / cfg.grad_accum
        if torch.is_tensor(aux):
            aux_total += float(aux.detach()) / cfg.grad_accum
    norms = clip_per_seed([p for p in net.parameters() if p.requires_grad],
                          cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    return losses, norms, aux_total


def member_optimizer(net: nn.Module, members: list[Member], cfg: TrainConfig) -> MemberAdamW:
    """The members' AdamW: ``make_optimizer``'s groups (decay on tensors of ≥ 2 dimensions in one model: ≥ 3 with
    the member axis), each member at its own learning rate and weight decay."""
    return _optimizer(net, members, cfg)


def train_grouped(models: list[nn.Module], members: list[Member], cfg: TrainConfig, out_dir: str | Path,
                  eval_sets: dict[str, Callable[[int | None], Iterable[Batch]]] | None = None,
                  loss_fn: Callable = lm_loss, device: torch.device | str = "cpu", resume: bool = True,
                  budget_fracs: tuple[float, ...] = (),
                  budget_score: Callable[[nn.Module], list[dict[str, float]]] | None = None,
                  desc: str = "train", grouped: nn.Module | None = None) -> list[TrainResult]:
    """Train ``models`` (member i's model built after ``set_seed(members[i].seed)``) as one grouped model; one
    ``TrainResult`` per member, as ``train`` would return it for that member alone (module docstring).

    ``cfg``: the shared configuration (its ``lr``, ``weight_decay`` and ``seed`` are the members'); ``out_dir``: the
    group's own directory (its checkpoint); ``budget_score(grouped) -> [per-member scores]`` scores a grouped model
    holding the members' best checkpoints (``evaluate_members``, ``member_outputs``); ``grouped``: the already
    grouped model of ``models`` (``group_for_training``), else it is grouped here.

    Raises:
        EnsembleUnsupported: the models cannot be grouped, or the members' batches cannot be stacked
            (``check_samplers``).
        ValueError: members and models differ in number, ``grad_accum`` that does not divide a member's batch,
            bad ``budget_fracs`` (as ``train``).
    """
    if len(models) != len(members) or not members:
        raise ValueError(f"members: {len(members)} members for {len(models)} models")
    check_samplers([m.sampler for m in members])
    budget_steps = _budget_steps(budget_fracs, budget_score, eval_sets, cfg.max_steps)
    device, out_dir, eval_sets = torch.device(device), Path(out_dir), eval_sets or {}
    net = (grouped if grouped is not None else group_models(models)).to(device)
    templates = models  # the members' own models: their best.pt layout, and their weights after the call
    cfgs = [m.config(cfg) for m in members]
    opt = _optimizer(net, members, cfg)
    ckpt_path = out_dir / "group.pt"
    recs = [_Record() for _ in members]
    active = list(range(len(members)))  # members in the group, in member order
    step = 0
    if resume and ckpt_path.is_file():
        saved = load_checkpoint(ckpt_path)
        active, step = saved["active"], saved["step"]
        recs = [_Record.from_state(r) for r in saved["records"]]
        opt = opt.select_members(active, select_members(net, active)) if active != list(range(len(members))) else opt
        net.load_state_dict(saved["net"])
        opt.load_state_dict(saved["opt"])
        set_rng_state(saved["rng"], device)
    else:
        for m in members:
            append_jsonl(m.run_dir / "metrics.jsonl", {"event": "group", "members": [x.seed for x in members],
                                                        "step": 0})

    def log(i: int, row: dict) -> None:
        append_jsonl(members[i].run_dir / "metrics.jsonl", row)

    def export(j: int) -> None:  # member active[j]'s current weights, for its own model after the call
        recs[active[j]].final_state = _slice_state(net, j)

    def shrink(keep_pos: list[int]) -> None:
        nonlocal opt, active
        if keep_pos == list(range(len(active))):
            return
        for j in range(len(active)):
            if j not in keep_pos:
                export(j)
        opt = opt.select_members(keep_pos, select_members(net, keep_pos))
        active = [active[j] for j in keep_pos]

    def run_evals() -> None:
        t0 = time.perf_counter()
        per_set = {name: evaluate_members(net, fn(cfg.eval_max_batches), loss_fn, cfg.amp)
                   for name, fn in eval_sets.items()}
        share(time.perf_counter() - t0, active)
        for j, i in enumerate(active):
            r = recs[i]
            r.evals = {name: v[j] for name, v in per_set.items()}
            for name, v in r.evals.items():
                log(i, {"event": "eval", "step": step, "eval_set": name, "loss": v})
            mean = sum(r.evals.values()) / len(r.evals)
            if r.improved is None or mean < r.improved - cfg.min_delta * abs(r.improved):
                r.improved, r.improved_step = mean, step
            if r.best is None or mean < r.best:
                r.best, r.best_step = mean, step
                r.best_state = {k: p.detach()[j].clone() for k, p in net.named_parameters(remove_duplicate=False)}

    def share(seconds: float, who: list[int]) -> None:  # evaluation time, shared by the members evaluated
        for i in who:
            recs[i].eval_time += seconds / len(who)

    def score_budget(fracs: tuple[float, ...], who: list[int]) -> None:
        t0 = time.perf_counter()
        reuse = {i: recs[i].budget[max(recs[i].budget)][1] for i in who  # the same best checkpoint as the last
                 if recs[i].budget and recs[i].budget[max(recs[i].budget)][0] == recs[i].best_step}  # fraction's
        fresh = [i for i in who if i not in reuse]
        scores = {}
        if fresh:
            scratch = copy.deepcopy(net)  # the best checkpoints, scored without touching the training state
            select_members(scratch, [active.index(i) for i in fresh])
            _load_members(scratch, [recs[i].best_state for i in fresh])
            scores = dict(zip(fresh, budget_score(scratch)))
            del scratch
        scores.update(reuse)
        share(time.perf_counter() - t0, who)
        for i, sc in ((i, scores[i]) for i in who):
            for f in fracs:
                recs[i].budget[f] = (recs[i].best_step, dict(sc))
                log(i, {"event": "budget", "step": step, "fraction": f, "best_step": recs[i].best_step, **sc})

    def checkpoint() -> None:
        save_checkpoint(ckpt_path, {"net": net.state_dict(), "opt": opt.state_dict(), "active": active,
                                    "step": step, "records": [r.state() for r in recs], "rng": rng_state(device)})

    interrupted = None
    forward = CompiledForward(net, device) if cfg.compile else None  # the training forward (engine.compiled)
    net.train()
    with _signal_handlers(cfg.handle_signals) as flag:
        bar = tqdm(total=cfg.max_steps, initial=step, desc=desc, disable=not cfg.progress, dynamic_ncols=True,
                   leave=False)
        while step < cfg.max_steps and active:
            t0 = time.perf_counter()
            parts = [members[i].sampler(step) for i in active]
            n = len(active)
            for p in parts:
                if p[-1].shape[0] % cfg.grad_accum:
                    raise ValueError(f"batch_size: a batch of {p[-1].shape[0]} does not split into "
                                     f"grad_accum={cfg.grad_accum} micro-batches")
            rates = [members[i].lr * lr_factor(step, cfgs[i]) for i in active]
            losses, norms, aux_total = grouped_step(forward or net, opt, parts, rates, cfg, loss_fn, device)
            finite = (torch.isfinite(losses) & torch.isfinite(norms.double())).tolist()
            loss_v, norm_v = losses.tolist(), norms.tolist()
            lr_now = list(rates)
            for j, i in enumerate(active):
                if not finite[j]:  # the member's update is skipped; it leaves the group with status nan
                    r = recs[i]
                    r.status, r.done = "nan", True
                    log(i, {"event": "status", "status": "nan", "step": step + 1, "lr": lr_now[j],
                            "grad_norm": norm_v[j], "loss": loss_v[j]})
            if not all(finite):
                keep = [j for j in range(n) if finite[j]]
                if not keep:
                    for j in range(n):
                        export(j)
                    active = []
                    break
                index = torch.tensor(keep, device=device)
                grads = [None if p.grad is None else p.grad.index_select(0, index) for p in net.parameters()]
                shrink(keep)  # the dropped members' gradients go with them
                for p, g in zip(net.parameters(), grads):
                    p.grad = g
                parts, loss_v, norm_v = [parts[j] for j in keep], [loss_v[j] for j in keep], [norm_v[j] for j in keep]
                lr_now = [lr_now[j] for j in keep]
            opt.step()
            step += 1
            dt = (time.perf_counter() - t0) / len(active)
            for j, i in enumerate(active):
                r = recs[i]
                r.step, r.tokens, r.time = step, r.tokens + batch_weight(parts[j]), r.time + dt
                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    log(i, {"event": "train", "step": step, "loss": loss_v[j], "group_aux_loss": aux_total,
                            "lr": lr_now[j], "grad_norm": norm_v[j], "tokens_seen": r.tokens,
                            "train_time_s": r.time})
            bar.update(1)
            if eval_sets and cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
                run_evals()
            if step in budget_steps:
                fracs = budget_steps[step]
                who = [i for i in active if fracs[0] not in recs[i].budget]
                if who:
                    if any(recs[i].best is None for i in who):
                        run_evals()
                    score_budget(fracs, who)
            if cfg.patience and step < cfg.max_steps:
                keep = []
                for j, i in enumerate(active):
                    r = recs[i]
                    if r.evals and step - r.improved_step >= cfg.patience:
                        log(i, {"event": "early_stop", "step": step, "best_step": r.best_step, "best_eval": r.best})
                        for name, v in r.evals.items():  # ``train`` evaluates a stopped run once more: same weights
                            log(i, {"event": "eval", "step": step, "eval_set": name, "loss": v})
                        r.done = True
                    else:
                        keep.append(j)
                if len(keep) < len(active):
                    if keep:
                        shrink(keep)
                    else:
                        for j in range(len(active)):
                            export(j)
                        active = []
            stopping = flag.signum is not None or (cfg.stop_at is not None and step >= cfg.stop_at)
            if active and (stopping or (cfg.ckpt_every and step % cfg.ckpt_every == 0)):
                checkpoint()
            if stopping and active and step < cfg.max_steps:
                interrupted = flag.signum if flag.signum is not None else 0
                break
        bar.close()
    if interrupted is None and active and eval_sets:
        run_evals()  # the members that reached max_steps: their final evaluation, as ``train``'s
    for j in range(len(active)):
        export(j)
    with torch.no_grad():
        for m, r in zip(templates, recs):
            if r.final_state is not None:
                for k, p in m.named_parameters(remove_duplicate=False):
                    p.copy_(r.final_state[k])
    results = []
    for i, (m, r) in enumerate(zip(members, recs)):
        status = "interrupted" if interrupted is not None and i in active else r.status
        path = None
        if status != "interrupted" and r.best_state is not None:
            state = templates[i].state_dict()
            state.update({k: v.cpu() for k, v in r.best_state.items() if k in state})
            path = CheckpointManager(m.run_dir / "checkpoints").save_best(
                {"model": state, "step": r.best_step, "best_eval": r.best, "config": cfgs[i].to_dict(),
                 "meta": m.meta, "grouped": True})
        if status != "interrupted":
            log(i, {"event": "status", "status": status, "step": r.step, "signal": None, "tokens_seen": r.tokens,
                    "train_time_s": r.time})
        signum = interrupted if status == "interrupted" and interrupted else None
        results.append(TrainResult(status, r.step, r.tokens, r.time, r.evals, r.best, path,
                                   m.run_dir / "metrics.jsonl", signum, None,
                                   r.best_step if r.best is not None else None, r.budget if budget_steps else None,
                                   r.eval_time, forward.how if forward is not None else ""))
    if interrupted is None and ckpt_path.is_file():
        ckpt_path.unlink()
        if not any(out_dir.iterdir()):
            out_dir.rmdir()
    return results


__all__ = ["Member", "check_deterministic", "evaluate_members", "group_for_training", "grouped_step",
           "member_optimizer", "member_outputs", "train_grouped"]
