"""Table 6's presets: the model, the data set and the DeiT-style recipe of each (``table6_vit`` trains them,
``table6_data`` loads their images)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...data.imagefolder import Mixup
from ..tuning import Tuning


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


# The decide preset's arms, grid, validation split, patience and budget fractions (``table6_vit`` runs them).
DEFAULT_VARIANTS = ("mha", "dcmha", "damcha")
DECIDE_ARMS = ("mha", "dcmha", "damcha", "mha_pm", "mha_ctx", "damcha_bm")
TUNING = {"decide": Tuning(lrs=(1e-3, 2e-3, 4e-3), weight_decays=(0.05, 0.2), tune_seeds=(1000, 1001),
                           seeds=tuple(range(10)), shared={"lr": 2e-3, "weight_decay": 0.05})}
VAL_HOLDOUT = {"decide": 0.2}  # of the training images: the tuned presets' validation split
PATIENCE_EPOCHS = {"decide": 10}  # early stopping, in epochs of steps since the best validation loss
# Fractions of a final cell's step budget at which its test top-1 is read at the best validation checkpoint so far
# (the same run seen at smaller budgets); 1.0 is the run's own result.
BUDGET_FRACS = {"decide": (0.125, 0.25, 0.5, 1.0)}
# Presets whose seeds train as grouped models by default (``experiments.ensemble_units``; ``--ensemble`` /
# ``--no-ensemble`` override): empty until the decide preset is rerun with it.
ENSEMBLE: frozenset[str] = frozenset()
