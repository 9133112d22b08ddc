"""Image sets and the two image tasks of Table 1 (docs/experiments.md §2).

Sets (``load_images``), all as uint8 ``[N, 3, H, W]`` tensors:
- **cifar10 / cifar100**: the python-pickle archives of https://www.cs.toronto.edu/~kriz/, MD5-checked (the values
  torchvision's ``CIFAR10``/``CIFAR100`` publish), extracted once into ``<data_dir>/cifar-10-batches-py`` (or
  ``cifar-100-python``). ``data_dir`` is the argument, else ``$ATTENTION_ZOO_DATA``, else
  ``~/.cache/attention_zoo/data``; an archive or extracted folder already there is used without the network.
- **digits** (offline default): scikit-learn's 1,797 8×8 digits (values 0..16), bilinearly upscaled to ¾ of
  ``size`` and zero-padded to ``size``×``size`` (default 32: a 24×24 digit in a 4-pixel black border, so the tasks
  have CIFAR's shapes), scaled to 0..255 (ink bright), grey replicated to RGB. Only a "train" split: the authors'
  protocol splits it 70/30 with :func:`train_val_split` like CIFAR's train set.

Tasks:
- **patch** (the authors' code): pixels in [−1, 1]; each image is cut into p×p patches in raster order, one token
  per patch with the patch's (p, p, C) values flattened (64 tokens of 48 values at 32×32, p=4); per image 1–3
  consecutive patch *rows* are masked by zeroing the input; the loss is the MSE on the masked patches only.
  Batches are ``(inputs [B,N,P], mask [B,N] bool, targets [B,N,P])``; a model is called as ``model(inputs, mask)``.
- **pixel** (the paper's autoregressive generation, "1024 tokens per 32×32 image, 8-bit pixels"): the docs'
  numbers fit one token per pixel whose value is an 8-bit *colour*, so the default tokenisation is RGB332
  (3 bits red, 3 green, 2 blue: a 256-colour palette, 1,024 tokens at 32×32, lossy). ``gray`` (8-bit luminance,
  1,024 tokens) and ``channels`` (lossless, one 256-way token per channel value, raster order R,G,B per pixel,
  3,072 tokens) are the alternatives. Batches are ``(x, y)`` with ``x = [BOS, t_0 … t_{T-2}]`` and ``y = t``.

Samplers are position-addressable like the training loop expects: ``sampler(step)`` depends only on
``(seed, step)``; every epoch is a fresh seeded permutation. Evaluators yield fixed batches in dataset order
(``evaluator(limit)``: the first ``limit`` batches, as the authors' "first 51 validation batches").
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .text import DATA_ENV, resolve_data_dir

DATASETS = ("digits", "cifar10", "cifar100")
PIXEL_MODES = ("rgb332", "gray", "channels")


class DatasetNotFoundError(FileNotFoundError):
    """Data that is neither on disk nor allowed to be downloaded; the message says how to get it."""


class DatasetError(RuntimeError):
    """A failed download, a checksum mismatch, or an unreadable archive/file."""


@dataclass(frozen=True)
class CifarSpec:
    url: str
    archive: str
    md5: str
    folder: str
    files: dict  # split -> pickle files inside ``folder``
    meta: str
    label_key: str
    names_key: str
    file_md5: dict  # pickle file -> MD5 (torchvision's values): checked before every unpickling


CIFAR = {
    "cifar10": CifarSpec("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "cifar-10-python.tar.gz",
                         "c58f30108f718f92721af3b95e74349a", "cifar-10-batches-py",
                         {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
                         "batches.meta", "labels", "label_names",
                         {"data_batch_1": "c99cafc152244af753f735de768cd75f",
                          "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                          "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
                          "data_batch_4": "634d18415352ddfa80567beed471001a",
                          "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
                          "test_batch": "40351d587109b95175f43aff81a1287e",
                          "batches.meta": "5ff9c542aee3614f3951f8cda6e48888"}),
    "cifar100": CifarSpec("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "cifar-100-python.tar.gz",
                          "eb9058c3a382ffc7106e4002c42a8d85", "cifar-100-python",
                          {"train": ("train",), "test": ("test",)}, "meta", "fine_labels", "fine_label_names",
                          {"train": "16019d7e3df5f24257cddd939b257f8d", "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
                           "meta": "7973b15100ade9c7d40fb424638fde48"}),
}


@dataclass
class ImageSet:
    name: str
    images: Tensor  # uint8 (N, 3, H, W)
    labels: Tensor  # int64 (N,)
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, idx) -> ImageSet:
        idx = torch.as_tensor(idx, dtype=torch.long)
        return ImageSet(self.name, self.images[idx], self.labels[idx], self.classes)


def md5_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def download_file(url: str, dest: str | os.PathLike, md5: str | None, timeout: float = 60.0) -> Path:
    """Stream ``url`` to ``dest`` through a temp file; kept (atomic replace) only if its MD5 matches.

    Raises:
        DatasetError: the download failed or the MD5 differs (nothing is left at ``dest``).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    h = hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(tmp, "wb") as f:
            while block := resp.read(1 << 20):
                h.update(block)
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        if md5 is not None and h.hexdigest() != md5:
            raise DatasetError(f"download of {url}: MD5 mismatch (expected {md5}, got {h.hexdigest()}); "
                               "the file was discarded")
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as exc:
        raise DatasetError(f"download of {url} failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _extract(archive: Path, root: Path, folder: str, url: str) -> Path:
    """Extract into a temp dir beside the target, then move ``folder`` into place (never a half-extracted set)."""
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        with tarfile.open(archive, "r:gz") as tf:
            tf.extractall(tmp, filter="data")
        if not (tmp / folder).is_dir():
            raise DatasetError(f"{archive} has no folder {folder!r}; delete it and download {url} again")
        try:
            os.replace(tmp / folder, root / folder)
        except OSError:
            if not (root / folder).is_dir():  # else another process finished the same extraction first
                raise
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DatasetError(f"{archive} is not a readable tar.gz archive ({exc}); delete it and download {url} "
                           "again") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / folder


def _unpickle(path: Path, md5: str | None) -> dict:
    """Unpickle a CIFAR batch only after its MD5 matched: unpickling runs code, so an unverified file never is."""
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: unreadable CIFAR batch ({exc}); delete {path.parent} and extract again") from exc
    got = hashlib.md5(blob).hexdigest()
    if md5 is None or got != md5:
        raise DatasetError(f"{path}: MD5 {got} does not match the expected {md5}; refusing to unpickle it (delete "
                           f"{path.parent} and extract the archive again)")
    try:
        return pickle.loads(blob, encoding="latin1")
    except (EOFError, pickle.UnpicklingError, ValueError) as exc:
        raise DatasetError(f"{path}: unreadable CIFAR batch ({exc}); delete {path.parent} and extract again") from exc


def _archive_member_md5(archive: Path, md5: str, folder: str) -> dict:
    """{file: MD5} of the members of ``folder`` in a CIFAR-format archive whose own MD5 is checked first."""
    if not archive.is_file() or md5_file(archive) != md5:
        raise DatasetError(f"{archive}: missing or not matching MD5 {md5}, so the extracted files cannot be verified; "
                           "pass file_md5 or keep the verified archive next to the folder")
    sums = {}
    try:
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf:
                parent, _, name = member.name.rpartition("/")
                if member.isfile() and parent == folder:
                    sums[name] = hashlib.md5(tf.extractfile(member).read()).hexdigest()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DatasetError(f"{archive} is not a readable tar.gz archive ({exc})") from exc
    return sums


def cifar_folder(name: str, data_dir: str | os.PathLike | None = None, download: bool = True,
                 url: str | None = None, md5: str | None = None) -> Path:
    """The extracted CIFAR folder: found in ``data_dir`` (or ``data_dir`` itself), else extracted from the archive
    there, else downloaded. ``url``/``md5`` override the canonical ones (mirrors, test fixtures).

    Raises:
        DatasetNotFoundError: nothing on disk and ``download`` is False.
        DatasetError: download failure, MD5 mismatch (a local archive is checked too), unreadable archive.
        ValueError: unknown ``name``.
    """
    if name not in CIFAR:
        raise ValueError(f"name: expected one of {sorted(CIFAR)}, got {name!r}")
    spec = CIFAR[name]
    url, md5 = url or spec.url, md5 or spec.md5
    root = resolve_data_dir(data_dir)
    if root.name == spec.folder and root.is_dir():
        return root
    if (root / spec.folder).is_dir():
        return root / spec.folder
    archive = root / spec.archive
    if not archive.is_file():
        if not download:
            raise DatasetNotFoundError(
                f"{name}: neither {root / spec.folder} nor {archive} exists; download {url} into {root}/ (or set "
                f"${DATA_ENV} / --data-dir to the directory holding it), or allow the download")
        download_file(url, archive, md5)
    elif (got := md5_file(archive)) != md5:
        raise DatasetError(f"{archive}: MD5 mismatch (expected {md5}, got {got}); delete it and download {url} again")
    return _extract(archive, root, spec.folder, url)


def load_cifar(name: str, split: str = "train", data_dir: str | os.PathLike | None = None, download: bool = True,
               url: str | None = None, md5: str | None = None, file_md5: dict | None = None) -> ImageSet:
    """CIFAR-10/100 images as uint8 (N, 3, 32, 32) with fine labels. See :func:`cifar_folder` for Raises.

    Every pickle file is MD5-checked before it is unpickled, on every load (a pre-extracted folder included):
    against ``file_md5`` if given, else the canonical values, or, when ``md5`` names another archive (a test
    fixture), against that archive's members (the archive must then lie next to the folder).

    Raises:
        DatasetError: also when a file's MD5 does not match (it is not unpickled).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    folder = cifar_folder(name, data_dir, download, url, md5)
    spec = CIFAR[name]
    if file_md5 is None:
        own = md5 is None or md5 == spec.md5
        file_md5 = spec.file_md5 if own else _archive_member_md5(folder.parent / spec.archive, md5, spec.folder)
    data, labels = [], []
    for fname in spec.files[split]:
        if not (folder / fname).is_file():
            raise DatasetError(f"{folder} lacks {fname}; delete the folder and extract the archive again")
        batch = _unpickle(folder / fname, file_md5.get(fname))
        data.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))  # rows are R, G, B planes
        labels.extend(batch[spec.label_key])
    meta = folder / spec.meta
    classes = tuple(_unpickle(meta, file_md5.get(spec.meta))[spec.names_key]) if meta.is_file() else ()
    return ImageSet(name, torch.from_numpy(np.concatenate(data)), torch.tensor(labels, dtype=torch.long), classes)


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def load_digits_images(size: int = 32) -> ImageSet:
    """scikit-learn's digits as uint8 (1797, 3, size, size); see the module docstring."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"size: expected an int >= 8, got {size!r}")
    images, labels = _sklearn_digits()
    x = torch.from_numpy(images).float()[:, None]  # (N, 1, 8, 8), 0..16
    inner = round(size * 0.75)
    x = F.interpolate(x, size=(inner, inner), mode="bilinear", align_corners=False)  # convex: stays in 0..16
    lo = (size - inner) // 2
    x = F.pad(x, (lo, size - inner - lo, lo, size - inner - lo))  # (N, 1, size, size)
    x = (x * (255 / 16)).round().clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    return ImageSet("digits", x, torch.from_numpy(labels).long(), tuple(str(i) for i in range(10)))


def load_images(name: str, split: str = "train", data_dir: str | os.PathLike | None = None, download: bool = True,
                size: int = 32) -> ImageSet:
    """``digits`` (offline; only ``split="train"``; ``size`` applies) or ``cifar10``/``cifar100``."""
    if name == "digits":
        if split != "train":
            raise ValueError(f"split: digits has only a 'train' split (use train_val_split), got {split!r}")
        return load_digits_images(size)
    if name in CIFAR:
        return load_cifar(name, split, data_dir, download)
    raise ValueError(f"name: expected one of {DATASETS}, got {name!r}")


def train_val_split(n: int, val_fraction: float = 0.3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of ``range(n)`` (the authors' 70/30 split of CIFAR train); sorted index arrays."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction: expected a value in (0, 1), got {val_fraction!r}")
    perm = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    if n_val == 0 or n_val == n:
        raise ValueError(f"n: {n} samples cannot be split with val_fraction={val_fraction}")
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def to_unit_range(images: Tensor) -> Tensor:
    """uint8 0..255 -> float32 in [-1, 1]."""
    return images.float() / 127.5 - 1.0


def from_unit_range(x: Tensor) -> Tensor:
    """float in [-1, 1] -> uint8 0..255 (clamped, rounded)."""
    return ((x.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)


class IndexSampler:
    """Batch ``step`` holds global positions ``step·B … step·B+B−1`` of an endless stream of epochs, each epoch a
    permutation seeded by ``(seed, epoch)``: the data position is the step, so resumption is exact."""

    def __init__(self, n: int, batch_size: int, seed: int = 0):
        for arg, v in (("n", n), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{arg}: expected a positive int, got {v!r}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self._perm = (-1, None)

    def indices(self, step: int) -> np.ndarray:
        pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size)
        epochs, offsets = np.divmod(pos, self.n)
        out = np.empty(self.batch_size, dtype=np.int64)
        for e in np.unique(epochs):
            if self._perm[0] != e:
                self._perm = (int(e), np.random.default_rng([self.seed, int(e)]).permutation(self.n))
            sel = epochs == e
            out[sel] = self._perm[1][offsets[sel]]
        return out

    def state_dict(self) -> dict:
        return {"kind": type(self).__name__, "n": self.n, "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise ValueError(f"sampler: checkpoint was written with {state}, this sampler is {self.state_dict()}")


def patchify(x: Tensor, p: int) -> Tensor:
    """(B, C, H, W) -> (B, H/p · W/p, p·p·C), patches in raster order, values in (p, p, C) order."""
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p)  # (B, C, gh, p, gw, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)  # (B, gh·gw, p·p·C)


def unpatchify(tokens: Tensor, channels: int, height: int, width: int, p: int) -> Tensor:
    """Inverse of :func:`patchify`."""
    B = tokens.shape[0]
    x = tokens.reshape(B, height // p, width // p, p, p, channels)  # (B, gh, gw, p, p, C)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(B, channels, height, width)


class PatchTask:
    """Masked patch reconstruction over uint8 images (see the module docstring).

    Raises:
        ValueError: images not uint8 (N, C, H, W), H or W not divisible by ``patch``, or a bad row range.
    """

    def __init__(self, images: Tensor, patch: int = 4, min_rows: int = 1, max_rows: int = 3):
        if not torch.is_tensor(images) or images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images: expected a uint8 tensor (N, C, H, W), got {getattr(images, 'dtype', images)}")
        _, C, H, W = images.shape
        if patch < 1 or H % patch or W % patch:
            raise ValueError(f"patch: expected a positive divisor of H={H} and W={W}, got {patch}")
        self.grid = (H // patch, W // patch)
        if not 1 <= min_rows <= max_rows <= self.grid[0]:
            raise ValueError(f"max_rows: expected 1 <= min_rows <= max_rows <= {self.grid[0]} patch rows, got "
                             f"{min_rows}..{max_rows}")
        self.images, self.patch, self.min_rows, self.max_rows = images, patch, min_rows, max_rows
        self.n_tokens, self.patch_dim = self.grid[0] * self.grid[1], patch * patch * C

    def __len__(self) -> int:
        return len(self.images)

    def row_masks(self, rng: np.random.Generator, n: int) -> Tensor:
        """(n, N) bool: ``min_rows``..``max_rows`` consecutive patch rows per image, at a uniform start."""
        rows = rng.integers(self.min_rows, self.max_rows + 1, size=n)
        start = rng.integers(0, self.grid[0] - rows + 1)
        r = np.arange(self.grid[0])
        hit = (r >= start[:, None]) & (r < (start + rows)[:, None])  # (n, gh)
        return torch.from_numpy(np.repeat(hit, self.grid[1], axis=1))  # (n, gh·gw), raster token order

    def make_batch(self, idx, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        targets = patchify(to_unit_range(self.images[torch.as_tensor(idx)]), self.patch)  # (B, N, P)
        return targets.masked_fill(mask[..., None], 0.0), mask, targets

    def reconstruct(self, batch: tuple[Tensor, Tensor, Tensor], pred: Tensor, paste_visible: bool = True) -> Tensor:
        """Images in [-1, 1] from predicted patches; with ``paste_visible`` only masked patches come from ``pred``
        (the visible ones are the input itself and carry no loss)."""
        _, mask, targets = batch
        tokens = torch.where(mask[..., None], pred, targets) if paste_visible else pred
        C = self.images.shape[1]
        return unpatchify(tokens, C, *self.images.shape[2:], self.patch).clamp(-1, 1)


def masked_mse_per_sample(pred: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """(B,) mean squared error over the masked patches' values of each sample."""
    err = ((pred.float() - targets.float()) ** 2).mean(-1) * mask  # (B, N)
    return err.sum(-1) / mask.sum(-1).clamp_min(1)


def masked_patch_mse(batch: tuple[Tensor, Tensor, Tensor], output) -> Tensor:
    """Training loss of the patch task: MSE over all masked patch values of the batch."""
    pred = output.logits if hasattr(output, "logits") else output
    _, mask, targets = batch
    err = ((pred.float() - targets.float()) ** 2).mean(-1)  # (B, N)
    return (err * mask).sum() / mask.sum().clamp_min(1)


class PatchSampler(IndexSampler):
    """``sampler(step) -> (inputs, mask, targets)``; masks are drawn from ``(seed, step)``."""

    def __init__(self, task: PatchTask, batch_size: int, seed: int = 0):
        super().__init__(len(task), batch_size, seed)
        self.task = task

    def __call__(self, step: int):
        rng = np.random.default_rng([self.seed, step, 1])
        return self.task.make_batch(self.indices(step), self.task.row_masks(rng, self.batch_size))


class PatchEvaluator:
    """Fixed batches in dataset order with one fixed mask per image (drawn once from ``seed``)."""

    def __init__(self, task: PatchTask, batch_size: int, seed: int = 0):
        self.task, self.batch_size = task, batch_size
        self.masks = task.row_masks(np.random.default_rng([seed, 2**31]), len(task))

    def __call__(self, limit: int | None = None):
        n = len(self.task) if limit is None else min(len(self.task), limit * self.batch_size)
        for b in range(0, n, self.batch_size):
            idx = torch.arange(b, min(n, b + self.batch_size))
            yield self.task.make_batch(idx, self.masks[idx])


class PixelTokenizer:
    """8-bit pixel tokens (see the module docstring); ``bos_id = 256``, so a model needs ``vocab_size = 257``.

    Raises:
        ValueError: unknown ``mode``; images not uint8 (N, 3, H, W); tokens of the wrong length.
    """

    vocab_size, bos_id, model_vocab_size = 256, 256, 257

    def __init__(self, mode: str = "rgb332"):
        if mode not in PIXEL_MODES:
            raise ValueError(f"mode: expected one of {PIXEL_MODES}, got {mode!r}")
        self.mode = mode

    def tokens_per_image(self, height: int, width: int) -> int:
        return height * width * (3 if self.mode == "channels" else 1)

    def encode(self, images: Tensor) -> Tensor:
        if not torch.is_tensor(images) or images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images: expected a uint8 tensor (N, 3, H, W), got {getattr(images, 'shape', images)}")
        x = images.long()
        if self.mode == "channels":
            return x.permute(0, 2, 3, 1).reshape(len(x), -1)  # (N, H·W·3), R,G,B per pixel in raster order
        if self.mode == "gray":
            y = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]  # ITU-R BT.601 luma
            return y.round().clamp(0, 255).long().flatten(1)  # (N, H·W)
        levels = torch.tensor([7, 7, 3], dtype=torch.float64).view(1, 3, 1, 1)
        q = (x * levels / 255).round().long()  # (N, 3, H, W): 3, 3, 2 bits
        return ((q[:, 0] << 5) | (q[:, 1] << 2) | q[:, 2]).flatten(1)  # (N, H·W)

    def decode(self, tokens: Tensor, height: int, width: int) -> Tensor:
        if tokens.dim() != 2 or tokens.shape[1] != self.tokens_per_image(height, width):
            raise ValueError(f"tokens: expected (N, {self.tokens_per_image(height, width)}), got "
                             f"{tuple(tokens.shape)}")
        t = tokens.long().clamp(0, 255)
        if self.mode == "channels":
            return t.reshape(-1, height, width, 3).permute(0, 3, 1, 2).to(torch.uint8).contiguous()
        t = t.reshape(-1, height, width)  # (N, H, W)
        if self.mode == "gray":
            return t.to(torch.uint8)[:, None].expand(-1, 3, -1, -1).contiguous()
        q = torch.stack([t >> 5, (t >> 2) & 7, t & 3], 1).double()  # (N, 3, H, W)
        levels = torch.tensor([7, 7, 3], dtype=torch.float64).view(1, 3, 1, 1)
        return (q * 255 / levels).round().to(torch.uint8)


def _pixel_lm_batch(tokens: Tensor, bos_id: int) -> tuple[Tensor, Tensor]:
    bos = torch.full((len(tokens), 1), bos_id, dtype=torch.long)
    return torch.cat([bos, tokens[:, :-1]], 1), tokens  # (B, T) inputs, (B, T) next-token targets


class PixelSampler(IndexSampler):
    """``sampler(step) -> (x, y)`` over pre-tokenised images ``tokens`` (N, T)."""

    def __init__(self, tokens: Tensor, batch_size: int, seed: int = 0, bos_id: int = PixelTokenizer.bos_id):
        super().__init__(len(tokens), batch_size, seed)
        self.tokens, self.bos_id = tokens.long(), bos_id

    def __call__(self, step: int):
        return _pixel_lm_batch(self.tokens[torch.from_numpy(self.indices(step))], self.bos_id)


class PixelEvaluator:
    """Fixed batches of whole images in dataset order; ``evaluator(limit)`` keeps the first ``limit`` batches."""

    def __init__(self, tokens: Tensor, batch_size: int, bos_id: int = PixelTokenizer.bos_id):
        self.tokens, self.batch_size, self.bos_id = tokens.long(), batch_size, bos_id

    def __call__(self, limit: int | None = None):
        n = len(self.tokens) if limit is None else min(len(self.tokens), limit * self.batch_size)
        for b in range(0, n, self.batch_size):
            yield _pixel_lm_batch(self.tokens[b:b + self.batch_size], self.bos_id)
