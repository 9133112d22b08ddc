"""Train S independently seeded copies of one model as one grouped model: the seed is a batch dimension.

``group_models(models)`` returns a copy of ``models[0]`` whose parameterised leaves hold the S copies' parameters
stacked on a leading seed axis: every ``nn.Linear`` becomes a ``GroupedLinear`` (one batched GEMM for all seeds),
every ``nn.LayerNorm`` a ``GroupedLayerNorm``, every ``nn.Embedding`` a ``GroupedEmbedding`` (one lookup in the S
tables side by side), every ``nn.Conv2d`` a ``GroupedConv2d`` (one convolution with S groups), and the raw
parameters a module lists in its ``ensemble_parameters`` class attribute carry the seed axis (the module's code
handles it, ``variants.seed_axis``). Tied parameters stay tied: a decoder's output layer reads its grouped token
embedding. A module that reads a layer's raw weights
(a folded output layer) defines ``ensemble_prepare()``, called on the copy first, to switch to an equal path that
calls its layers instead. Inputs are the S seeds' batches concatenated
along the batch axis, [S·B, ...]: everything between the parameterised leaves (attention cores, masks, means,
activations) works on the folded batch unchanged, so the grouped forward computes exactly what the S models compute
one by one (to floating-point reassociation). A model with any other parameter is refused
(``EnsembleUnsupported``, naming it), and the caller falls back to one model at a time.

The seeds do not interact: the loss is the sum of the per-seed losses, so each seed's parameters receive their own
gradient; clipping and AdamW are applied per seed (``clip_per_seed``; AdamW is elementwise, and
``engine.member_adamw`` gives each member its own learning rate and weight decay). ``select_members`` keeps a subset
of the members in place (a seed that stopped early leaves the group; ``engine.grouped`` trains with it).
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


class GroupedEmbedding(nn.Module):
    """S embedding tables: ``weight`` [S, V, D]; ids [S·B, ...] (seed-major) -> [S·B, ..., D]. Plain tables only (no
    ``padding_idx``, ``max_norm``, frequency scaling or sparse gradients)."""

    def __init__(self, layers: list[nn.Embedding]):
        super().__init__()
        e = layers[0]
        if e.padding_idx is not None or e.max_norm is not None or e.scale_grad_by_freq or e.sparse:
            raise EnsembleUnsupported("Embedding: only a plain table (no padding_idx, max_norm, scale_grad_by_freq "
                                      "or sparse) can be grouped")
        self.n_seeds, self.num_embeddings, self.embedding_dim = len(layers), e.num_embeddings, e.embedding_dim
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())

    def forward(self, ids: Tensor) -> Tensor:
        S, V = self.n_seeds, self.num_embeddings
        offset = torch.arange(S, device=ids.device, dtype=ids.dtype).mul_(V).view(S, *([1] * ids.dim()))
        rows = ids.unflatten(0, (S, ids.shape[0] // S)) + offset  # (S, B, …): seed s reads rows s·V .. s·V + V - 1
        return F.embedding(rows, self.weight.flatten(0, 1)).flatten(0, 1)  # (S·B, …, D)


class GroupedConv2d(nn.Module):
    """S Conv2d layers as one convolution with S groups: ``weight`` [S, out, in, kh, kw], ``bias`` [S, out];
    input [S·B, in, H, W] (seed-major). Ungrouped, zero-padded convolutions only."""

    def __init__(self, layers: list[nn.Conv2d]):
        super().__init__()
        c = layers[0]
        if c.groups != 1 or c.padding_mode != "zeros" or isinstance(c.padding, str):
            raise EnsembleUnsupported("Conv2d: only an ungrouped convolution with numeric zero padding can be grouped")
        self.n_seeds, self.in_channels, self.out_channels = len(layers), c.in_channels, c.out_channels
        self.stride, self.padding, self.dilation = c.stride, c.padding, c.dilation
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]).clone())
        self.bias = (nn.Parameter(torch.stack([m.bias.detach() for m in layers]).clone())
                     if c.bias is not None else None)

    def forward(self, x: Tensor) -> Tensor:
        S = self.n_seeds
        B = x.shape[0] // S
        xs = x.unflatten(0, (S, B)).transpose(0, 1).reshape(B, S * self.in_channels, *x.shape[2:])  # seeds as groups
        y = F.conv2d(xs, self.weight.flatten(0, 1), None if self.bias is None else self.bias.flatten(),
                     self.stride, self.padding, self.dilation, groups=S)  # (B, S·out, h, w)
        return y.unflatten(1, (S, self.out_channels)).transpose(0, 1).reshape(S * B, self.out_channels, *y.shape[2:])


_GROUPED = {nn.Linear: GroupedLinear, nn.LayerNorm: GroupedLayerNorm, nn.Embedding: GroupedEmbedding,
            nn.Conv2d: GroupedConv2d}
GROUPED_LEAVES = tuple(_GROUPED.values())


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


def _ties(model: nn.Module) -> list[list[str]]:
    """The names under which one parameter appears more than once (a tied output layer), first name first."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def _set_param(model: nn.Module, name: str, param: nn.Parameter) -> None:
    parent, _, attr = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    owner._parameters[attr] = param


def group_models(models: list[nn.Module]) -> nn.Module:
    """One module holding the S models' parameters on a leading seed axis (module docstring).

    Raises:
        EnsembleUnsupported: fewer than one model, models of different structure (or ties), or a parameter that
            cannot be grouped.
    """
    if not models:
        raise EnsembleUnsupported("models: expected at least one model")
    check_groupable(models[0])
    names, ties = [n for n, _ in models[0].named_parameters()], _ties(models[0])
    for m in models[1:]:
        if [n for n, _ in m.named_parameters()] != names or _ties(m) != ties:
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
    for first, *others in ties:  # a tied parameter stays one parameter: the grouped copy of its first owner
        for name in others:
            if grouped.get_parameter(name).shape != grouped.get_parameter(first).shape:
                raise EnsembleUnsupported(f"model: parameter {name!r} is tied to {first!r} but their grouped shapes "
                                          "differ")
            _set_param(grouped, name, grouped.get_parameter(first))
    return grouped


def n_members(grouped: nn.Module) -> int:
    """The number of members (seeds) a grouped model holds."""
    return next(grouped.parameters()).shape[0]


@torch.no_grad()
def select_members(grouped: nn.Module, keep: list[int]) -> dict[int, nn.Parameter]:
    """Keep members ``keep`` (in that order) of a grouped model, in place: every parameter (each carries the member
    axis) is sliced, ties stay tied. Returns {id of the old parameter: the new one}, so an optimizer's state can
    follow (``engine.member_adamw.MemberAdamW.select_members``).

    Raises:
        ValueError: ``keep`` empty or naming a member the model does not hold.
    """
    S = n_members(grouped)
    if not keep or any(not isinstance(i, int) or not 0 <= i < S for i in keep):
        raise ValueError(f"keep: expected a non-empty list of member indices in [0, {S}), got {keep!r}")
    index = torch.tensor(keep, device=next(grouped.parameters()).device)
    new: dict[int, nn.Parameter] = {}
    for mod in grouped.modules():
        for pname, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in new:
                new[id(p)] = nn.Parameter(p.index_select(0, index), requires_grad=p.requires_grad)
            mod._parameters[pname] = new[id(p)]
        if isinstance(mod, GROUPED_LEAVES):
            mod.n_seeds = len(keep)
    return new


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
    src = dict(grouped.named_parameters(remove_duplicate=False))  # a tied parameter under each of its names
    state = template.state_dict()
    for k in list(state):
        if k in src:
            state[k] = src[k][seed_index].detach().clone()
    return state


__all__ = ["EnsembleUnsupported", "GroupedConv2d", "GroupedEmbedding", "GroupedLayerNorm", "GroupedLinear",
           "check_groupable", "clip_per_seed", "group_models", "n_members", "seed_state", "select_members",
           "verify_grouped"]
