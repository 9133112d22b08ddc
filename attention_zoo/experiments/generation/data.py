"""The generation tables' data (Tables 1, 3, 4; docs/experiments.md §2): the image and text sets, prepared for the
patch, pixel or text task, with their samplers and evaluation batches (``training``'s docstring says how)."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from ...data import image_tasks as dt
from ...data import images as di
from ...data import seq2seq as s2s
from ...engine import lm_loss

IMAGE_SETS, TEXT_SETS = ("digits", "cifar10", "cifar100"), ("concepts", "wmt14", "commongen")
TEXT_LENGTHS = {"concepts": (64, 96), "wmt14": (128, 128), "commongen": (64, 64)}  # (source, target) max tokens
AUTHOR_TOKENIZERS = {"wmt14": "bert-base-multilingual-cased", "commongen": "facebook/bart-base"}
BYTES_PER_TOKEN = 4  # real text through the byte tokenizer: the authors' subword lengths × 4


@dataclass(frozen=True)
class DataOptions:
    image_task: str = "patch"  # or "pixel"
    pixel_mode: str = "rgb332"
    image_size: int = 32  # digits only
    tokenizer: str = "auto"  # bytes | a local HF tokenizer | auto: the authors' where available offline, else bytes
    data_dir: str | None = None
    download: bool = True
    max_train_pairs: int | None = None
    image_eval: int | None = 100
    text_eval: int | None = 64
    # decide: the validation split's first part selects (val_loss, early stopping, tuning), the rest is scored (a
    # test split of its own); False: both read the whole split, as the authors' protocol does
    scored_holdout: bool = False
    scored_fraction: float | None = None  # with scored_holdout: the scored share of the validation split (None: ½)
    max_val: int | None = None  # at most this many validation items in each part (None: all; behaviour probes)


# Options that name a cell's data only where set (not at their default), so earlier cells keep their keys.
_WHERE_SET = ("scored_holdout", "scored_fraction", "max_val")


def data_identity(o: DataOptions) -> dict:
    """The options that name a cell's data (``_WHERE_SET`` only where set, so earlier cells keep their keys)."""
    return {k: v for k, v in asdict(o).items() if k not in _WHERE_SET or v}


def _halves(items, holdout: bool, fraction: float | None = None, limit: int | None = None):
    """(selection part, scored part) of a validation split (see ``DataOptions.scored_holdout``): with ``holdout``
    the scored part is its last ``fraction`` (½ by default); each part cut to ``limit`` items where given."""
    if holdout:
        cut = len(items) - round(len(items) * (0.5 if fraction is None else fraction))
        sel, scored = items[:cut], items[cut:]
    else:
        sel = scored = items
    return (sel, scored) if limit is None else (sel[:limit], scored[:limit])


class ImageData:
    """A seeded 70/30 split of an image set's train split, prepared for the patch or the pixel task."""

    kind = "image"

    def __init__(self, name: str, o: DataOptions):
        full = di.load_images(name, "train", o.data_dir, o.download, o.image_size)
        tr, va = (torch.from_numpy(i) for i in di.train_val_split(len(full), 0.3, seed=0))
        train_imgs, (val, scored) = full.images[tr], _halves(full.images[va], o.scored_holdout, o.scored_fraction,
                                                             o.max_val)
        self.name, self.task, self.n_train = name, o.image_task, len(train_imgs)
        self.eval_images = scored[: o.image_eval]  # what the generative metrics (FID, Top-50) score
        if self.task == "patch":
            self.train_set, self.val_set, self.eval_set, self.heldout_set = (
                dt.PatchTask(x, 4, 1, min(3, x.shape[2] // 4)) for x in (train_imgs, val, self.eval_images, scored))
            self.patch_dim, self.n_tokens, self.loss_fn = self.train_set.patch_dim, self.train_set.n_tokens, \
                dt.masked_patch_mse
        else:
            self.tok = dt.PixelTokenizer(o.pixel_mode)
            self.train_set, self.val_set, self.eval_set, self.heldout_set = (
                self.tok.encode(x) for x in (train_imgs, val, self.eval_images, scored))
            self.vocab_size, self.seq_len, self.loss_fn = self.tok.model_vocab_size, self.train_set.shape[1], lm_loss
            self.eval_images = self.tok.decode(self.eval_set, *val.shape[2:])  # what the tokens can represent

    def sampler(self, batch: int, seed: int):
        return (dt.PatchSampler if self.task == "patch" else dt.PixelSampler)(self.train_set, batch, seed)

    def batches(self, split: str, batch: int):
        """``val`` (selection), ``eval`` (the generative metrics' samples) or ``heldout`` (every scored item)."""
        data = {"val": self.val_set, "eval": self.eval_set, "heldout": self.heldout_set}[split]
        return dt.PatchEvaluator(data, batch) if self.task == "patch" else dt.PixelEvaluator(data, batch)


class TextData:
    """Source/target pairs packed for a decoder; the loss is ``lm_loss``, which skips IGNORE_INDEX targets."""

    kind, task, loss_fn = "text", "text", staticmethod(lm_loss)

    def __init__(self, name: str, o: DataOptions):
        data = s2s.load_seq2seq(name, o.data_dir, 0, o.max_train_pairs)
        want = AUTHOR_TOKENIZERS.get(name, "bytes") if o.tokenizer == "auto" else o.tokenizer
        try:
            self.tok = s2s.load_tokenizer(want)
        except FileNotFoundError:
            if o.tokenizer != "auto":
                raise
            self.tok = s2s.ByteTokenizer()
        scale = BYTES_PER_TOKEN if isinstance(self.tok, s2s.ByteTokenizer) and name != "concepts" else 1
        src_len, self.max_new_tokens = (n * scale for n in TEXT_LENGTHS[name])
        self.name, self.vocab_size, self.seq_len = name, self.tok.vocab_size, src_len + self.max_new_tokens + 3
        val, scored = _halves(data.splits["val"], o.scored_holdout, o.scored_fraction, o.max_val)
        self.train_set, self.val_set, self.heldout_set = (s2s.encode_pairs(s, self.tok, src_len, self.max_new_tokens)
                                                          for s in (data.splits["train"], val, scored))
        self.eval_set, self.eval_pairs, self.n_train = (self.heldout_set[: o.text_eval], scored[: o.text_eval],
                                                        len(self.train_set))

    def sampler(self, batch: int, seed: int):
        return s2s.Seq2SeqSampler(self.train_set, self.tok, batch, seed)

    def batches(self, split: str, batch: int):
        """``val`` (selection), ``eval`` (the generative metrics' samples) or ``heldout`` (every scored item)."""
        data = {"val": self.val_set, "eval": self.eval_set, "heldout": self.heldout_set}[split]
        return s2s.Seq2SeqEvaluator(data, self.tok, batch)


@functools.lru_cache(maxsize=8)
def load_data(name: str, opts: DataOptions) -> ImageData | TextData:
    """Raises ValueError for a dataset that is neither an image nor a text set (loaders raise their own errors)."""
    if name in IMAGE_SETS + TEXT_SETS:
        return (ImageData if name in IMAGE_SETS else TextData)(name, opts)
    raise ValueError(f"datasets: {name!r} is not one of {', '.join(IMAGE_SETS + TEXT_SETS)}")
