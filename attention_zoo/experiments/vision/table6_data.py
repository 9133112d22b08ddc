"""Table 6's data and metrics: the image sets as tensors, the classification loss, top-k accuracy."""


from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data.imagefolder import (
    FolderEvaluator,
    FolderSampler,
    TensorImageEvaluator,
    TensorImageSampler,
    check_same_classes,
    eval_transform,
    find_imagefolder,
    load_imagefolder,
    train_transform,
)
from ...data.images import load_digits_images, load_images, train_val_split
from ...engine.distributed import DistInfo, all_reduce
from ...engine.ensemble import n_members
from ...engine.grouped import member_outputs
from .presets import Preset

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


@dataclass
class ImageData:
    n_train: int
    num_classes: int
    in_chans: int
    n_val: int
    sampler: Callable  # (batch_size, seed, info) -> ClassificationSampler
    evaluator: Callable  # (batch_size, info) -> evaluator(limit)
    chance_top1: float | None = None  # % of the evaluation labels that are the training set's majority class
    validator: Callable | None = None  # (batch_size, info) -> evaluator of the validation split carved for tuning


def majority_top1(train_labels: Tensor, eval_labels: Tensor) -> float:
    """Top-1 (%) of always answering the training set's most frequent class: the trivial classifier."""
    return 100.0 * float((eval_labels == torch.bincount(train_labels).argmax()).float().mean())


def load_data(preset: Preset, data_dir=None, download: bool = True, workers: int | None = None,
              holdout: float | None = None) -> ImageData:
    """The preset's train/validation data; ``holdout`` (digits): that fraction of the training images becomes a
    validation split of its own (``validator``, for early stopping and tuning), the evaluation split stays the
    test split. See find_imagefolder / load_images for Raises."""
    if holdout and preset.dataset != "digits":
        raise ValueError(f"holdout: a validation split is carved from the digits only, not {preset.dataset}")
    common = dict(label_smoothing=preset.label_smoothing, mixup=preset.mixup)
    if preset.dataset == "imagenet":
        root = find_imagefolder(data_dir)
        tr, va = load_imagefolder(root, "train"), load_imagefolder(root, "val")
        check_same_classes(tr, va)
        tt = train_transform(preset.image_size, **preset.augment)
        et = eval_transform(preset.image_size, round(preset.image_size / 0.875))  # 224 -> 256

        def n_workers(info: DistInfo) -> int:
            return workers if workers is not None else min(8, (os.cpu_count() or 1) // info.world_size)

        return ImageData(len(tr), len(tr.classes), 3, len(va),
                         lambda b, seed, info: FolderSampler(tr, tt, b, len(tr.classes), seed, n_workers(info),
                                                             rank=info.rank, world_size=info.world_size, **common),
                         lambda b, info: FolderEvaluator(va, et, b, info.rank, info.world_size, n_workers(info)))
    if preset.dataset == "digits":
        full = load_digits_images(preset.image_size)
        tr_idx, va_idx = train_val_split(len(full), 0.3, seed=0)
        tr, va, mean, std = full.subset(tr_idx), full.subset(va_idx), (0.5,), (0.5,)
        if holdout:
            keep, held = train_val_split(len(tr), holdout, seed=1)
            tr, tv = tr.subset(keep), tr.subset(held)
    else:
        tr, va = (load_images(preset.dataset, s, data_dir, download) for s in ("train", "test"))
        mean, std = CIFAR_MEAN, CIFAR_STD
    n_classes = len(tr.classes) or int(tr.labels.max()) + 1
    return ImageData(len(tr), n_classes, tr.images.shape[1], len(va),
                     lambda b, seed, info: TensorImageSampler(tr.images, tr.labels, b, n_classes, seed, mean=mean,
                                                              std=std, rank=info.rank, world_size=info.world_size,
                                                              **preset.augment, **common),
                     lambda b, info: TensorImageEvaluator(va.images, va.labels, b, mean, std),
                     majority_top1(tr.labels, va.labels),
                     (lambda b, info: TensorImageEvaluator(tv.images, tv.labels, b, mean, std)) if holdout else None)


def classification_loss(batch, output) -> Tensor:
    """Cross-entropy against soft targets (training: smoothing/mixup baked in) or integer labels (evaluation)."""
    logits = output.logits if hasattr(output, "logits") else output
    logits, y = logits.float(), batch[-1]
    if y.is_floating_point():
        return -(y * F.log_softmax(logits, -1)).sum(-1).mean()
    return F.cross_entropy(logits, y)


def _classification_member_losses(batch, output, n: int) -> Tensor:
    """``classification_loss`` of each member of a grouped model's seed-major batch (``engine.grouped``), in one
    call: each member's mean over its own rows."""
    logits = output.logits if hasattr(output, "logits") else output
    logits, y = logits.float(), batch[-1]
    per = -(y * F.log_softmax(logits, -1)).sum(-1) if y.is_floating_point() else F.cross_entropy(logits, y,
                                                                                                  reduction="none")
    return per.view(n, -1).mean(1)


classification_loss.member_losses = _classification_member_losses


def topk_correct(logits: Tensor, targets: Tensor, ks: tuple[int, ...] = (1, 5)) -> Tensor:
    """(len(ks),) int64: rows whose target is among their k highest logits, per k (k capped at the class count)."""
    kmax = min(max(ks), logits.shape[-1])
    hit = logits.topk(kmax, dim=-1).indices == targets[:, None]  # (B, kmax)
    return torch.stack([hit[:, :min(k, kmax)].any(-1).sum() for k in ks])


@torch.no_grad()
def evaluate_topk(model: nn.Module, batches, info: DistInfo | None = None, ks: tuple[int, ...] = (1, 5),
                  amp: str = "auto") -> dict[str, float]:
    """``{"top1": %, "top5": %, "loss": mean NLL, "n": images}`` over ``batches`` (batch i on rank i mod W).

    Raises:
        ValueError: no batches.
    """
    info = info or DistInfo(device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    total = torch.zeros(len(ks) + 2, dtype=torch.float64, device=info.device)  # correct per k, NLL sum, count
    on = amp == "bf16" or (amp == "auto" and info.device.type == "cuda")
    for i, batch in enumerate(batches):
        if i % info.world_size != info.rank:
            continue
        x, y = (t.to(info.device, non_blocking=True) for t in batch)
        with torch.autocast(info.device.type, dtype=torch.bfloat16, enabled=on):
            logits = model(x).logits.float()
        nll = F.cross_entropy(logits, y, reduction="sum")
        counts = torch.stack([nll.double(), total.new_tensor(len(y))])
        total += torch.cat([topk_correct(logits, y, ks).double(), counts])
    all_reduce(total, info)
    model.train(was_training)
    if total[-1] == 0:
        raise ValueError("batches: the evaluation set is empty")
    n = float(total[-1])
    return {**{f"top{k}": 100 * float(total[j]) / n for j, k in enumerate(ks)}, "loss": float(total[-2]) / n, "n": n}


@torch.no_grad()
def evaluate_topk_members(net: nn.Module, batches, ks: tuple[int, ...] = (1, 5), amp: str = "auto"
                          ) -> list[dict[str, float]]:
    """``evaluate_topk`` for every member of a grouped model (``engine.grouped``): one grouped forward per batch.

    Raises:
        ValueError: no batches.
    """
    S, device = n_members(net), next(net.parameters()).device
    was_training = net.training
    net.eval()
    total = torch.zeros(S, len(ks) + 2, dtype=torch.float64, device=device)
    on = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on):
            outs, _ = member_outputs(net, (x,), S)
        for s, o in enumerate(outs):
            logits = o.logits.float()
            nll = F.cross_entropy(logits, y, reduction="sum")
            total[s] += torch.cat([topk_correct(logits, y, ks).double(), torch.stack([nll.double(),
                                                                                      nll.new_tensor(len(y)).double()])])
    net.train(was_training)
    if total[0, -1] == 0:
        raise ValueError("batches: the evaluation set is empty")
    return [{**{f"top{k}": 100 * float(t[j]) / float(t[-1]) for j, k in enumerate(ks)},
             "loss": float(t[-2]) / float(t[-1]), "n": float(t[-1])} for t in total]
