"""The project's one training loop: AdamW, warm-up + cosine, clipping, accumulation, autocast, periodic evaluation,
auxiliary losses, JSONL log, atomic checkpoints with exact resume, NaN stop, SIGTERM/SIGINT handling and DDP."""

from .checkpoint import (
    CheckpointError,
    CheckpointManager,
    discard_run,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from .config import TrainConfig, parse_overrides, result_identity
from .distributed import DistInfo, cleanup_distributed, init_distributed
from .loop import IGNORE_INDEX, TrainResult, batch_weight, evaluate, lm_loss, lr_factor, train

__all__ = ["IGNORE_INDEX", "CheckpointError", "CheckpointManager", "DistInfo", "TrainConfig", "TrainResult",
           "batch_weight", "cleanup_distributed", "discard_run", "evaluate", "init_distributed", "lm_loss",
           "load_checkpoint", "lr_factor", "parse_overrides", "prune_checkpoints", "result_identity", "save_checkpoint",
           "train"]
