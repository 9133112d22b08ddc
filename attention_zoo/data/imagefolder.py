"""Image classification data for Table 6: ImageNet-1K from an ImageFolder directory, and in-memory image sets.

**ImageNet layout** (``torchvision.datasets.ImageFolder``): ``<root>/train/<class>/*.JPEG`` and
``<root>/val/<class>/*.JPEG`` with the same class folders (the 1,000 WordNet ids); ``<root>`` is ``--data-dir``
or a folder ``imagenet`` inside it. :data:`PREPARE_HELP` says how to build it from the official archives.

**DeiT-style recipe** (Touvron et al. 2021, "Training data-efficient image transformers"):
- train (:func:`train_transform`): RandomResizedCrop 224 (scale 0.08–1, bicubic), horizontal flip, RandAugment
  (torchvision's, 2 ops at magnitude 9; DeiT uses timm's ``rand-m9-mstd0.5-inc1``, whose magnitude is jittered
  with σ = 0.5 and whose op set differs slightly), ImageNet mean/std, RandomErasing p = 0.25 with random values;
- per batch (:class:`Mixup`): mixup α = 0.8 or CutMix α = 1.0 (switch probability 0.5) on label-smoothed one-hot
  targets (:func:`soft_targets`, ε = 0.1), as timm's ``Mixup`` in ``batch`` mode;
- eval (:func:`eval_transform`): resize 256 (bicubic) → center crop 224, ImageNet mean/std.
Not implemented here: repeated augmentation (3 repeats per image per epoch).

**Position-addressable batches** (the training engine's convention): ``sampler(step)`` depends only on
``(seed, step)``. Image ``p`` of the global batch at ``step`` is augmented under its own RNG seed
``(seed, step, p)``, so the batch is the same for any number of DataLoader workers or ranks, and a resumed run sees
the batches an uninterrupted one would. Under DDP the engine gives rank r the contiguous slice
``[r·B/W, (r+1)·B/W)`` of the global batch; a sampler built with ``(rank, world_size)`` decodes and augments only
that slice and returns it inside a global-shaped tensor whose other rows are left unset (the engine never reads
them). Mixup pairs images within the rank's slice (as DeiT does per GPU), so it alone depends on the world size.
Evaluators yield batches in dataset order; under DDP batch i belongs to rank ``i mod W`` (the engine's
``evaluate`` convention) and the other ranks get ``None`` in its place instead of a decoded batch.
"""

from __future__ import annotations

import abc
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .fetch import DatasetNotFoundError
from .sampling import IndexSampler
from .text import resolve_data_dir

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPLITS = ("train", "val")

PREPARE_HELP = """\
ImageNet-1K is not redistributable, so it is never downloaded. To prepare it:
  1. get ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and ILSVRC2012_devkit_t12.tar.gz from
     https://image-net.org/download-images (free registration);
  2. train: mkdir -p DIR/train && tar -xf ILSVRC2012_img_train.tar -C DIR/train, then extract each class tar
     into its own folder: cd DIR/train && for f in *.tar; do d=${f%.tar}; mkdir -p $d && tar -xf $f -C $d && rm $f; done
  3. val: extract ILSVRC2012_img_val.tar into DIR/val and sort the 50,000 images into class folders, e.g. with
     https://raw.githubusercontent.com/soumith/imagenetloader.torch/master/valprep.sh (run inside DIR/val), or let
     torchvision do both steps: put the three archives in DIR and run
     python -c "import attention_zoo, torchvision as tv; [tv.datasets.ImageNet('DIR', s) for s in ('train', 'val')]"
     (torchvision writes DIR/train and DIR/val in this layout);
  4. pass --data-dir DIR (or set $ATTENTION_ZOO_DATA=DIR).
Expected layout: DIR/train/<wnid>/*.JPEG and DIR/val/<wnid>/*.JPEG with the same 1,000 class folders."""


def _has_classes(path: Path) -> bool:
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


def find_imagefolder(data_dir: str | os.PathLike | None = None) -> Path:
    """The ImageNet root: ``data_dir`` (else ``$ATTENTION_ZOO_DATA``, else ``~/.cache/attention_zoo/data``) or its
    ``imagenet`` subfolder, whichever holds ``train/`` and ``val/`` with class subfolders.

    Raises:
        DatasetNotFoundError: neither holds both splits; the message says how to prepare them.
    """
    root = resolve_data_dir(data_dir)
    for cand in (root, root / "imagenet"):
        if all(_has_classes(cand / s) for s in SPLITS):
            return cand
    missing = [str(root / s) for s in SPLITS if not _has_classes(root / s)]
    raise DatasetNotFoundError(f"imagenet: no ImageFolder split at {', '.join(missing)} (nor under "
                               f"{root / 'imagenet'}).\n{PREPARE_HELP.replace('DIR', str(root))}")


def load_imagefolder(root: str | os.PathLike, split: str):
    """``torchvision.datasets.ImageFolder`` of ``root/split`` without a transform (items are (PIL RGB, label)).

    Raises:
        ValueError: unknown ``split``.
        DatasetNotFoundError: the split folder is missing or holds no images.
    """
    from torchvision.datasets import ImageFolder

    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    path = Path(root) / split
    try:
        return ImageFolder(str(path))
    except (FileNotFoundError, RuntimeError) as exc:  # no class folders / no image files
        raise DatasetNotFoundError(f"imagenet {split}: {exc}\n{PREPARE_HELP.replace('DIR', str(root))}") from exc


def check_same_classes(train, val) -> None:
    """Raises ValueError when the two folders' class lists differ (labels would not line up)."""
    if list(train.classes) != list(val.classes):
        only = sorted(set(train.classes) ^ set(val.classes))[:5]
        raise ValueError(f"val: its class folders differ from train's ({len(val.classes)} vs {len(train.classes)}; "
                         f"e.g. {only})")


def train_transform(size: int = 224, randaugment: tuple[int, int] | None = (2, 9), random_erasing: float = 0.25,
                    mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """DeiT-style per-image training augmentation (see the module docstring); ``None``/0 disables a part."""
    from torchvision import transforms as T

    bicubic = T.InterpolationMode.BICUBIC
    ops = [T.RandomResizedCrop(size, scale=(0.08, 1.0), interpolation=bicubic), T.RandomHorizontalFlip()]
    if randaugment:
        ops.append(T.RandAugment(num_ops=randaugment[0], magnitude=randaugment[1], interpolation=bicubic))
    ops += [T.ToTensor(), T.Normalize(mean, std)]
    if random_erasing:
        ops.append(T.RandomErasing(p=random_erasing, value="random"))
    return T.Compose(ops)


def eval_transform(size: int = 224, resize: int = 256, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """Resize the short side to ``resize`` (bicubic), center crop ``size``, normalise."""
    from torchvision import transforms as T

    return T.Compose([T.Resize(resize, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(size), T.ToTensor(),
                      T.Normalize(mean, std)])


def item_seed(seed: int, step: int, position: int) -> int:
    """The augmentation seed of image ``position`` of the global batch at ``step``."""
    return int(np.random.SeedSequence([seed, step, position]).generate_state(1)[0])


def soft_targets(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """(B,) int -> (B, C) float: 1 − ε + ε/C on the label, ε/C elsewhere (timm's label smoothing)."""
    off = smoothing / num_classes
    out = torch.full((len(labels), num_classes), off)
    return out.scatter_(1, labels.long()[:, None], 1.0 - smoothing + off)


@dataclass(frozen=True)
class Mixup:
    """Per-batch mixup / CutMix on images and soft targets, pairing image i with image B−1−i (timm, ``batch``
    mode). CutMix's λ is corrected to the clipped box's area.

    Raises:
        ValueError: a negative α, both α zero, or a probability outside [0, 1].
    """

    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    prob: float = 1.0
    switch_prob: float = 0.5

    def __post_init__(self):
        for name in ("mixup_alpha", "cutmix_alpha"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")
        if self.mixup_alpha == 0 and self.cutmix_alpha == 0:
            raise ValueError("mixup_alpha: mixup and cutmix alphas are both 0 (use no Mixup instead)")
        for name in ("prob", "switch_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}: expected a probability in [0, 1], got {getattr(self, name)}")

    def __call__(self, x: Tensor, y: Tensor, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
        if rng.random() >= self.prob:
            return x, y
        cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or rng.random() < self.switch_prob)
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        lam = float(rng.beta(alpha, alpha))
        if cutmix:
            H, W = x.shape[-2:]
            ch, cw = int(H * np.sqrt(1 - lam)), int(W * np.sqrt(1 - lam))
            cy, cx = int(rng.integers(H)), int(rng.integers(W))
            y0, y1 = np.clip([cy - ch // 2, cy + ch // 2], 0, H)
            x0, x1 = np.clip([cx - cw // 2, cx + cw // 2], 0, W)
            x = x.clone()
            x[..., y0:y1, x0:x1] = x.flip(0)[..., y0:y1, x0:x1]
            lam = 1.0 - (y1 - y0) * (x1 - x0) / (H * W)
        else:
            x = x * lam + x.flip(0) * (1 - lam)
        return x, y * lam + y.flip(0) * (1 - lam)


class ClassificationSampler(IndexSampler, metaclass=abc.ABCMeta):
    """``sampler(step) -> (images [B,C,H,W] float, soft targets [B,num_classes])`` over ``labels``; subclasses
    supply ``_local(step, indices, positions) -> images`` for this rank's slice (see the module docstring).

    Raises:
        ValueError: a global batch that does not split evenly over ``world_size`` ranks.
    """

    def __init__(self, labels: Tensor, batch_size: int, num_classes: int, seed: int = 0, label_smoothing: float = 0.0,
                 mixup: Mixup | None = None, rank: int = 0, world_size: int = 1):
        super().__init__(len(labels), batch_size, seed)
        if batch_size % world_size:
            raise ValueError(f"batch_size: {batch_size} does not split over {world_size} ranks")
        self.labels, self.num_classes = torch.as_tensor(labels, dtype=torch.long), num_classes
        self.label_smoothing, self.mixup = label_smoothing, mixup
        per = batch_size // world_size
        self.rank, self.world_size, self.slice = rank, world_size, slice(rank * per, (rank + 1) * per)

    @abc.abstractmethod
    def _local(self, step: int, indices: np.ndarray, positions: range) -> Tensor:
        """Augmented float images of ``indices`` (global-batch ``positions``) at ``step``."""

    def close(self) -> None:
        """Release what the sampler holds (worker processes, for samplers that have them)."""

    def __call__(self, step: int) -> tuple[Tensor, Tensor]:
        idx = self.indices(step)[self.slice]
        x = self._local(step, idx, range(self.slice.start, self.slice.stop))
        y = soft_targets(self.labels[torch.from_numpy(idx)], self.num_classes, self.label_smoothing)
        if self.mixup is not None:
            x, y = self.mixup(x, y, np.random.default_rng([self.seed, step, self.rank, 7]))
        if self.world_size == 1:
            return x, y
        gx, gy = x.new_empty((self.batch_size, *x.shape[1:])), y.new_zeros((self.batch_size, y.shape[1]))
        gx[self.slice], gy[self.slice] = x, y  # the other ranks' rows stay unset: the engine reads only this slice
        return gx, gy


class _Seeded(torch.utils.data.Dataset):
    """Items keyed by ``(index, seed)``: the transform runs under its own torch RNG stream (None: no reseeding)."""

    def __init__(self, folder, transform):
        self.folder, self.transform = folder, transform

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, key: tuple[int, int | None]) -> Tensor:
        index, seed = key
        image, _ = self.folder[index]
        if seed is None:
            return self.transform(image)
        with torch.random.fork_rng(devices=[]):  # leaves the caller's stream (dropout, ...) untouched
            torch.manual_seed(seed)
            return self.transform(image)


class _Keys(torch.utils.data.Sampler):
    """An endless batch sampler: the key lists of ``keys(step)`` for step = start, start + 1, ..."""

    def __init__(self, keys, start: int):
        self.keys, self.start = keys, start

    def __iter__(self):
        return (self.keys(step) for step in itertools.count(self.start))


def _loader(dataset, batch_sampler, workers: int):
    return torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=workers,
                                       collate_fn=torch.stack, prefetch_factor=4 if workers else None)


class FolderSampler(ClassificationSampler):
    """Training batches from an ImageFolder, decoded by ``workers`` DataLoader processes that prefetch the next
    steps; a call for any other step than the next restarts them there."""

    def __init__(self, folder, transform, batch_size: int, num_classes: int, seed: int = 0, workers: int = 0,
                 **kwargs):
        super().__init__([t for _, t in folder.samples], batch_size, num_classes, seed, **kwargs)
        self.data, self.workers = _Seeded(folder, transform), workers
        self._it, self._next = None, None

    def _keys(self, step: int) -> list[tuple[int, int]]:
        idx = self.indices(step)
        return [(int(idx[p]), item_seed(self.seed, step, p)) for p in range(self.slice.start, self.slice.stop)]

    def _local(self, step: int, indices: np.ndarray, positions: range) -> Tensor:
        if self._next != step:
            self.close()
            self._it = iter(_loader(self.data, _Keys(self._keys, step), self.workers))
        self._next = step + 1
        return next(self._it)

    def close(self) -> None:
        """Stop the worker processes (they also stop when the sampler is garbage-collected)."""
        self._it, self._next = None, None


class FolderEvaluator:
    """``evaluator(limit) -> (images, labels)`` batches of an ImageFolder, ``None`` for batches of other ranks (see
    the module docstring). The images are visited in a fixed order seeded by ``order_seed`` (None: folder order):
    ImageFolder sorts by class, so only a shuffled order makes the first ``limit`` batches a fair subset."""

    def __init__(self, folder, transform, batch_size: int, rank: int = 0, world_size: int = 1, workers: int = 0,
                 order_seed: int | None = 0):
        self.data, self.labels = _Seeded(folder, transform), torch.tensor([t for _, t in folder.samples])
        n = len(self.labels)
        self.order = np.arange(n) if order_seed is None else np.random.default_rng(order_seed).permutation(n)
        self.batch_size, self.rank, self.world_size, self.workers = batch_size, rank, world_size, workers

    def __len__(self) -> int:
        return -(-len(self.labels) // self.batch_size)

    def __call__(self, limit: int | None = None):
        n = len(self) if limit is None else min(len(self), limit)
        idx = [self.order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(n)]
        keys = [[(int(j), None) for j in idx[i]] for i in range(n) if i % self.world_size == self.rank]
        batches = iter(_loader(self.data, keys, self.workers))
        for i in range(n):
            yield (next(batches), self.labels[torch.from_numpy(idx[i])]) if i % self.world_size == self.rank else None


class TensorImageSampler(ClassificationSampler):
    """Training batches from uint8 images ``[N,C,H,W]`` in memory (CIFAR, digits): random translation by up to
    ``pad`` pixels (zero padding, then a random crop) and an optional horizontal flip, then ``(x/255 − mean)/std``.
    The global batch's offsets and flips are drawn from ``(seed, step)``, so a rank's slice is world-size free."""

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int, num_classes: int, seed: int = 0,
                 pad: int = 0, flip: bool = False, mean=(0.5,), std=(0.5,), **kwargs):
        super().__init__(labels, batch_size, num_classes, seed, **kwargs)
        self.images, self.pad, self.flip = images, pad, flip
        self.mean, self.std = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)

    def _local(self, step: int, indices: np.ndarray, positions: range) -> Tensor:
        rng = np.random.default_rng([self.seed, step, 3])
        offsets = rng.integers(0, 2 * self.pad + 1, size=(self.batch_size, 2))[positions.start:positions.stop]
        flips = (rng.random(self.batch_size) < 0.5)[positions.start:positions.stop]
        x = self.images[torch.from_numpy(indices)]
        if self.pad:
            H, W = x.shape[-2:]
            padded = torch.nn.functional.pad(x, (self.pad,) * 4)  # (b, C, H+2p, W+2p)
            x = torch.stack([padded[i, :, oy:oy + H, ox:ox + W] for i, (oy, ox) in enumerate(offsets)])
        if self.flip:
            x = torch.where(torch.from_numpy(flips)[:, None, None, None], x.flip(-1), x)
        return normalize(x, self.mean, self.std)


def normalize(images: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """uint8 [B,C,H,W] -> float32 ``(x/255 − mean)/std``."""
    return (images.float() / 255 - mean) / std


class TensorImageEvaluator:
    """``evaluator(limit) -> (images, labels)`` batches of in-memory uint8 images in order (no augmentation)."""

    def __init__(self, images: Tensor, labels: Tensor, batch_size: int, mean=(0.5,), std=(0.5,)):
        self.images, self.labels, self.batch_size = images, torch.as_tensor(labels, dtype=torch.long), batch_size
        self.mean, self.std = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return -(-len(self.labels) // self.batch_size)

    def __call__(self, limit: int | None = None):
        n = len(self) if limit is None else min(len(self), limit)
        for i in range(n):
            sl = slice(i * self.batch_size, (i + 1) * self.batch_size)
            yield normalize(self.images[sl], self.mean, self.std), self.labels[sl]
