"""The generation tables' presets and run context: the model and training recipe of each preset, and the
``Context`` a cell is computed in (device, data options, scorers, output paths), which names its cells."""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...engine import TrainConfig
from ...engine.config import NEUTRAL
from ...io import atomic_write_bytes
from ...metrics import images as mi
from ...registry import resolved_options_json
from ...results import cell_id
from .data import DataOptions, ImageData, data_identity, load_data


@dataclass(frozen=True)
class Preset:
    image_datasets: tuple[str, ...]  # the defaults of Table 1 (Tables 3, 4: the first image / last text set)
    text_datasets: tuple[str, ...]
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    dropout: float  # residual, FFN and attention weights
    hidden_dims: tuple[int, ...]  # DAMCHA generator widths (Tables 1 and 4)
    depth_width: int  # Table 3: generator depth k = k − 1 hidden layers of this width + the output layer
    depths: tuple[int, ...]  # Table 3
    image_train: dict  # TrainConfig fields
    text_train: dict
    epochs: int | None  # None: the train dicts' max_steps; else epochs over the training split
    image_eval: int | None  # images scored (None: the whole validation split)
    text_eval: int | None  # text examples scored
    max_train_pairs: int | None = None
    # Pixel/text Decoder positions. Smoke: learned — unit-amplitude sinusoids swamp the Decoder's N(0, 0.02) token
    # embeddings and a 150-step byte model stays at the unigram plateau (3.12 vs 2.62 nats/token, concept task).
    decoder_positions: str = "sinusoidal"
    # Fractions of max_steps at which a final cell's held-out metric is read at its best validation checkpoint so far
    # (the same run seen at smaller budgets: does the answer move with training?); () for none.
    budget_fracs: tuple[float, ...] = ()


_COMMON = dict(weight_decay=0.0, beta2=0.999, grad_clip=1.0, warmup_steps=0)  # the authors: Adam(W), wd 0, clip 1
PRESETS = {
    "smoke": Preset(("digits",), ("concepts",), d_model=64, n_layers=2, n_heads=8, d_ff=128, dropout=0.0,
                    hidden_dims=(128, 256), depth_width=128, depths=(1, 2, 3),
                    image_train=dict(_COMMON, max_steps=150, batch_size=32, lr=2e-3, min_lr_ratio=0.01,
                                     warmup_steps=10, log_every=10, eval_max_batches=2, ckpt_every=50),
                    text_train=dict(_COMMON, max_steps=150, batch_size=16, lr=2e-3, min_lr_ratio=0.1,
                                    warmup_steps=10, log_every=10, eval_max_batches=2, ckpt_every=50),
                    epochs=None, image_eval=64, text_eval=64, decoder_positions="learned"),
    # The compact repo config (docs/experiments.md §1), 50 epochs; CV: AdamW 3e-4 cosine to 0.01·lr, batch 64, the first
    # 51 validation batches; text: Adam(W, wd 0) at 3e-4, batch 32, whole validation split, WMT's first 100k pairs.
    # Trained to a validation plateau (early stopping, patience in steps) on the smoke tasks, every arm tuned on one
    # grid (generation.decide), scored on the half of the validation split that selection never reads.
    "decide": Preset(("digits",), ("concepts",), d_model=64, n_layers=2, n_heads=8, d_ff=128, dropout=0.0,
                     hidden_dims=(128, 256), depth_width=128, depths=(1, 2, 3),
                     image_train=dict(_COMMON, max_steps=1000, batch_size=32, lr=2e-3, min_lr_ratio=0.01,
                                      warmup_steps=50, log_every=50, eval_every=50, eval_max_batches=4,
                                      ckpt_every=250, patience=250),
                     text_train=dict(_COMMON, max_steps=1000, batch_size=16, lr=2e-3, min_lr_ratio=0.1,
                                     warmup_steps=50, log_every=50, eval_every=50, eval_max_batches=4,
                                     ckpt_every=250, patience=250),
                     epochs=None, image_eval=64, text_eval=64, decoder_positions="learned"),
    "paper": Preset(("cifar10", "cifar100"), ("wmt14", "commongen"), d_model=128, n_layers=4, n_heads=8, d_ff=256,
                    dropout=0.1, hidden_dims=(256, 512), depth_width=256, depths=tuple(range(1, 10)),
                    image_train=dict(_COMMON, batch_size=64, lr=3e-4, min_lr_ratio=0.01, log_every=50),
                    text_train=dict(_COMMON, batch_size=32, lr=3e-4, min_lr_ratio=1.0, log_every=50),
                    epochs=50, image_eval=51 * 64, text_eval=None, max_train_pairs=100_000),
}


def cell_name(cell: dict, inference: str = "") -> str:
    """``<dataset>-<variant>-<flavor>-<setting>[-<inference>]-s<seed>-<hash of the cell key>``."""
    parts = (cell["dataset"], cell["variant"], cell["flavor"], cell["setting"], inference, f"s{cell['seed']}",
             hashlib.sha1(cell_id(cell).encode()).hexdigest()[:8])
    return "-".join(p for p in parts if p)


@dataclass
class Context:
    """Everything a cell needs besides its own key: preset, device, data options, scorers, output paths."""

    name: str
    preset_name: str
    out: Path
    device: torch.device
    data: DataOptions
    extractor: str
    train_overrides: dict  # TrainConfig fields over the preset's (``--train``, ``--steps``)
    quiet: bool
    keep_checkpoints: bool
    bart_path: str | None
    fresh: bool = False  # --fresh: every cell trains from scratch, never from a kept checkpoint
    ensemble: bool = False  # --ensemble: one arm's cells of one phase train as one grouped model (ensemble_units)

    @property
    def preset(self) -> Preset:
        return PRESETS[self.preset_name]

    def train_config(self, data) -> TrainConfig:
        base = dict(self.preset.image_train if data.kind == "image" else self.preset.text_train)
        if self.preset.epochs:
            per_epoch = math.ceil(data.n_train / base["batch_size"])
            base.update(max_steps=self.preset.epochs * per_epoch, eval_every=per_epoch, ckpt_every=per_epoch)
        base.update(self.train_overrides)
        return TrainConfig.from_dict(base)

    def cell(self, dataset: str, variant: str, flavor: str, setting: str, seed: int) -> dict:
        """The ResultStore key: what was run and with which configuration (hashed), so reruns skip it."""
        data = load_data(dataset, self.data)
        model = {k: v for k, v in asdict(self.preset).items() if not k.endswith(("_train", "_datasets", "depths"))}
        train = {k: v for k, v in self.train_config(data).to_dict().items()  # a later field at its neutral value
                 if k not in ("stop_at", "handle_signals") and not (k in NEUTRAL and v == NEUTRAL[k])}  # keeps keys
        conf = {"model": model, "train": train, "data": data_identity(self.data)}  # run control is not part of a cell
        return {"experiment": self.name, "preset": self.preset_name, "dataset": dataset, "task": data.task,
                "variant": variant, "flavor": flavor, "setting": setting, "seed": seed,
                "attention_options": resolved_options_json(variant, {"flavor": flavor}),
                "steps": conf["train"]["max_steps"], "eval_samples": len(data.eval_set),
                "extractor": self.extractor if data.kind == "image" else None,
                "config": hashlib.sha1(json.dumps(conf, sort_keys=True, default=str).encode()).hexdigest()[:10]}

    def run_dir(self, cell: dict) -> Path:
        return self.out / "_cache" / "runs" / cell_name(cell)

    def original_features(self, data: ImageData) -> Tensor:
        """Features of the scored originals, computed once and cached under ``_cache/features``."""
        key = hashlib.sha1(json.dumps([data.name, data_identity(self.data), self.extractor]).encode()).hexdigest()[:12]
        path = self.out / "_cache" / "features" / f"{key}.pt"
        if not path.is_file():
            buf = io.BytesIO()
            torch.save(mi.extract_features(data.eval_images, self.extractor, device=str(self.device)), buf)
            atomic_write_bytes(path, buf.getvalue())
        return torch.load(path, weights_only=True)
