"""Table 5's presets: the model, data and recipe of each, and the decide preset's arms and tuning grid
(``table5_gpt2`` trains them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tuning import Tuning

PAPER_DATASETS = ("enwik8", "text8", "mix")

DEFAULT_VARIANTS = ("mha", "dcmha", "damcha")


@dataclass(frozen=True)
class Preset:
    datasets: tuple[str, ...]
    n_layers: int
    d_model: int
    n_heads: int
    context: int
    dropout: float
    train: dict
    attention_options: dict = field(default_factory=dict)
    eval_batch_size: int = 32
    eval_stride: int | None = None  # None: non-overlapping windows (stride = context)
    final_eval_batches: int | None = None  # None: the whole validation and test splits
    threads: int | None = None  # CPU threads when --threads is not given (None: torch's default)


PRESETS = {
    "smoke": Preset(("shakespeare",), n_layers=2, d_model=64, n_heads=4, context=64, dropout=0.0,
                    train=dict(max_steps=300, batch_size=16, lr=2e-3, warmup_steps=30, weight_decay=0.1,
                               grad_clip=1.0, log_every=10, eval_every=100, eval_max_batches=2, ckpt_every=100),
                    attention_options={"hidden_dims": (128, 128), "compact_rank": 4}, eval_batch_size=64,
                    final_eval_batches=8, threads=1),
    "decide": Preset(("shakespeare",), n_layers=2, d_model=64, n_heads=4, context=64, dropout=0.0,
                     train=dict(max_steps=5000, batch_size=16, lr=2e-3, warmup_steps=100, weight_decay=0.1,
                                grad_clip=1.0, log_every=50, eval_every=100, eval_max_batches=8, patience=500,
                                ckpt_every=500),
                     attention_options={"hidden_dims": (128, 128), "compact_rank": 4}, eval_batch_size=64,
                     final_eval_batches=None, threads=1),
    "paper": Preset(PAPER_DATASETS, n_layers=12, d_model=768, n_heads=12, context=512, dropout=0.1,
                    train=dict(max_steps=100_000, batch_size=32, lr=2.5e-4, warmup_steps=2000, weight_decay=0.1,
                               grad_clip=0.25, log_every=50, eval_every=2000, eval_max_batches=50, ckpt_every=1000),
                    attention_options={"hidden_dims": (1536, 1536), "compact_rank": 4}, eval_batch_size=16),
}


# The decide preset's arms and grid, sized in table5_gpt2's docstring. On the first grid (lr 1e-3..4e-3 × wd 0.01,
# 0.1; 3,000 steps) every arm chose the corner 4e-3 / 0.1 and was still improving at its last step, so the grid moved
# up around that corner and the budget grew to 5,000 steps.
DECIDE_ARMS = "mha,dcmha,damcha,mha_pm,mha_ctx,damcha_bm"
TUNING = {"decide": Tuning(lrs=(2e-3, 4e-3, 8e-3), weight_decays=(0.1, 0.3), tune_seeds=(1000, 1001),
                           seeds=tuple(range(10)), shared=None)}
# Presets whose seeds train as grouped models by default (``experiments.ensemble_units``; ``--ensemble`` /
# ``--no-ensemble`` override): empty until the decide presets are rerun with it.
ENSEMBLE: frozenset[str] = frozenset()
# Fractions of max_steps at which a final cell's test loss is read at the best validation checkpoint so far (the same
# run seen at smaller budgets: does the answer move with training?); 1.0 is the run's own result.
BUDGET_FRACS = {"decide": (0.125, 0.25, 0.5, 1.0)}
