"""The scale ladder's presets: the rungs (width × depth), the token budget per rung, the training recipe, the arms,
the tuning grid per rung and the calibration the dry run prices unrun cells with (``ladder`` trains them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..tuning import Tuning

# The eight arms: the seven variants in their original form (flavour paper) and the parameter-matched control.
ARMS = ("mha", "tha", "dcmha", "colmha", "mma", "moa", "damcha", "mha_pm")
CORE = ("mha", "dcmha", "damcha", "mha_pm")  # every rung: the arms of S.gap_trend, DC.compute and T5.mix


@dataclass(frozen=True)
class Rung:
    """One model size: ``d_model`` × ``n_layers`` with ``n_heads`` heads, and the arms it trains (None: all)."""

    d_model: int
    n_layers: int
    n_heads: int = 4
    arms: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return f"D{self.d_model}×{self.n_layers}"

    def attention_options(self) -> dict:
        """DAMCHA's generator as Table 5 scales it (w = 2d, compact rank 4), for every variant that takes them."""
        return {"hidden_dims": (2 * self.d_model, 2 * self.d_model), "compact_rank": 4}


@dataclass(frozen=True)
class Preset:
    """A ladder: its rungs, the token budget (``tokens_per_param`` × the rung's MHA parameter count, all
    parameters), the recipe shared by every rung and the evaluation cadence (``evals`` per budget, patience
    ``patience_evals`` evaluations, ``eval_max_batches`` batches of ``eval_batch_size`` windows each time)."""

    rungs: tuple[Rung, ...]
    tokens_per_param: float
    context: int = 64
    batch_size: int = 16
    dropout: float = 0.0
    warmup_frac: float = 0.03
    min_warmup: int = 10
    evals: int = 16
    patience_evals: int = 4
    eval_max_batches: int = 4
    eval_batch_size: int = 64
    eval_stride: int | None = None
    final_eval_batches: int | None = None  # None: the whole validation and test splits
    min_steps: int = 20
    train: dict = field(default_factory=lambda: dict(grad_clip=1.0, log_every=50, beta1=0.9, beta2=0.95,
                                                     min_lr_ratio=0.1))
    threads: int = 1

    def max_steps(self, mha_params: int) -> int:
        """The rung's step budget: ``tokens_per_param`` tokens per MHA parameter, in whole batches, rounded up to
        a multiple of the evaluation interval."""
        steps = max(self.min_steps, math.ceil(self.tokens_per_param * mha_params / (self.batch_size * self.context)))
        every = math.ceil(steps / self.evals)
        return math.ceil(steps / every) * every

    def schedule(self, max_steps: int) -> dict:
        """The TrainConfig fields that follow from a rung's budget."""
        every = max(1, max_steps // self.evals)
        return {"max_steps": max_steps, "batch_size": self.batch_size, "eval_every": every,
                "patience": every * self.patience_evals, "eval_max_batches": self.eval_max_batches,
                "warmup_steps": max(self.min_warmup, round(self.warmup_frac * max_steps)),
                "ckpt_every": every * 4, **self.train}


# The decide ladder (sized in ladder.py's docstring): four rungs with every arm, a fifth with the four core arms.
DECIDE_RUNGS = (Rung(32, 2), Rung(48, 2), Rung(64, 2), Rung(96, 2), Rung(128, 2, arms=CORE))
PRESETS = {
    "smoke": Preset((Rung(16, 1), Rung(24, 1), Rung(32, 1), Rung(48, 1, arms=CORE)), tokens_per_param=0.25,
                    evals=4, patience_evals=2, eval_max_batches=1, final_eval_batches=2, min_steps=60),
    "decide": Preset(DECIDE_RUNGS, tokens_per_param=20.0),
}
# The learning-rate grid of a rung: a factor-2 grid centred at 4e-3 × 64 / D (Table 5's choice at D = 64, scaled
# as 1/width), extended up to two steps past an edge its best sits on; weight decay fixed at 0.1.
LR_CENTRE, LR_WIDTH = 4e-3, 64


def tuning(preset: str, rung: Rung, seeds: tuple[int, ...]) -> Tuning:
    centre = LR_CENTRE * LR_WIDTH / rung.d_model
    return Tuning(lrs=tuple(float(f"{centre * f:.3g}") for f in (0.5, 1.0, 2.0)), weight_decays=(0.1,),
                  tune_seeds=(1000, 1001), seeds=seeds, extend=2)


FINAL_SEEDS = {"smoke": (0, 1), "decide": (0, 1, 2, 3, 4)}
BUDGET_FRACS = {"decide": (0.25, 0.5, 1.0), "smoke": (0.5, 1.0)}
ENSEMBLE = frozenset({"smoke", "decide"})  # seeds (and tuning grids) train as grouped models where the arm allows
# Milliseconds per model-step, one thread, the faster of one model at a time and a seed ensemble of five, measured
# on this machine while it was shared (load average 4-5 on 2 cores; `python -m attention_zoo.bench train --task lm
# --seeds 5`, DAMCHA hidden (128, 128)): Table 5's stored decide timings at D = 64 (idle, 2 workers) are 0.45-0.65×
# these, so pricing with them carries that margin. The dry run uses them only for cells whose arm and rung have no
# stored timing yet.
CALIBRATION_MS = {
    "mha": {32: 11.6, 48: 16.4, 64: 19.7, 96: 32.5, 128: 47.4},
    "tha": {32: 21.4, 48: 26.7, 64: 31.2, 96: 44.1, 128: 56.8},
    "dcmha": {32: 24.9, 48: 28.7, 64: 33.7, 96: 50.4, 128: 65.3},
    "colmha": {32: 16.7, 48: 21.9, 64: 28.9, 96: 42.2, 128: 60.7},
    "mma": {32: 10.9, 48: 15.9, 64: 19.9, 96: 32.5, 128: 48.8},
    "moa": {32: 18.6, 48: 23.4, 64: 29.3, 96: 43.8, 128: 61.8},
    "damcha": {32: 19.4, 48: 26.4, 64: 32.7, 96: 48.2, 128: 60.5},
    "mha_pm": {32: 28.0, 48: 35.8, 64: 39.2, 96: 50.8, 128: 61.0},
}
EVAL_SHARE = 0.15  # evaluation on top of training (periodic validation, final and budget scoring), priced as a share
