"""Expert-load logging and balance statistics for routing attentions (MoA).

A routing attention records, after every forward, how many real tokens it routed to each expert
(``last_expert_load``, [E], detached). ``ExpertLoadLog(model)`` finds every module that keeps such a record (by the
attribute, not by the variant's name), sums the records over the forwards run inside its ``with`` block (one
evaluation pass, say), and turns the totals into one row per layer and statistic:

- ``expert_load_cv``: the coefficient of variation of the per-expert loads, std/mean (0 = perfectly balanced;
  √(E − 1) = every token on one expert);
- ``expert_load_entropy``: the entropy of the load shares divided by log E (1 = balanced, 0 = one expert);
- ``expert_load_max_share``: the largest expert's share of the routed tokens (1/E when balanced);
- ``expert_load_unused``: the fraction of experts that received no token.

These are the statistics behind MoA's "balanced expert loads" (Zhang et al. 2022); the claim MOA.balance reads them.
"""

from __future__ import annotations

import json
import math

import torch
from torch import Tensor, nn

LOAD_ATTRIBUTE = "last_expert_load"
STATISTICS = ("expert_load_cv", "expert_load_entropy", "expert_load_max_share", "expert_load_unused")


def balance_stats(load: Tensor | list[float]) -> dict[str, float]:
    """The balance statistics of one layer's per-expert token counts (module docstring); NaN for no tokens.

    Raises:
        ValueError: ``load`` not a 1-D sequence of finite non-negative counts.
    """
    t = torch.as_tensor(load, dtype=torch.float64)
    if t.dim() != 1 or t.numel() == 0 or not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise ValueError(f"load: expected a 1-D sequence of finite non-negative counts, got {load!r}")
    E, total = t.numel(), float(t.sum())
    if total <= 0:
        return dict.fromkeys(STATISTICS, math.nan)
    share = t / total
    nz = share[share > 0]
    entropy = float(-(nz * nz.log()).sum()) / math.log(E) if E > 1 else 1.0
    return {"expert_load_cv": float(t.std(unbiased=False) / t.mean()), "expert_load_entropy": entropy,
            "expert_load_max_share": float(share.max()), "expert_load_unused": float((t == 0).double().mean())}


def routing_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module that records a per-expert load."""
    return [(name, m) for name, m in model.named_modules() if hasattr(m, LOAD_ATTRIBUTE)]


class ExpertLoadLog:
    """Sums every routing module's ``last_expert_load`` over the forwards inside ``with ExpertLoadLog(model) as log``;
    ``log.rows()`` gives the per-layer balance rows (``layer``: the module's name, its index in ``layer_index``)."""

    def __init__(self, model: nn.Module):
        self.modules = routing_modules(model)
        self.totals: dict[str, Tensor] = {}
        self._hooks: list = []

    def __enter__(self) -> ExpertLoadLog:
        for name, module in self.modules:
            self._hooks.append(module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def _hook(self, name: str):
        def record(module, inputs, output):
            load = getattr(module, LOAD_ATTRIBUTE, None)
            if torch.is_tensor(load):
                load = load.detach().to("cpu", torch.float64)
                self.totals[name] = load if name not in self.totals else self.totals[name] + load
        return record

    def rows(self) -> list[dict]:
        """One row per (layer, statistic), each with the layer's per-expert counts as JSON text (``expert_load``)."""
        out = []
        for i, (name, _) in enumerate(self.modules):
            load = self.totals.get(name)
            if load is None:
                continue
            counts = json.dumps([int(v) for v in load.tolist()])
            for metric, value in balance_stats(load).items():
                out.append({"metric": metric, "value": value, "unit": "ratio", "layer": name, "layer_index": i,
                            "expert_load": counts})
        return out


__all__ = ["LOAD_ATTRIBUTE", "STATISTICS", "ExpertLoadLog", "balance_stats", "routing_modules"]
