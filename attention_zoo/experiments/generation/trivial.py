"""The trivial predictor of each generation task, scored exactly as ``val_loss`` is (the same validation batches,
the same loss function): the learned-at-all gate's reference, stored as ``trivial_val_loss`` (``claims.gate``).

- patch: every masked patch value predicted as the training images' mean pixel value (in the task's [-1, 1]);
- pixel: a unigram of the training images' pixel tokens;
- text: a unigram of the training pairs' target tokens and EOS (the tokens that carry the loss), add-one smoothed.

Each is a ``Constant`` model, so ``scoring.validation_loss`` scores it with the task's own loss and masks."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...data.image_tasks import to_unit_range
from ...models import ModelOutput


class Constant(nn.Module):
    """The same output for every position of every input: ``value`` [P] (patch values) or [V] (log-probabilities)."""

    def __init__(self, value: Tensor):
        super().__init__()
        self.register_buffer("value", value.float())

    def forward(self, inputs: Tensor, *_) -> ModelOutput:
        out = self.value.expand(*inputs.shape[:2], self.value.shape[-1])
        return ModelOutput(out, out.new_zeros(()))


def _unigram(tokens: Tensor, vocab_size: int) -> Tensor:
    counts = torch.bincount(tokens.long().flatten(), minlength=vocab_size).double() + 1.0  # add-one
    return (counts / counts.sum()).log()


def trivial_predictor(data) -> Constant:
    """The task's trivial predictor, fitted on the training split only."""
    if data.task == "patch":
        mean = to_unit_range(data.train_set.images).mean()
        return Constant(torch.full((data.patch_dim,), float(mean)))
    if data.task == "pixel":
        return Constant(_unigram(data.train_set, data.vocab_size))
    eos = data.tok.eos_id
    targets = torch.tensor([t for pair in data.train_set for t in (*pair.target, eos)])
    return Constant(_unigram(targets, data.vocab_size))
