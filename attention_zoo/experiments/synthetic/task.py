"""What a synthetic cell trains on (Appendix I): the training protocol of a preset (``Fit``), the model, and a cell's
data (``Task``, ``task_data``), the same for every arm of a (task, setting, seed)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from torch import Tensor, nn

from ...data import synthetic as syn
from ...models import AttentionStack, StackConfig
from ...models.stack import SliceNorm
from ...registry import get_attention_spec


@dataclass(frozen=True)
class Fit:
    """The training protocol of a preset."""

    max_steps: int
    batch_size: int
    lr: float
    weight_decay: float = 0.01
    warmup: int = 0
    min_lr_ratio: float = 0.1
    eval_every: int = 0  # 0: evaluate once, at the end (no early stopping)
    patience: int = 0  # a seed stops patience × eval_every steps after its best validation score (0: never)
    budget_fracs: tuple[float, ...] = (1.0,)
    ckpt_every: int = 0  # steps between group checkpoints (0: none)

    def lr_factor(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        cos = 0.5 * (1 + math.cos(math.pi * min(step, self.max_steps) / self.max_steps))
        return warm * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cos)

    def eval_steps(self) -> set[int]:
        """Steps (1-based, after the update) at which the validation split is scored."""
        steps = {self.max_steps} | {max(1, round(f * self.max_steps)) for f in self.budget_fracs}
        if self.eval_every:
            steps |= set(range(self.eval_every, self.max_steps + 1, self.eval_every))
        return steps


class SyntheticModel(nn.Module):
    """Raw features -> attention stack -> LayerNorm -> mean over tokens -> linear head; returns (out, aux)."""

    def __init__(self, d_model: int, n_layers: int, attention: str, attention_options: dict, n_out: int):
        super().__init__()
        self.stack = AttentionStack(StackConfig(d_model=d_model, n_layers=n_layers, n_heads=syn.N_SUBSPACES,
                                                attention=attention, attention_options=attention_options))
        towers = get_attention_spec(attention).subspace_towers  # the final norm keeps the slices apart too
        self.ln_f = SliceNorm(d_model, syn.N_SUBSPACES) if towers else nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_out)

    def forward(self, x):
        h, aux = self.stack(x)  # (B, T, D)
        return self.head(self.ln_f(h).mean(1)), aux  # (B, n_out)


@dataclass(frozen=True)
class Task:
    """What defines a cell's data: the same for every arm of a (task, setting, seed)."""

    task: str
    setting: float  # λ (regression) or d_e (classification)
    n_train: int
    n_val: int
    n_test: int
    reg_d_e: int
    seq_len: int
    noise: float
    kappa: float


@lru_cache(maxsize=24)
def task_data(t: Task, seed: int) -> dict[str, Tensor]:
    """Train / val / test tensors of one seed; val is carved from the generator's training draw."""
    n = t.n_train + t.n_val
    if t.task == "regression":
        d = syn.make_regression(n, t.n_test, t.reg_d_e, t.seq_len, t.setting, t.noise, seed=seed)
    else:
        d = syn.make_classification(n, t.n_test, int(t.setting), t.seq_len, t.kappa, seed=seed)
    out = {"x_train": d.x_train[:t.n_train], "y_train": d.y_train[:t.n_train], "x_val": d.x_train[t.n_train:],
           "y_val": d.y_train[t.n_train:], "x_test": d.x_test, "y_test": d.y_test}
    if t.task == "regression":
        out["y_test_clean"] = d.y_test_clean
    else:
        out["oracle_pred"] = syn.oracle_scores(d.x_test, d.constants).argmax(1)
    return out
