"""The members of a grouped model (``grouped``): grouping S seeds' models for training, their outputs and losses one
member at a time, and evaluating every member in one pass."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ensemble import EnsembleUnsupported, group_models, n_members, verify_grouped
from .steps import IGNORE_INDEX, Batch, _autocast, batch_weight, lm_loss


@torch.no_grad()
def check_deterministic(model: nn.Module, inputs: tuple) -> None:
    """Raises EnsembleUnsupported when ``model``'s training-mode forward draws random numbers (two forwards under
    different RNG states differ): grouped members would share one random stream instead of drawing their own."""
    was = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):
            outs = []
            for s in (12345, 54321):
                torch.manual_seed(s)
                out = model(*inputs)
                outs.append(out.logits if hasattr(out, "logits") else out)
    finally:
        model.train(was)
    if not torch.equal(outs[0], outs[1]):
        raise EnsembleUnsupported("model: its training forward is random (dropout, noisy gating or sampling): grouped "
                                  "members would draw from one stream instead of their own")


def group_for_training(models: list[nn.Module], probe: tuple) -> nn.Module:
    """The grouped model of ``models`` after the checks that make it equal to training them one by one: every
    parameter groups, the grouped forward equals theirs on ``probe`` (one member's inputs), and the forward is
    deterministic.

    Raises:
        EnsembleUnsupported: naming why (the caller trains the members one at a time).
    """
    grouped = group_models(models)
    check_deterministic(models[0], probe)
    if len(probe) == 1:
        x = probe[0]
        verify_grouped(grouped, models, torch.stack([x] * len(models)), rtol=1e-3)
    return grouped


def check_samplers(samplers: list) -> None:
    """Refuse members whose batches can differ in shape from one another (a sampler with ``fixed_shape = False``:
    text padded to each batch's longest row): their batches cannot be stacked seed-major.

    Raises:
        EnsembleUnsupported: naming the sampler.
    """
    for smp in samplers:
        if not getattr(smp, "fixed_shape", True):
            raise EnsembleUnsupported(f"sampler: {type(smp).__name__} pads each batch to its own longest row, so "
                                      "the members' batches differ in length and cannot be stacked")


def _seed_major(batches: list[Batch]) -> Batch:
    return tuple(torch.cat(parts) for parts in zip(*batches))


def member_outputs(net: nn.Module, inputs: tuple, n: int) -> tuple[list[SimpleNamespace], Tensor | None]:
    """Every member's output on the same ``inputs`` (repeated seed-major): [n] outputs with ``.logits``, and the
    group's auxiliary loss."""
    out = net(*(torch.cat([t] * n) for t in inputs))
    logits = out.logits if hasattr(out, "logits") else out
    return [SimpleNamespace(logits=x) for x in logits.chunk(n)], getattr(out, "aux_loss", None)


@torch.no_grad()
def evaluate_members(net: nn.Module, batches: Iterable[Batch], loss_fn: Callable = lm_loss, amp: str = "auto"
                     ) -> list[float]:
    """``engine.loop.evaluate`` for every member of a grouped model: each member's exact mean of ``loss_fn`` over
    ``batches`` (weighted by ``batch_weight``), one grouped forward per batch.

    Raises:
        ValueError: no batches.
    """
    n, device = n_members(net), next(net.parameters()).device
    was = net.training
    net.eval()
    total, weight = torch.zeros(n, dtype=torch.float64, device=device), 0
    for batch in batches:
        batch = tuple(t.to(device, non_blocking=True) for t in batch)
        with _autocast(device, amp):
            outs, _ = member_outputs(net, batch[:-1], n)
        w = batch_weight(batch)
        total += torch.stack([loss_fn(batch, o).double() for o in outs]) * w
        weight += w
    net.train(was)
    if weight == 0:
        raise ValueError("batches: the evaluation set is empty")
    return (total / weight).tolist()


def _lm_member_losses(batch: Batch, out, n: int) -> Tensor:
    """``lm_loss`` of each member of a seed-major batch in one cross-entropy call: each member's mean over its own
    scored targets."""
    logits = out.logits if hasattr(out, "logits") else out
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    y = batch[-1]
    nll = F.cross_entropy(logits.flatten(0, -2), y.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    return nll.view(n, -1).sum(1) / (y != IGNORE_INDEX).view(n, -1).sum(1)


def _member_losses(loss_fn: Callable, batch: Batch, out, n: int) -> Tensor:
    """[n] training losses of a seed-major batch, each member's ``loss_fn`` on its own rows (a loss function may
    carry a ``member_losses(batch, out, n)`` that does it in one call)."""
    if loss_fn is lm_loss:
        return _lm_member_losses(batch, out, n)
    if callable(getattr(loss_fn, "member_losses", None)):
        return loss_fn.member_losses(batch, out, n)
    logits = out.logits if hasattr(out, "logits") else out
    parts = [t.chunk(n) for t in batch]
    return torch.stack([loss_fn(tuple(p[i] for p in parts), SimpleNamespace(logits=x))
                        for i, x in enumerate(logits.chunk(n))])


