"""Parameter counts: attention-only (every attention module, plus each stack-shared module counted once) and
the whole model, measured from the tensors and, for the attention part, from the modules' closed forms."""

from __future__ import annotations

from torch import nn

from .flops import analytic_parts


def _unique_numel(params) -> int:
    seen, total = set(), 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def count_params(model: nn.Module) -> dict:
    """``{"attention_params", "attention_params_analytic", "total_params"}`` (tied / shared tensors once).

    Attention-only = the parameters of every attention module plus those of each stack-shared module (DAMCHA's
    metric generator); the analytic count sums ``analytic_params()`` of the same modules.
    """
    attn, shared, _ = analytic_parts(model)
    modules = attn + shared
    return {
        "attention_params": _unique_numel(p for m in modules for p in m.parameters()),
        "attention_params_analytic": sum(int(m.analytic_params()) for m in modules),
        "total_params": _unique_numel(model.parameters()),
    }
