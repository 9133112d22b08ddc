"""Image sets of Table 1 and Table 6 (docs/experiments.md §2): digits and CIFAR, checked before use.

Sets (``load_images``), all as uint8 ``[N, 3, H, W]`` tensors:
- **cifar10 / cifar100**: the python-pickle archives of https://www.cs.toronto.edu/~kriz/, MD5-checked (the values
  torchvision's ``CIFAR10``/``CIFAR100`` publish), extracted once into ``<data_dir>/cifar-10-batches-py`` (or
  ``cifar-100-python``). ``data_dir`` is the argument, else ``$ATTENTION_ZOO_DATA``, else
  ``~/.cache/attention_zoo/data``; an archive or extracted folder already there is used without the network.
- **digits** (offline default): scikit-learn's 1,797 8×8 digits (values 0..16), bilinearly upscaled to ¾ of
  ``size`` and zero-padded to ``size``×``size`` (default 32: a 24×24 digit in a 4-pixel black border, so the tasks
  have CIFAR's shapes), scaled to 0..255 (ink bright), grey replicated to RGB. Only a "train" split: the authors'
  protocol splits it 70/30 with :func:`train_val_split` like CIFAR's train set.

The two image tasks of Table 1 (patch and pixel) are in ``data/image_tasks.py``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from . import fetch
from .fetch import DatasetError, DatasetNotFoundError, md5_file
from .text import DATA_ENV, resolve_data_dir

DATASETS = ("digits", "cifar10", "cifar100")


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
        by_hand = f"download {url} into {root}/ (or set ${DATA_ENV} / --data-dir to the directory holding it)"
        if not download:
            raise DatasetNotFoundError(f"{name}: neither {root / spec.folder} nor {archive} exists; {by_hand}, or "
                                       "allow the download")
        fetch.refuse_in_dry_run(name, f"download {url} into {root}/ and extract it")
        try:
            fetch.download(url, archive, md5=md5)
        except DatasetError as exc:  # e.g. no network: say what to do, as without the download
            raise DatasetError(f"{name}: {exc}; to get it by hand: {by_hand}") from exc
    elif (got := md5_file(archive)) != md5:
        raise DatasetError(f"{archive}: MD5 mismatch (expected {md5}, got {got}); delete it and download {url} again")
    fetch.refuse_in_dry_run(name, f"extract {archive} into {root / spec.folder}")
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
