"""Table 6's presets: the model, the data set and the DeiT-style recipe of each (``table6_vit`` trains them,
``table6_data`` loads their images)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...data.imagefolder import Mixup


@dataclass(frozen=True)
class Preset:
    dataset: str  # imagenet | cifar10 | digits
    image_size: int
    patch_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    dropout: float
    epochs: tuple[int, ...]
    batch_size: int
    lr: float  # at lr_ref_batch images per step, scaled linearly with the batch (DeiT: 5e-4 per 512)
    lr_ref_batch: int
    min_lr: float  # cosine floor
    warmup_epochs: float
    label_smoothing: float
    mixup: Mixup | None = None
    augment: dict = field(default_factory=dict)  # train_transform kwargs (imagenet) or pad/flip (in-memory sets)
    eval_every_epochs: int = 1
    eval_max_batches: int | None = None  # periodic evaluations (the final one uses the whole split)
    eval_batch_size: int = 256
    ckpt_every_epochs: int = 0
    threads: int | None = None  # torch CPU threads unless --threads is given (None: torch's choice)
    attention_options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)  # other TrainConfig fields


PRESETS = {
    "smoke": Preset("digits", 16, 4, 64, 2, 4, 128, 0.0, epochs=(8,), batch_size=64, lr=2e-3, lr_ref_batch=64,
                    min_lr=1e-4, warmup_epochs=1, label_smoothing=0.1,
                    eval_every_epochs=2, attention_options={"hidden_dims": (64, 64)}, threads=1,
                    train=dict(weight_decay=0.05, beta2=0.999, grad_clip=1.0, log_every=5)),
    # smoke's model and recipe on the digits, to a validation plateau: a validation split is carved from the training
    # images (VAL_HOLDOUT in table6_vit) for early stopping and tuning, the smoke's 30 % stays the test split.
    "decide": Preset("digits", 16, 4, 64, 2, 4, 128, 0.0, epochs=(100,), batch_size=64, lr=2e-3, lr_ref_batch=64,
                     min_lr=1e-4, warmup_epochs=1, label_smoothing=0.1, eval_every_epochs=1,
                     attention_options={"hidden_dims": (64, 64)}, threads=1,
                     train=dict(weight_decay=0.05, beta2=0.999, grad_clip=1.0, log_every=15)),
    "cifar10": Preset("cifar10", 32, 4, 256, 6, 8, 512, 0.1, epochs=(100,), batch_size=128, lr=5e-4,
                      lr_ref_batch=128, min_lr=1e-5, warmup_epochs=5, label_smoothing=0.1,
                      augment={"pad": 4, "flip": True}, eval_every_epochs=5, eval_max_batches=10, ckpt_every_epochs=5,
                      train=dict(weight_decay=0.05, beta2=0.999, grad_clip=1.0, log_every=50)),
    "paper": Preset("imagenet", 224, 16, 768, 12, 12, 3072, 0.1, epochs=(100, 500), batch_size=1024, lr=5e-4,
                    lr_ref_batch=512, min_lr=1e-5, warmup_epochs=5, label_smoothing=0.1, mixup=Mixup(0.8, 1.0),
                    augment={"randaugment": (2, 9), "random_erasing": 0.25}, eval_every_epochs=10,
                    eval_max_batches=20, ckpt_every_epochs=1,
                    train=dict(weight_decay=0.05, beta2=0.999, grad_clip=0.0, log_every=100)),
}
