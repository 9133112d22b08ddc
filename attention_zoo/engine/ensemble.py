"""Train S independently seeded copies of one model as one grouped model: the seed is a batch dimension.

``group_models(models)`` returns a copy of ``models[0]`` whose parameterised leaves hold the S copies' parameters
stacked on a leading seed axis: every ``nn.Linear`` becomes a ``GroupedLinear`` (one batched GEMM for all seeds),
every ``nn.LayerNorm`` a ``GroupedLayerNorm``, and the raw parameters a module lists in its ``ensemble_parameters``
class attribute carry the seed axis (the module's code handles it). A module that reads a layer's raw weights
(a folded output layer) defines ``ensemble_prepare()``, called on the copy first, to switch to an equal path that
calls its layers instead. Inputs are the S seeds' batches concatenated
along the batch axis, [S·B, ...]: everything between the parameterised leaves (attention cores, masks, means,
activations) works on the folded batch unchanged, so the grouped forward computes exactly what the S models compute
one by one (to floating-point reassociation). A model with any other parameter is refused
(``EnsembleUnsupported``, naming it), and the caller falls back to one model at a time.

The seeds do not interact: the loss is the sum of the per-seed losses, so each seed's parameters receive their own
gradient; clipping and AdamW are applied per seed (``clip_per_seed``; AdamW is elementwise).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EnsembleUnsupported(ValueError):
    """The model holds a parameter that cannot carry a seed axis."""


class GroupedLinear(nn.Module):
    """S Linear layers: ``weight`` [S, out, in], ``bias`` [S, out]; input [S·B, ..., in] (seed-major)."""

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.n_seeds, self.in_features, self.out_features = len(layers), layers[0].in_features, layers[0].out_features
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())
        self.bias = (nn.Parameter(torch.stack([m.bias.detach() for m in layers]).clone())
                     if layers[0].bias is not None else None)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        xs = x.reshape(self.n_seeds, -1, self.in_features)  # (S, B·…, in)
        wt = self.weight.transpose(1, 2)  # (S, in, out)
        y = torch.bmm(xs, wt) if self.bias is None else torch.baddbmm(self.bias[:, None], xs, wt)
        return y.reshape(*lead, self.out_features)  # (S·B, …, out)


class GroupedLayerNorm(nn.Module):
    """S LayerNorms over the last dimension: ``weight``/``bias`` [S, D]."""

    def __init__(self, layers: list[nn.LayerNorm]):
        super().__init__()
        self.n_seeds, self.shape, self.eps = len(layers), tuple(layers[0].normalized_shape), layers[0].eps
        if len(self.shape) != 1 or not layers[0].elementwise_affine:
            raise EnsembleUnsupported("LayerNorm: only a 1-D affine LayerNorm can be grouped")
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]).clone())

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x, self.shape, None, None, self.eps).reshape(self.n_seeds, -1, self.shape[0])  # (S, …, D)
        return torch.addcmul(self.bias[:, None], y, self.weight[:, None]).reshape(x.shape)


_GROUPED = {nn.Linear: GroupedLinear, nn.LayerNorm: GroupedLayerNorm}


def _leaves(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) in _GROUPED]


def check_groupable(model: nn.Module) -> None:
    """Raises EnsembleUnsupported naming the first parameter no grouped leaf or ``ensemble_parameters`` covers."""
    covered = set()
    for name, mod in model.named_modules():
        prefix = f"{name}." if name else ""
        if type(mod) in _GROUPED:
            covered |= {prefix + p for p, _ in mod.named_parameters(recurse=False)}
        covered |= {prefix + p for p in getattr(mod, "ensemble_parameters", ())}
    for pname, _ in model.named_parameters():
        if pname not in covered:
            raise EnsembleUnsupported(f"model: parameter {pname!r} cannot carry a seed axis (not in an nn.Linear or "
                                      "nn.LayerNorm, and its module declares no ensemble_parameters)")


def group_models(models: list[nn.Module]) -> nn.Module:
    """One module holding the S models' parameters on a leading seed axis (module docstring).

    Raises:
        EnsembleUnsupported: fewer than one model, models of different structure, or a parameter that cannot be
            grouped.
    """
    if not models:
        raise EnsembleUnsupported("models: expected at least one model")
    check_groupable(models[0])
    names = [n for n, _ in models[0].named_parameters()]
    for m in models[1:]:
        if [n for n, _ in m.named_parameters()] != names:
            raise EnsembleUnsupported("models: the models differ in structure")
    grouped = copy.deepcopy(models[0])
    for mod in grouped.modules():  # a module that reads its layers' raw weights switches to an equal path
        if callable(getattr(mod, "ensemble_prepare", None)):
            mod.ensemble_prepare()
    for leaf in _leaves(grouped):
        parent, _, attr = leaf.rpartition(".")
        owner = grouped.get_submodule(parent) if parent else grouped
        setattr(owner, attr, _GROUPED[type(owner.get_submodule(attr))]([m.get_submodule(leaf) for m in models]))
    for name, mod in grouped.named_modules():
        own = dict(mod.named_parameters(recurse=False))
        for pname in (p for p in getattr(mod, "ensemble_parameters", ()) if p in own):
            full = f"{name}.{pname}" if name else pname
            stacked = torch.stack([m.get_parameter(full).detach() for m in models]).clone()
            setattr(mod, pname, nn.Parameter(stacked))
    return grouped


@torch.no_grad()
def verify_grouped(grouped: nn.Module, models: list[nn.Module], x: Tensor, rtol: float = 1e-4) -> None:
    """Check on one input that the grouped forward equals the S models' forwards (a module may read a layer's raw
    weight without declaring it: this catches it). ``x`` [S, B, ...]; the models' ``forward`` returns a tensor or a
    tuple whose first element is the output.

    Raises:
        EnsembleUnsupported: the grouped forward fails or differs by more than ``rtol`` (relative to the output's
            scale).
    """
    def first(out):
        return out[0] if isinstance(out, (tuple, list)) else out

    try:
        ref = torch.cat([first(m(x[i])) for i, m in enumerate(models)])
        got = first(grouped(x.reshape(-1, *x.shape[2:])))
    except (RuntimeError, ValueError, IndexError) as exc:
        raise EnsembleUnsupported(f"model: the grouped forward fails ({str(exc).splitlines()[0][:160]})") from None
    scale = ref.abs().max().clamp(min=1e-12)
    err = float((got.reshape(ref.shape) - ref).abs().max() / scale) if got.numel() == ref.numel() else float("inf")
    if not err <= rtol:
        raise EnsembleUnsupported(f"model: the grouped forward differs from the models' (relative error {err:.2g})")


@torch.no_grad()
def clip_per_seed(params: list[Tensor], max_norm: float = 1.0) -> Tensor:
    """Per seed, scale the gradients as ``clip_grad_norm_(model_s.parameters(), max_norm)`` does; returns the
    per-seed total norms [S]."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack([g.flatten(1).square().sum(1) for g in grads]).sum(0).sqrt()  # (S,)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
    return norms


@torch.no_grad()
def seed_state(grouped: nn.Module, template: nn.Module, seed_index: int) -> dict[str, Tensor]:
    """The state dict of ``template`` (a model of the same structure) for seed ``seed_index`` of ``grouped``."""
    src = dict(grouped.named_parameters())
    state = template.state_dict()
    for k in list(state):
        if k in src:
            state[k] = src[k][seed_index].detach().clone()
    return state


__all__ = ["EnsembleUnsupported", "GroupedLayerNorm", "GroupedLinear", "check_groupable", "clip_per_seed",
           "group_models", "seed_state", "verify_grouped"]
