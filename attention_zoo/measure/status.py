"""Out-of-memory and failure handling for sweeps: an OOM never aborts a sweep (docs/conventions.md §6)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

_ALLOC_FAILURE = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate",
                  "allocation failed", "std::bad_alloc")


def is_oom(exc: BaseException) -> bool:
    """CUDA OOM, MemoryError, or a RuntimeError whose message reports a failed allocation."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _ALLOC_FAILURE)


def free_memory(device: torch.device | str | None = None) -> None:
    """gc, then release the CUDA cache (after dropping references to the failed step's tensors)."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.empty_cache()


def short_message(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


def guarded(fn: Callable[[], dict], device: torch.device | str | None = None) -> dict:
    """Run ``fn() -> dict`` and return it with ``status="ok"``; an OOM returns ``{"status": "oom", "message"}``.

    Only allocation failures are caught: any other error propagates (a bug is not a sweep result).
    """
    msg = None
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - filtered by is_oom below
        if not is_oom(exc):
            raise
        msg = short_message(exc)
    if msg is not None:  # outside the except block, so the traceback no longer pins the step's tensors
        free_memory(device)
        return {"status": "oom", "message": msg}
    return {"status": "ok", "message": "", **out}
