"""What the training-throughput benchmark measures (``train_throughput``): its tasks, the step paths it compares and
the shape of one training step of each stand-in (the decide presets' shapes)."""

from __future__ import annotations

from dataclasses import dataclass

TASKS = ("lm", "vit")
STEP_PATHS = ("one", "ensemble", "one (compiled)")
DEFAULT_ARMS = "mha,dcmha,damcha,mha_pm,mha_ctx,damcha_bm"  # the decide presets' arms


@dataclass(frozen=True)
class Shape:
    """What one training step of a task's stand-in is."""

    task: str
    batch: int
    seq_len: int  # tokens per sequence (lm) or patches + CLS (vit)
    unit: str  # "tok" or "img"
    per_batch: int  # units per batch: tokens (B·T) or images (B)
    options: dict


SHAPES = {"lm": Shape("lm", 16, 64, "tok", 16 * 64, {"hidden_dims": (128, 128), "compact_rank": 4}),
          "vit": Shape("vit", 64, 17, "img", 64, {"hidden_dims": (64, 64)})}
PRESET_WIDTH = 64
