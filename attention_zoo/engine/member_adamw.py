"""AdamW for a grouped ensemble whose members train at their own learning rate and weight decay.

A tuning grid (learning rate × weight decay) can ride the ensemble axis instead of multiplying the runs: member s of
a grouped model (``engine.ensemble``: every parameter carries the member axis first) is updated with ``lr[s]`` and
``weight_decay[s]``. The arithmetic is torch's single-tensor AdamW (decoupled decay, bias-corrected moments; no
amsgrad, no maximize), applied with the member's hyper-parameters broadcast over its slice, so each member follows
the trajectory it would follow alone with ``torch.optim.AdamW(lr=lr[s], weight_decay=weight_decay[s])`` (to
floating-point rounding). ``lr`` and ``weight_decay`` are floats or [S] tensors. A group's ``lr`` entry holds a
float a learning-rate scheduler such as ``LambdaLR`` can scale (1.0 where ``lr`` was a vector, which is kept as the
group's ``member_lr``): the learning rate of member s is ``group["lr"] · member_lr[s]``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _member_vector(name: str, value) -> Tensor | float:
    if isinstance(value, Tensor):
        if value.dim() != 1 or not torch.isfinite(value).all() or (value < 0).any():
            raise ValueError(f"{name}: expected a float or a 1-D tensor of finite values >= 0, got {value!r}")
        return value.detach().to(torch.float64)
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: expected a float >= 0 or a 1-D tensor, got {value!r}")
    return float(value)


def _per_member(value, p: Tensor):
    """A float as is; an [S] vector as [S, 1, …, 1] in ``p``'s dtype, to broadcast over each member's slice."""
    if not isinstance(value, Tensor):
        return value
    if value.numel() != p.shape[0]:
        raise ValueError(f"lr: {value.numel()} member values for a parameter with {p.shape[0]} members")
    return value.to(device=p.device, dtype=p.dtype).view(-1, *([1] * (p.dim() - 1)))


class MemberAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay=1e-2):
        lr = _member_vector("lr", lr)
        member_lr, lr = (lr, 1.0) if isinstance(lr, Tensor) else (1.0, lr)
        defaults = dict(lr=lr, member_lr=member_lr, betas=betas, eps=eps,
                        weight_decay=_member_vector("weight_decay", weight_decay))
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                lr = group["lr"] * _per_member(group["member_lr"], p)
                wd = _per_member(group["weight_decay"], p)
                exp_avg, exp_avg_sq, grad, t = state["exp_avg"], state["exp_avg_sq"], p.grad, state["step"]
                p.mul_(1 - lr * wd)  # decoupled weight decay
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = lr / (1 - beta1**t)
                denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**t)).add_(group["eps"])
                p.sub_((exp_avg / denom).mul_(step_size))
        return loss

    @torch.no_grad()
    def select_members(self, keep: list[int], new_params: dict[int, Tensor]) -> MemberAdamW:
        """The optimizer of the same model after ``engine.ensemble.select_members(model, keep)`` (which returned
        ``new_params``, {id of the old parameter: the new one}): each group's per-member hyper-parameters and every
        parameter's moments sliced to the kept members; the step counts and the scalar hyper-parameters carried."""
        index = torch.tensor(keep)
        groups = []
        for g in self.param_groups:
            pick = {k: (v.index_select(0, index) if isinstance(v, Tensor) and v.dim() == 1 else v)
                    for k, v in g.items() if k in ("member_lr", "weight_decay")}
            groups.append({**{k: v for k, v in g.items() if k != "params"}, **pick,
                           "params": [new_params[id(p)] for p in g["params"]]})
        out = MemberAdamW.__new__(MemberAdamW)
        torch.optim.Optimizer.__init__(out, groups, self.defaults)
        for g_old, g_new in zip(self.param_groups, out.param_groups):
            for p_old, p_new in zip(g_old["params"], g_new["params"]):
                st = self.state.get(p_old)
                if st:
                    sel = index.to(p_old.device)
                    out.state[p_new] = {"step": st["step"], "exp_avg": st["exp_avg"].index_select(0, sel),
                                        "exp_avg_sq": st["exp_avg_sq"].index_select(0, sel)}
        return out


__all__ = ["MemberAdamW"]
