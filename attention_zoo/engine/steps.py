"""What a training step and an evaluation share (``loop``, ``grouped``): the language-model loss, batch weights,
moving a batch to the device, autocast by the run's ``amp`` setting, and ``evaluate``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .distributed import DistInfo, all_reduce

IGNORE_INDEX = -100
Batch = tuple[Tensor, ...]


def lm_loss(batch: Batch, output) -> Tensor:
    """Mean next-token cross-entropy in nats over targets that are not ``IGNORE_INDEX`` (in float32 at least)."""
    logits = output.logits if hasattr(output, "logits") else output
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 autocast logits -> float32
    return F.cross_entropy(logits.flatten(0, -2), batch[-1].flatten(), ignore_index=IGNORE_INDEX)


def batch_weight(batch: Batch) -> int:
    """What a batch's mean loss averages over: scored tokens for integer targets, else examples."""
    y = batch[-1]
    return int((y != IGNORE_INDEX).sum()) if not y.is_floating_point() else y.shape[0]


def _aux(output) -> Tensor | None:
    aux = getattr(output, "aux_loss", None)
    return aux if torch.is_tensor(aux) else None


def _to(batch: Batch, device: torch.device) -> Batch:
    return tuple(t.to(device, non_blocking=True) for t in batch)


def _autocast(device: torch.device, amp: str):
    on = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=on)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], loss_fn: Callable = lm_loss, info: DistInfo | None = None,
             amp: str = "auto") -> float:
    """Exact mean of ``loss_fn`` over all batches, weighted by :func:`batch_weight`; ranks share the batches."""
    info = info or DistInfo(device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=info.device)
    for i, batch in enumerate(batches):
        if i % info.world_size != info.rank:
            continue
        batch = _to(batch, info.device)
        with _autocast(info.device, amp):
            out = model(*batch[:-1])
        w = batch_weight(batch)
        total += torch.stack([loss_fn(batch, out).double() * w, total.new_tensor(float(w))])
    all_reduce(total, info)
    model.train(was_training)
    if total[1] == 0:
        raise ValueError("batches: the evaluation set is empty")
    return float(total[0] / total[1])


