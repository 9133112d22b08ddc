"""One training loop for every model in the project.

A *batch* is a tuple ``(inputs..., targets)``: the model is called as ``model(*batch[:-1])`` and returns a
``ModelOutput(logits, aux_loss)`` (or anything with ``.logits``; ``aux_loss`` optional). The training loss is
``loss_fn(batch, output) + aux_loss`` — the loop never needs to know which attention produced the auxiliary term —
and evaluation reports ``loss_fn`` alone. Data come from a *position-addressable* sampler ``train_batches(step) ->
global batch``: the data position is the step, so a resumed run sees exactly the batches an uninterrupted one would.
Under DDP every rank builds the same global batch and takes its own contiguous slice of it.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm.auto import tqdm

from ..envinfo import set_seed
from ..io import append_jsonl
from .checkpoint import CheckpointManager, load_checkpoint, rng_state, set_rng_state, strip_prefixes
from .compiled import CompiledForward
from .config import NEUTRAL, TrainConfig
from .distributed import DistInfo, all_gather_object, all_reduce, param_sync_diff
from .steps import IGNORE_INDEX, Batch, _autocast, _aux, _to, batch_weight, evaluate, lm_loss  # noqa: F401


@dataclass
class TrainResult:
    status: str  # "ok" | "nan" | "interrupted"
    step: int  # optimizer steps completed
    tokens_seen: int  # targets consumed over the whole run (resumes included)
    train_time_s: float  # wall time inside training steps (evaluation and checkpointing excluded)
    evals: dict[str, float]  # the last evaluation: eval-set name -> mean loss
    best_eval: float | None  # lowest mean-over-eval-sets loss seen
    checkpoint: Path | None  # the last checkpoint written (the debug checkpoint on NaN)
    log_path: Path
    signal: int | None = None  # the signal that stopped the run, if any
    sync_diff: float | None = None  # DDP: max parameter-checksum difference between ranks at the end
    best_step: int | None = None  # the step of the best evaluation (best.pt)
    # budget fraction -> (the best validation checkpoint's step so far, ``budget_score`` of that checkpoint), for the
    # fractions of ``max_steps`` the run reached before it ended (the caller scores the rest at the final best)
    budget: dict[float, tuple[int, dict[str, float]]] | None = None
    eval_time_s: float = 0.0  # wall time of this call's evaluations and budget scoring (not in train_time_s)
    compiled: str = ""  # with TrainConfig.compile: "compiled", or "eager: <why>" (engine.compiled)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_seen / self.train_time_s if self.train_time_s > 0 else float("nan")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_lr_ratio`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    # The single-tensor implementation wherever a parameter is off the CPU: torch would pick the multi-tensor
    # ("foreach") one on CUDA, whose parameter-sized temporaries would raise CUDA training peaks. On the CPU the
    # multi-tensor one computes the same bits (tests/test_gpu_ready.py) with fewer calls per step: the small models
    # of the decide presets hold 30-40 tensors, ≈ 0.6-0.9 ms of a 17-35 ms step (Table 5's shape, one thread).
    on_cpu = all(p.device.type == "cpu" for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=on_cpu)


class _StopFlag:
    def __init__(self):
        self.signum: int | None = None

    def __call__(self, signum, frame):  # a handler only records; the loop checkpoints at the step boundary
        self.signum = signum


@contextlib.contextmanager
def _signal_handlers(enabled: bool):
    flag = _StopFlag()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return
    old = {s: signal.signal(s, flag) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _find_unused(model: nn.Module, batch: Batch, loss_fn: Callable, info: DistInfo, amp: str) -> bool:
    """DDP needs ``find_unused_parameters`` when some parameter gets no gradient: routing variants declare
    ``data_dependent_compute``; otherwise one probe forward/backward (RNG state restored) finds them."""
    if any(getattr(m, "data_dependent_compute", False) for m in model.modules()):
        return True
    devices = [info.device] if info.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        with _autocast(info.device, amp):
            out = model(*batch[:-1])
            loss = loss_fn(batch, out)
            aux = _aux(out)
        (loss + aux if aux is not None else loss).backward()
    unused = any(p.grad is None for p in model.parameters() if p.requires_grad)
    model.zero_grad(set_to_none=True)
    return unused


def _accumulate(net: nn.Module, local: Batch, cfg: TrainConfig, dev: torch.device, loss_fn: Callable) -> Tensor:
    """Forward/backward over ``grad_accum`` micro-batches of this rank's slice (DDP syncs on the last only).
    Returns float64 [4]: mean loss, mean aux loss, and two flag slots (non-finite, stop) for one all-reduce."""
    sums = torch.zeros(4, dtype=torch.float64, device=dev)
    micro = local[-1].shape[0] // cfg.grad_accum
    for m in range(cfg.grad_accum):
        mb = _to(tuple(t[m * micro:(m + 1) * micro] for t in local), dev)
        last = m == cfg.grad_accum - 1
        with contextlib.nullcontext() if last or not isinstance(net, DDP) else net.no_sync():
            with _autocast(dev, cfg.amp):
                out = net(*mb[:-1])
                loss = loss_fn(mb, out)
                aux = _aux(out)
            ((loss + aux if aux is not None else loss) / cfg.grad_accum).backward()
        sums[0] += loss.detach().double() / cfg.grad_accum
        if aux is not None:
            sums[1] += aux.detach().double() / cfg.grad_accum
    return sums


def train(model: nn.Module, cfg: TrainConfig, train_batches: Callable[[int], Batch], out_dir: str | Path,
          eval_sets: dict[str, Callable[[int | None], Iterable[Batch]]] | None = None,
          loss_fn: Callable = lm_loss, resume: str | Path | None = None, info: DistInfo | None = None,
          meta: dict | None = None, desc: str = "train", budget_fracs: tuple[float, ...] = (),
          budget_score: Callable[[nn.Module], dict[str, float]] | None = None) -> TrainResult:
    """Train ``model`` for ``cfg.max_steps`` optimizer steps; rank 0 writes ``metrics.jsonl`` and ``checkpoints/``.

    ``eval_sets`` maps a name to ``fn(limit) -> batches`` (``limit``: at most that many batches, None = all).
    ``resume``: None (fresh), ``"auto"`` (newest valid checkpoint in ``out_dir``, else fresh) or a path.
    ``meta`` is stored in the checkpoint (e.g. the model's constructor arguments).
    ``budget_fracs`` with ``budget_score(model) -> {metric: value}``: at each fraction f of ``max_steps`` below the
    end, the best validation checkpoint so far is scored (the same run seen at a smaller budget; a test split is
    read only there, after the setting is chosen). The scoring leaves the run's numbers unchanged: the weights
    are swapped back, and nothing draws from the RNG. ``TrainResult.budget`` holds the fractions reached.

    Raises:
        FileNotFoundError: ``resume`` names a checkpoint that does not exist.
        CheckpointError: ``resume`` names a truncated or corrupt checkpoint.
        ValueError: a global batch that does not split evenly over ranks × ``grad_accum``, or an empty eval set;
            ``budget_fracs`` outside (0, 1], or given without ``budget_score`` or ``eval_sets``.
    """
    budget_steps = _budget_steps(budget_fracs, budget_score, eval_sets, cfg.max_steps)
    info = info or DistInfo()
    out_dir, dev = Path(out_dir), info.device
    log_path = out_dir / "metrics.jsonl"
    eval_sets = eval_sets or {}
    raw = model.to(dev)
    opt = make_optimizer(raw, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    ckpts = CheckpointManager(out_dir / "checkpoints", cfg.keep_last)

    def log(row: dict) -> None:
        if info.is_main:
            append_jsonl(log_path, row)

    step, tokens_seen, train_time, best, best_step, stopped_early = 0, 0, 0.0, None, 0, False
    improved = (None, 0)  # (score, step) of the last evaluation that reset the patience (min_delta)
    budget: dict[float, tuple[int, dict[str, float]]] = {}
    best_weights: dict[str, Tensor] | None = None  # the best checkpoint's weights, kept only for budget scoring
    ckpt_path, state = ckpts.resolve(resume)  # on CPU; load_state_dict copies onto the parameters' device
    if state is not None:
        raw.load_state_dict(strip_prefixes(state["model"]))
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, tokens_seen, train_time, best = (state["step"], state["tokens_seen"], state["train_time_s"],
                                               state["best_eval"])
        best_step = state.get("best_step", step)  # checkpoints written before early stopping existed lack it
        improved = tuple(state.get("improved", (best, best_step)))  # before min_delta: the best resets it
        stopped_early = bool(state.get("early_stopped"))  # a run that early-stopped is finished: no more steps
        budget = {float(f): (int(b), dict(sc)) for f, b, sc in state.get("budget", [])}
        if hasattr(train_batches, "load_state_dict") and state["data"].get("sampler") is not None:
            train_batches.load_state_dict(state["data"]["sampler"])
        rngs = state["rng"]
        if len(rngs) != info.world_size:
            warnings.warn(f"resume: checkpoint has RNG states for {len(rngs)} ranks, running {info.world_size}",
                          RuntimeWarning, stacklevel=2)
        set_rng_state(rngs[info.rank % len(rngs)], info.device)
        then = {**NEUTRAL, **state["config"]}  # a checkpoint from before a field existed had its neutral value
        changed = {k: (v, then.get(k)) for k, v in cfg.to_dict().items()
                   if k not in ("stop_at", "progress", "handle_signals") and then.get(k) != v}
        if changed:
            warnings.warn(f"resume: config differs from the checkpoint's (now, then): {changed}", RuntimeWarning,
                          stacklevel=2)
        log({"event": "resume", "step": step, "checkpoint": str(ckpt_path)})
    else:
        set_seed((cfg.seed + info.rank) % 2**32)

    def snapshot(**extra) -> dict:
        rngs = all_gather_object(rng_state(info.device), info)  # collective: every rank calls snapshot at the same step
        data = {"position": step, "sampler": train_batches.state_dict() if hasattr(train_batches, "state_dict")
                else None}
        return {"model": raw.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "step": step, "tokens_seen": tokens_seen, "train_time_s": train_time, "best_eval": best,
                "best_step": best_step, "improved": list(improved), "data": data, "config": cfg.to_dict(),
                "rng": rngs, "meta": meta or {},
                "budget": [[f, b, sc] for f, (b, sc) in sorted(budget.items())], **extra}

    eval_time = 0.0
    # the last budget scoring, (best step, scores): a later fraction with the same best checkpoint reuses it
    scored_at: tuple[int, dict[str, float]] | None = budget[max(budget)] if budget else None

    def run_evals() -> dict[str, float]:
        nonlocal best, best_step, best_weights, eval_time, improved
        t0 = time.perf_counter()
        res = {name: evaluate(raw, fn(cfg.eval_max_batches), loss_fn, info, cfg.amp) for name, fn in eval_sets.items()}
        eval_time += time.perf_counter() - t0
        for name, v in res.items():
            log({"event": "eval", "step": step, "eval_set": name, "loss": v})
        mean = sum(res.values()) / len(res)
        if improved[0] is None or mean < improved[0] - cfg.min_delta * abs(improved[0]):
            improved = (mean, step)
        if best is None or mean < best:
            best, best_step = mean, step
            state = snapshot()
            if info.is_main:
                ckpts.save_best(state)
            if budget_steps:
                best_weights = {k: v.detach().clone() for k, v in raw.state_dict().items()}
        return res

    def score_budget(fracs: tuple[float, ...]) -> None:
        nonlocal best_weights, eval_time, scored_at
        t0 = time.perf_counter()
        if scored_at is not None and scored_at[0] == best_step:  # the same checkpoint as the last fraction's: its
            scores = dict(scored_at[1])  # scores stand (scoring reads no RNG, so nothing else changes)
        else:
            if best_weights is None and best is not None:  # resumed: the best so far is best.pt's
                best_weights = strip_prefixes(load_checkpoint(ckpts.best_path)["model"])
            current = None
            if best_weights is not None and best_step != step:  # score the best checkpoint, then put this step's back
                current = {k: v.detach().clone() for k, v in raw.state_dict().items()}
                raw.load_state_dict(best_weights)
            scores = budget_score(raw)
            if current is not None:
                raw.load_state_dict(current)
            raw.train()
            scored_at = (best_step, dict(scores))
        eval_time += time.perf_counter() - t0
        for frac in fracs:
            budget[frac] = (best_step, scores)
            log({"event": "budget", "step": step, "fraction": frac, "best_step": best_step, **scores})

    net = raw
    forward = CompiledForward(raw, dev) if cfg.compile and not info.distributed else None
    if forward is not None:
        net = forward
    evals: dict[str, float] = {}
    status, stop_signal, last_saved = "ok", None, ckpt_path if state is not None else None
    with _signal_handlers(cfg.handle_signals) as flag:
        bar = tqdm(total=cfg.max_steps, initial=step, desc=desc, disable=not (cfg.progress and info.is_main),
                   dynamic_ncols=True, leave=False)
        raw.train()
        while step < cfg.max_steps and not stopped_early:
            t0 = time.perf_counter()
            batch = train_batches(step)
            n = batch[-1].shape[0]
            if n % (info.world_size * cfg.grad_accum):
                raise ValueError(f"batch_size: a global batch of {n} does not split over {info.world_size} ranks "
                                 f"x grad_accum={cfg.grad_accum}")
            per_rank = n // info.world_size
            local = tuple(t[info.rank * per_rank:(info.rank + 1) * per_rank] for t in batch)
            if info.distributed and net is raw:  # (compile applies to one process only: DDP wraps the eager model)
                fup = cfg.find_unused_parameters
                if fup is None:
                    micro = per_rank // cfg.grad_accum
                    fup = _find_unused(raw, _to(tuple(t[:micro] for t in local), dev), loss_fn, info, cfg.amp)
                net = DDP(raw, device_ids=[dev.index] if dev.type == "cuda" else None, find_unused_parameters=fup)
            opt.zero_grad(set_to_none=True)
            sums = _accumulate(net, local, cfg, dev, loss_fn)
            gnorm = torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            sums[2] = float(not (torch.isfinite(sums[0]) and torch.isfinite(gnorm)))
            sums[3] = float(flag.signum is not None)
            all_reduce(sums, info)
            loss_v, aux_v = float(sums[0]) / info.world_size, float(sums[1]) / info.world_size
            lr = opt.param_groups[0]["lr"]
            if sums[2] > 0:  # skip the update: the debug checkpoint holds the weights that produced the NaN
                status = "nan"
                log({"event": "status", "status": "nan", "step": step + 1, "lr": lr, "grad_norm": float(gnorm),
                     "loss": loss_v, "aux_loss": aux_v})
                state = snapshot(nan={"step": step + 1, "loss": loss_v, "grad_norm": float(gnorm), "lr": lr})
                last_saved = ckpts.save_debug(state, step + 1) if info.is_main else None
                break
            opt.step()
            sched.step()
            step += 1
            tokens_seen += batch_weight(batch)
            train_time += time.perf_counter() - t0
            bar.update(1)
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                log({"event": "train", "step": step, "loss": loss_v, "aux_loss": aux_v, "lr": lr,
                     "grad_norm": float(gnorm), "tokens_seen": tokens_seen, "train_time_s": train_time})
                bar.set_postfix(loss=f"{loss_v:.4f}")
            if eval_sets and cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
                evals = run_evals()
            if step in budget_steps and budget_steps[step][0] not in budget:
                if best is None:  # no evaluation yet: the budget's best checkpoint is this step's
                    evals = run_evals()
                score_budget(budget_steps[step])
            # early stopping (patience in steps since the last evaluation that beat the best by more than min_delta;
            # with min_delta 0, since the best): a finished run, its best in best.pt
            if cfg.patience and evals and step - improved[1] >= cfg.patience and step < cfg.max_steps:
                log({"event": "early_stop", "step": step, "best_step": best_step, "best_eval": best})
                stopped_early = True
                state = snapshot(early_stopped=True)
                last_saved = ckpts.save(state, step) if info.is_main else None
                break
            stopping = sums[3] > 0 or (cfg.stop_at is not None and step >= cfg.stop_at)
            if stopping or (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == cfg.max_steps:
                state = snapshot()
                last_saved = ckpts.save(state, step) if info.is_main else None
            if stopping and step < cfg.max_steps:
                status, stop_signal = "interrupted", flag.signum
                break
        bar.close()
    if status == "ok" and eval_sets:
        evals = run_evals()
    sync = param_sync_diff(raw, info) if info.distributed else None
    if sync is not None:
        log({"event": "ddp_sync", "step": step, "max_abs_diff": sync, "world_size": info.world_size})
    log({"event": "status", "status": status, "step": step, "signal": stop_signal, "tokens_seen": tokens_seen,
         "train_time_s": train_time})
    return TrainResult(status, step, tokens_seen, train_time, evals, best, last_saved, log_path, stop_signal, sync,
                       best_step if best is not None else None, budget if budget_steps else None, eval_time,
                       forward.how if forward is not None else ("eager: DDP" if cfg.compile else ""))


def _budget_steps(fracs, score, eval_sets, max_steps: int) -> dict[int, tuple[float, ...]]:
    """{step: its fractions} of the budget fractions scored during the run (those below ``max_steps``)."""
    fracs = tuple(fracs or ())
    for f in fracs:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ValueError(f"budget_fracs: expected fractions in (0, 1], got {f!r}")
    if fracs and (score is None or not eval_sets):
        raise ValueError("budget_fracs: needs budget_score and eval_sets (the best validation checkpoint is scored)")
    steps: dict[int, tuple[float, ...]] = {}
    for f in sorted(set(fracs)):  # several fractions can round to one step (short runs): scored once
        s = max(1, round(f * max_steps))
        steps[s] = (*steps.get(s, ()), float(f))
    return {s: f for s, f in steps.items() if s < max_steps}
