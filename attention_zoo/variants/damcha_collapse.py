"""The collapsed DAMCHA generator (docs/variants.md §7.4, "DAMCHA under RowSum"): a copy of a full ``mlp``-mode
generator that keeps only its H·dₕ·dₕ functionally distinct outputs, and the AdamW groups under which it trains like
the full one."""

from __future__ import annotations

import torch
from torch import nn

from .damcha_generator import StructuredMLPForM
from .damcha_ops import fold_rowsum


@torch.no_grad()
def collapse_generator(gen: StructuredMLPForM) -> StructuredMLPForM:
    """A collapsed copy of a full ``mlp``-mode generator computing the same metrics m_i (issue: RowSum analysis).

    In ``mlp`` mode the loss sees the D² output rows only through their H-fold block-row sums, so every block of a
    block-row gets the same gradient. The collapsed layer keeps one H·dh·dh-row layer P with W′ = H·P. Under
    Adam/AdamW each element's update is invariant to a constant gradient scale, so P moves like one block of the
    full layer and W′ = H·P moves like the sum of its H identical updates. Exact when the collapsed parameters use
    eps·H (``adam_param_groups``) and no global-norm clipping couples them to other parameters; with the same eps
    or with clipping it is approximate; under SGD the matching scale would be √H, not H.
    """
    from dataclasses import replace

    new = StructuredMLPForM(gen.d_model, gen.n_heads, gen.causal, gen.n_layers,
                            replace(gen.cfg, collapsed_generator=True))
    new.trunk.load_state_dict(gen.trunk.state_dict())
    W, b = fold_rowsum(gen.out.weight, gen.out.bias, gen.n_heads)
    new.out.weight.copy_(W / gen.n_heads)
    new.out.bias.copy_(b / gen.n_heads)
    return new.to(gen.out.weight.dtype)


def adam_param_groups(model: nn.Module, eps: float = 1e-8, **group_options) -> list[dict]:
    """AdamW parameter groups with eps·H for collapsed generator layers, so they track the full model exactly."""
    scaled, scaled_ids = [], set()
    for m in model.modules():
        if isinstance(m, StructuredMLPForM) and m.collapsed:
            for p in m.out.parameters():
                if id(p) not in scaled_ids:
                    scaled_ids.add(id(p))
                    scaled.append((p, m.n_heads))
    rest = [p for p in model.parameters() if id(p) not in scaled_ids]
    groups = [{"params": rest, "eps": eps, **group_options}]
    for h in sorted({h for _, h in scaled}):
        groups.append({"params": [p for p, hh in scaled if hh == h], "eps": eps * h, **group_options})
    return groups
