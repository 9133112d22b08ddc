"""DDP plumbing: process group from torchrun's environment (gloo on CPU, nccl on CUDA), rank helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..envinfo import resolve_device


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto") -> DistInfo:
    """Single process unless torchrun set ``WORLD_SIZE`` > 1; then join the process group (idempotent).

    Under torchrun with CUDA each rank takes ``cuda:LOCAL_RANK``.

    Raises:
        ValueError: an unknown device, or cuda requested without a GPU.
    """
    dev = resolve_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=dev)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world, local_rank, dev)


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_distributed(device: str, fn: Callable[[DistInfo], int]) -> int:
    """``fn(info)`` inside the process group (initialised from torchrun's environment; a single process otherwise),
    which is destroyed afterwards whatever happens."""
    info = init_distributed(device)
    try:
        return fn(info)
    finally:
        cleanup_distributed()


def all_reduce(t: torch.Tensor, info: DistInfo, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if info.distributed:
        dist.all_reduce(t, op=op)
    return t


def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank (e.g. a decision only rank 0 can make)."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj, info: DistInfo) -> list:
    if not info.distributed:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def param_sync_diff(model: torch.nn.Module, info: DistInfo) -> float:
    """Max |difference| between rank r and rank 0 of per-parameter float64 sums and sums of squares (0.0 when the
    replicas agree)."""
    sums = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                        for p in model.parameters()]).cpu()
    gathered = all_gather_object(sums, info)
    return max(float((g - gathered[0]).abs().max()) for g in gathered)
