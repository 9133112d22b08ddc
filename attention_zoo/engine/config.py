"""The training configuration: a small validated dataclass (nanoGPT style), saved whole in every checkpoint."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

AMP_MODES = ("auto", "off", "bf16")


# Fields that steer a run (when to stop, checkpoint, log, show progress) without changing its numbers: resume is
# bit-exact, so they are left out of a result cell's identity.
RUN_CONTROL = ("stop_at", "handle_signals", "progress", "ckpt_every", "keep_last", "log_every")


# Fields added after stores were written, with the value that reproduces the runs before them: left out of a cell's
# identity at that value, so those stores keep their keys.
NEUTRAL = {"patience": 0, "compile": False, "min_delta": 0.0}


def result_identity(train: dict) -> dict:
    """The training settings that can change a result: ``train`` (a TrainConfig dict or overrides) without the
    run-control fields (and without a later field at its neutral value)."""
    return {k: v for k, v in train.items()
            if k not in RUN_CONTROL and not (k in NEUTRAL and v == NEUTRAL[k])}


@dataclass
class TrainConfig:
    """Everything the loop needs besides the model and the data.

    ``batch_size`` is the *global* number of sequences per optimizer step: it is split over the ranks (DDP) and
    then over ``grad_accum`` micro-batches, so the optimisation does not depend on how many processes run it.

    Raises:
        ValueError: a field out of range or of the wrong type (the message starts with the field name).
    """

    max_steps: int = 1000  # optimizer steps; the cosine schedule spans them
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    warmup_steps: int = 100  # linear warm-up from lr/warmup_steps
    weight_decay: float = 0.1  # AdamW, matrices only (biases, norms and 1-D parameters are not decayed)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is still recorded)
    amp: str = "auto"  # auto: bf16 autocast on CUDA, off on CPU
    log_every: int = 10  # JSONL train rows every N steps (NaN/inf is checked every step regardless)
    eval_every: int = 0  # 0: evaluate only at the end
    # early stopping: stop once this many steps have passed since the best evaluation (0: never; needs eval_every)
    patience: int = 0
    # early stopping's plateau: an evaluation resets the patience only when it beats the best by more than this
    # fraction of it (0: any improvement does); the best checkpoint is the lowest evaluation either way
    min_delta: float = 0.0
    eval_max_batches: int | None = None  # cap for the periodic evaluations (None: whole eval sets)
    ckpt_every: int = 0  # 0: checkpoint only at the end, on a signal and on NaN
    keep_last: int = 2  # step checkpoints kept besides best.pt
    seed: int = 0  # dropout/RNG stream of the loop (rank r uses seed + r); data order is the sampler's seed
    stop_at: int | None = None  # stop (checkpoint, status "interrupted") after this step, as a preemption would
    find_unused_parameters: bool | None = None  # DDP; None: on when a module declares data_dependent_compute
    handle_signals: bool = True  # SIGTERM/SIGINT -> checkpoint and stop cleanly (main thread only)
    progress: bool = True  # tqdm bar on rank 0
    compile: bool = False  # torch.compile the training forward (engine.compiled; eager where it cannot, with why)

    def __post_init__(self):
        ints = {"max_steps": 1, "batch_size": 1, "grad_accum": 1, "warmup_steps": 0, "log_every": 1,
                "eval_every": 0, "patience": 0, "ckpt_every": 0, "keep_last": 1, "seed": 0}
        for name, lo in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")
        if self.seed >= 2**32:
            raise ValueError(f"seed: expected an int in [0, 2**32), got {self.seed}")
        for name in ("eval_max_batches", "stop_at"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name}: expected None or an int >= 1, got {v!r}")
        for name, lo, hi in (("lr", 0.0, math.inf), ("min_lr_ratio", 0.0, 1.0), ("weight_decay", 0.0, math.inf),
                             ("min_delta", 0.0, 1.0),
                             ("beta1", 0.0, 1.0), ("beta2", 0.0, 1.0), ("grad_clip", 0.0, math.inf)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi) or math.isnan(v):
                raise ValueError(f"{name}: expected a number in [{lo}, {hi}], got {v!r}")
        if self.lr == 0:
            raise ValueError("lr: expected a positive learning rate, got 0")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile: expected a bool, got {self.compile!r}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp: expected one of {AMP_MODES}, got {self.amp!r}")
        if self.patience and not self.eval_every:
            raise ValueError(f"patience: early stopping after {self.patience} steps needs eval_every > 0")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size: {self.batch_size} is not divisible by grad_accum={self.grad_accum}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict, rejecting unknown keys (a typo must not silently fall back to a default)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def replace(self, **changes) -> TrainConfig:
        return TrainConfig.from_dict({**self.to_dict(), **changes})


def parse_overrides(items: list[str]) -> dict:
    """``["lr=1e-3", "amp=off", "stop_at=None"]`` -> typed dict, each value cast to its field's default type.

    Raises:
        ValueError: an item without ``=``, an unknown key, or a value that does not parse as the field's type.
    """
    defaults = TrainConfig().to_dict()
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep:
            raise ValueError(f"overrides: expected key=value, got {item!r}")
        if key not in defaults:
            raise ValueError(f"overrides: unknown key {key!r}; known: {', '.join(sorted(defaults))}")
        out[key] = _cast(key, raw.strip(), defaults[key])
    return out


def _cast(key: str, raw: str, default):
    if raw.lower() == "none":
        return None
    if isinstance(default, bool) or key in ("find_unused_parameters", "handle_signals", "progress", "compile"):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{key}: expected true/false, got {raw!r}")
    kind = int if isinstance(default, int) or key in ("eval_max_batches", "stop_at") else type(default)
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{key}: expected {kind.__name__}, got {raw!r}") from None
