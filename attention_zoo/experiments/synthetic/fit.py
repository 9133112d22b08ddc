"""Training of the synthetic cells (Appendix I): one group of seeds of one (task, setting, arm) at a time.

The seeds of a group train together as grouped models (``engine.ensemble``: the seed is a batch dimension) when
the arm's modules allow it and a step is small enough for grouping to pay (``ensemble_parts``), else one after the
other; every path runs this same loop, so a seed's data, its initialisation (``set_seed(seed)`` before building its
model), its batch order (a stream of its own) and every update are those it gets alone. Per seed: AdamW (fused on
CPU), linear warm-up then cosine decay to ``min_lr_ratio``·lr, global-norm clipping at 1, early stopping on the
validation split (its own split, disjoint from test) once ``patience × eval_every`` steps have passed since a
seed's best validation score (evaluations added at the budget fractions do not shorten it); the reported test
metrics are those of the best validation checkpoint, and the test metric of the best checkpoint so far is also
recorded at ``budget_fracs`` of ``max_steps`` (the same run seen at smaller budgets). The test split is scored only
there and at the end, on the best checkpoints. No host synchronisation per step: losses stay on the device until
an evaluation.

A tuning grid rides the same axis: ``hparams`` gives each member its own (learning rate, weight decay), trained
with ``engine.member_adamw.MemberAdamW`` when grouped (torch's AdamW at that setting when alone: the separate run
it equals); several members may share a seed (the data and the initialisation are the seed's). ``score_test=False``
(a tuning cell) scores the validation split only: the test split is never read before the setting is chosen.

A group checkpoints its whole state every ``ckpt_every`` steps (``engine.checkpoint``: verified, atomic), so an
interrupted group resumes mid-run with the same results.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data import synthetic as syn
from ...engine.checkpoint import load_checkpoint, save_checkpoint
from ...engine.ensemble import EnsembleUnsupported, clip_per_seed, group_models, verify_grouped
from ...engine.member_adamw import MemberAdamW
from ...envinfo import set_seed
from ...measure.flops import analytic_flops
from ...measure.params import count_params
from ...registry import split_options
from .task import Fit, SyntheticModel, Task, task_data


def _losses(out: Tensor, y: Tensor, regression: bool, n_seeds: int) -> Tensor:
    """Per-seed mean loss [S] of a seed-major batch: out [S·B, n_out], y [S, B]."""
    if regression:
        return (out.view(n_seeds, -1) - y).square().mean(1)
    return F.cross_entropy(out, y.reshape(-1), reduction="none").view(n_seeds, -1).mean(1)


@torch.no_grad()
def _predict(net: nn.Module, x: Tensor, chunk: int = 512) -> Tensor:
    """x [S, N, T, D] -> outputs [S, N, n_out] (eval mode)."""
    S = x.shape[0]
    outs = [net(x[:, i:i + chunk].reshape(-1, *x.shape[2:]))[0].view(S, -1, net_out(net))
            for i in range(0, x.shape[1], chunk)]
    return torch.cat(outs, 1)


def net_out(net: nn.Module) -> int:
    return net.head.out_features


# Work of one grouped step, in forward FLOPs, above which a bigger ensemble stops paying: measured on 1 thread at the
# decide shapes, a 10-seed ensemble is 1.4× faster than seed by seed where a seed's forward is ≈ 25 MFLOP (MHA,
# D = 32), equal near 100 MFLOP (D = 64) and slower beyond (MHA at D = 80: 1.07×, the parameter-matched MHA at
# D = 32: 1.75× slower): small steps are bound by per-op overhead, which grouping removes; large ones by GEMMs and
# memory passes, which grouping only makes bigger (python -m attention_zoo.bench train).
ENSEMBLE_FLOPS = 300e6


def ensemble_parts(n_seeds: int, seed_flops: float, budget: float = ENSEMBLE_FLOPS) -> list[list[int]]:
    """Seed indices split into near-equal consecutive parts of at most max(1, budget // seed_flops) seeds."""
    size = n_seeds if budget >= math.inf else max(1, min(n_seeds, int(budget // max(seed_flops, 1.0))))
    n_parts = -(-n_seeds // size)
    bounds = [round(i * n_seeds / n_parts) for i in range(n_parts + 1)]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


class Group:
    """One (task, setting, arm) over ``seeds``: builds the models, trains them (grouped if possible), scores them.

    With ``ensemble``, the seeds train as grouped models of up to ``ENSEMBLE_FLOPS`` of forward work per step each
    (``ensemble_parts``): all of them at once for a small model, one by one for a large one. Every path gives the
    same numbers (to floating-point reassociation); ``path`` says which ran.
    """

    def __init__(self, task: Task, arm: str, flavor: str, seeds: list[int], n_layers: int, options: dict, fit: Fit,
                 device: torch.device, ensemble: bool = True, ensemble_flops: float = ENSEMBLE_FLOPS,
                 data: dict[str, Tensor] | None = None, hparams: list[tuple[float, float]] | None = None,
                 score_test: bool = True):
        self.task, self.arm, self.flavor, self.seeds, self.fit, self.device = task, arm, flavor, seeds, fit, device
        self.regression = task.task == "regression"
        self.options, _ = split_options(arm, {**options, "flavor": flavor})
        if hparams is not None and len(hparams) != len(seeds):
            raise ValueError(f"hparams: {len(hparams)} (lr, weight_decay) pairs for {len(seeds)} members")
        self.hparams, self.score_test = hparams, score_test
        # the data depend on (task, seed) only: arms of one cell may share another group's ``data`` (one entry per
        # distinct seed, in order of first appearance); members of one seed index the same entry
        unique = list(dict.fromkeys(seeds))
        self.data_ix = torch.tensor([unique.index(s) for s in seeds], device=device)
        if data is None:
            datas = [task_data(task, s) for s in unique]
            data = {k: torch.stack([d[k] for d in datas]).to(device) for k in datas[0]}  # (seeds, N, …)
            del datas
        D = data["x_train"].shape[-1]
        self.models = []
        for s in seeds:
            set_seed(s)  # the per-seed initialisation, whichever path trains it
            self.models.append(SyntheticModel(D, n_layers, arm, self.options, 1 if self.regression else syn.N_CLASSES))
        self.data = data
        self.orders = torch.stack([torch.randint(task.n_train, (fit.max_steps, fit.batch_size),
                                                 generator=syn.make_generator((s + 0x9E3779B9) % 2**32))
                                   for s in seeds]).to(device)  # (S, steps, B): the same for every arm
        self.parts, self.nets = [[i] for i in range(len(seeds))], [None] * len(seeds)
        self.path, self.reason = "per-seed", "" if len(seeds) > 1 else "one seed"
        if not ensemble or len(seeds) < 2:
            return
        seed_flops = analytic_flops(self.models[0], fit.batch_size, task.seq_len)
        parts = ensemble_parts(len(seeds), seed_flops, ensemble_flops)
        if len(parts) == len(seeds):
            self.reason = (f"one seed's step ({seed_flops / 1e6:.0f} MFLOP forward) exceeds the ensemble budget "
                           f"({ensemble_flops / 1e6:.0f} MFLOP): grouping would be slower")
            return
        try:
            nets = [self._grouped(part) if len(part) > 1 else None for part in parts]
        except EnsembleUnsupported as exc:
            self.reason = str(exc)
            return
        self.parts, self.nets = parts, nets
        sizes = sorted({len(p) for p in parts}, reverse=True)
        self.path = (f"ensemble of {len(seeds)}" if len(parts) == 1 else
                     f"{len(parts)} ensembles of {'/'.join(map(str, sizes))}")

    def _grouped(self, part: list[int]) -> nn.Module:
        net = group_models([self.models[i] for i in part]).to(self.device)
        verify_grouped(net, [self.models[i].to(self.device) for i in part],
                       self.data["x_train"][self.data_ix[part], :4])
        return net

    # ---- training -----------------------------------------------------------------------------------------------
    def train(self, ckpt: Path | None = None, stop_at: int | None = None) -> list[list[dict]] | None:
        """Rows per seed; None when ``stop_at`` interrupted it (the checkpoint holds the state)."""
        rows = []
        for part, net in zip(self.parts, self.nets):  # each part runs the same loop, with S = len(part)
            tag = (f"m{part[0]}-{part[-1]}" if self.hparams is not None  # members may share seeds
                   else f"s{self.seeds[part[0]]}-{self.seeds[part[-1]]}")
            part_ckpt = None if ckpt is None or len(self.parts) == 1 else ckpt.with_suffix(f".{tag}.pt")
            got = self._run(net if net is not None else self.models[part[0]].to(self.device), part,
                            ckpt if len(self.parts) == 1 else part_ckpt, stop_at)
            if got is None:
                return None
            rows += got
        return rows

    def _run(self, net: nn.Module, idx: list[int], ckpt: Path | None, stop_at: int | None):
        fit, S = self.fit, len(idx)
        data = {k: v[self.data_ix[idx]] for k, v in self.data.items()}
        step_fn, opt, sched = self.stepper(net, idx)
        st = {"step": 0, "best_val": [math.inf] * S, "best_step": [0] * S, "stopped": [False] * S,
              "stop_step": [None] * S,
              "best_test": [None] * S, "budget": [{} for _ in range(S)], "curve": [[] for _ in range(S)],
              "train_loss": [[] for _ in range(S)], "cpu_s": 0.0, "wall_s": 0.0, "best_state": None}
        if ckpt is not None and ckpt.is_file():
            saved = load_checkpoint(ckpt)
            net.load_state_dict(saved["net"])
            opt.load_state_dict(saved["opt"])
            sched.load_state_dict(saved["sched"])
            st = saved["state"]
        best_state = st["best_state"] or {k: v.detach().clone() for k, v in net.state_dict().items()}
        evals, budgets = fit.eval_steps(), {max(1, round(f * fit.max_steps)): f for f in fit.budget_fracs}
        net.train()
        t0, c0 = time.perf_counter(), time.process_time()
        step, pending = st["step"], list(st.get("pending") or [])  # losses since the last evaluation
        while step < fit.max_steps and not all(st["stopped"]):
            pending.append(step_fn(step))
            step += 1
            if step in evals:
                self._evaluate(net, data, st, step, budgets.get(step), best_state, torch.stack(pending))
                pending = []
            if fit.ckpt_every and step % fit.ckpt_every == 0 and ckpt is not None:
                st.update(step=step, best_state=best_state, cpu_s=st["cpu_s"] + time.process_time() - c0,
                          wall_s=st["wall_s"] + time.perf_counter() - t0, pending=pending)
                t0, c0 = time.perf_counter(), time.process_time()
                save_checkpoint(ckpt, {"net": net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                                       "state": st})
                if stop_at is not None and step >= stop_at:
                    return None
        net.load_state_dict(best_state)  # every seed's best validation checkpoint
        if self.score_test and st.get("tested_at") != st["best_step"]:  # scored once per best checkpoint
            self._test_best(net, data, st)
        for f in budgets.values() if self.score_test else ():  # budgets after every seed stopped: their best stands
            for s in range(S):
                st["budget"][s].setdefault(f, st["best_test"][s])
        cpu = st["cpu_s"] + time.process_time() - c0
        wall = st["wall_s"] + time.perf_counter() - t0
        if ckpt is not None and ckpt.is_file():
            ckpt.unlink()
        # A seed's own steps: where patience stopped it (the group may train on for the others), else the last.
        return [self._rows(st, s, idx[s], st["stop_step"][s] or step, cpu / S, wall / S) for s in range(S)]

    def stepper(self, net: nn.Module, idx: list[int]):
        """(step(i) -> per-seed losses [S], optimizer, scheduler) for seeds ``idx`` of ``net`` (the grouped model
        or one seed's own): one optimizer update on each seed's batch ``i``, with no host synchronisation."""
        S, fit = len(idx), self.fit
        # the whole training set indexed per member (a batch gather, never a copy of the set)
        x, y, orders = self.data["x_train"], self.data["y_train"], self.orders[idx]
        grouped = S > 1  # a part of several seeds is always a grouped model
        params = [p for p in net.parameters() if p.requires_grad]
        kind = {"fused": True} if self.device.type == "cpu" else {"foreach": True}
        if self.hparams is None:
            opt = torch.optim.AdamW(params, lr=fit.lr, betas=(0.9, 0.99), weight_decay=fit.weight_decay, **kind)
        elif grouped:
            lr, wd = (torch.tensor([self.hparams[i][j] for i in idx], dtype=torch.float64) for j in (0, 1))
            opt = MemberAdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=wd)
        else:  # a member alone: exactly the separate run at its setting
            lr, wd = self.hparams[idx[0]]
            opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=wd, **kind)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, fit.lr_factor)
        rows_ix = self.data_ix[idx][:, None]

        def step(i: int) -> Tensor:
            xb, yb = x[rows_ix, orders[:, i]], y[rows_ix, orders[:, i]]  # (S, B, T, D), (S, B)
            out, aux = net(xb.reshape(-1, *xb.shape[2:]))
            losses = _losses(out, yb, self.regression, S)
            opt.zero_grad(set_to_none=True)
            (losses.sum() + aux).backward()
            if grouped:
                clip_per_seed(params, 1.0)
            else:
                nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()
            sched.step()
            return losses.detach()

        return step, opt, sched

    @torch.no_grad()
    def _evaluate(self, net, data, st, step, budget, best_state, pending: Tensor) -> None:
        net.eval()
        val = _predict(net, data["x_val"])
        v_loss = _losses(val.reshape(-1, val.shape[-1]), data["y_val"], self.regression, val.shape[0]).tolist()
        train_mean = pending.mean(0).tolist()  # the losses since the last evaluation: one sync per evaluation
        improved = [s for s in range(len(v_loss)) if not st["stopped"][s] and v_loss[s] < st["best_val"][s]]
        for s in improved:
            st["best_val"][s], st["best_step"][s] = v_loss[s], step
            if len(v_loss) > 1:  # this seed's slice of every grouped parameter
                for k, p in net.named_parameters():
                    best_state[k][s] = p[s]
            else:
                best_state.update({k: v.detach().clone() for k, v in net.state_dict().items()})
        if self.score_test and budget is not None and st.get("tested_at") != st["best_step"]:
            scratch = copy.deepcopy(net)  # the best checkpoints, scored without disturbing the training state
            scratch.load_state_dict(best_state)
            self._test_best(scratch, data, st)
        for s in range(len(v_loss)):
            if st["stopped"][s]:
                continue
            # patience in steps since the best score, not in evaluations: the budget fractions add evaluations
            if self.fit.patience and step - st["best_step"][s] >= self.fit.patience * self.fit.eval_every:
                st["stopped"][s], st["stop_step"][s] = True, step
            st["curve"][s].append((step, v_loss[s]))
            st["train_loss"][s].append((step, train_mean[s]))
            if budget is not None and self.score_test:
                st["budget"][s][budget] = st["best_test"][s]
        net.train()

    def _test_best(self, net, data, st) -> None:
        """Test metrics of every seed's best checkpoint (``net`` holds them), read at budget points and at the end:
        the test split is scored only where a result reads it."""
        training = net.training
        net.eval()
        st["best_test"] = [t if math.isfinite(v) else None
                           for t, v in zip(self._test_metrics(net, data), st["best_val"])]
        st["tested_at"] = list(st["best_step"])
        net.train(training)

    def _test_metrics(self, net, data) -> list[dict]:
        pred = _predict(net, data["x_test"])  # (S, N, n_out)
        out = []
        for s in range(pred.shape[0]):
            y = data["y_test"][s]
            if self.regression:
                p = pred[s, :, 0]
                out.append({"test_mse": F.mse_loss(p, y).item(),
                            "test_mse_clean": F.mse_loss(p, data["y_test_clean"][s]).item()})
            else:
                out.append({"test_acc": (pred[s].argmax(1) == y).float().mean().item(),
                            "test_loss": F.cross_entropy(pred[s], y).item()})
        return out

    # ---- rows ---------------------------------------------------------------------------------------------------
    def _rows(self, st: dict, s: int, i: int, steps_run: int, cpu_s: float, wall_s: float) -> list[dict]:
        """Seed ``i`` of the group, entry ``s`` of the loop's state."""
        model = self.models[i]
        params = count_params(model)
        fwd = analytic_flops(model, self.fit.batch_size, self.task.seq_len)
        common = {"params": params["total_params"], "attention_params": params["attention_params"],
                  "attention_options": str(self.options), "device": str(self.device), "path": self.path,
                  "path_reason": self.reason, "status": "ok", "message": ""}
        val_unit = "mse" if self.regression else "nats"
        tail = [{"metric": "val_loss@step", "step": k, "value": v, "unit": val_unit} for k, v in st["curve"][s]]
        tail += [{"metric": "train_loss@step", "step": k, "value": v, "unit": val_unit} for k, v in st["train_loss"][s]]
        tail += [{"metric": "best_val_loss", "value": st["best_val"][s], "unit": val_unit},
                 {"metric": "best_step", "value": st["best_step"][s], "unit": "steps"},
                 {"metric": "steps_run", "value": steps_run, "unit": "steps"},
                 {"metric": "train_cpu_s", "value": cpu_s, "unit": "s"},
                 {"metric": "train_time_s", "value": wall_s, "unit": "s"},
                 {"metric": "train_flops", "value": 3.0 * fwd * steps_run, "unit": "FLOP (analytic, 3 × forward)"}]
        if not self.score_test:  # a tuning member: validation only
            if not math.isfinite(st["best_val"][s]):
                return [{**common, "metric": "best_val_loss", "value": math.nan, "unit": val_unit, "status": "nan",
                         "message": "no finite validation loss (diverged)"}]
            return [{**common, **r} for r in tail]
        best = st["best_test"][s] or {}
        d = {k: v[self.data_ix[i]] for k, v in self.data.items()}
        y, unit = d["y_test"], "mse" if self.regression else "fraction"
        rows = [{"metric": k, "value": v, "unit": "nats" if k == "test_loss" else ("mse" if "mse" in k else unit)}
                for k, v in best.items()]
        if self.regression:
            var = float(((y - d["y_train"].mean()) ** 2).mean())  # the trivial predictor: the training mean
            rows += [{"metric": "test_r2", "value": 1 - best.get("test_mse", math.nan) / var, "unit": "fraction"},
                     {"metric": "trivial_mse", "value": var, "unit": "mse"},
                     {"metric": "oracle_mse", "value": F.mse_loss(d["y_test_clean"], y).item(), "unit": "mse"}]
        else:
            chance = float(torch.bincount(y).max() / len(y))  # the majority class
            oracle = float((d["oracle_pred"] == y).float().mean())
            acc = best.get("test_acc", math.nan)
            rows += [{"metric": "chance_acc", "value": chance, "unit": "fraction"},
                     {"metric": "oracle_test_acc", "value": oracle, "unit": "fraction"},
                     {"metric": "test_acc_norm", "value": (acc - chance) / (oracle - chance) if oracle > chance
                      else math.nan, "unit": "fraction of oracle − chance"}]
        metric = "test_mse" if self.regression else "test_acc"
        rows += [{"metric": f"{metric}@budget", "budget": f, "value": (v or {}).get(metric, math.nan), "unit": unit}
                 for f, v in sorted(st["budget"][s].items())]
        rows += tail
        if any(not math.isfinite(r["value"]) for r in rows if r["metric"] in ("test_mse", "test_acc")) or not best:
            rows = [{"metric": metric, "value": math.nan, "unit": unit, "status": "nan",
                     "message": "no finite validation loss (diverged)"}]
        return [{**common, **r} for r in rows]
