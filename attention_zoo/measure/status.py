"""Out-of-memory, non-finite results and failure handling for sweeps: an OOM never aborts a sweep, and a step whose
output or loss is NaN/inf is a ``nan`` row, never an ``ok`` one (docs/conventions.md §6)."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

_ALLOC_FAILURE = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate",
                  "allocation failed", "std::bad_alloc")


class NonFiniteError(ArithmeticError):
    """A measured step produced a NaN or infinite output or loss (``check_finite``); ``guarded`` and the benchmark
    loops turn it into a ``status="nan"`` row."""


def _tensors(value):
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (tuple, list)):  # ModelOutput is a NamedTuple
        for v in value:
            yield from _tensors(v)


def check_finite(value, what: str = "output") -> None:
    """Raise NonFiniteError when a tensor in ``value`` (a tensor, a tuple/list/dict of them) holds NaN or inf.
    Called after timing, outside the timed region (it synchronises with the device)."""
    for t in _tensors(value):
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t.detach()).all()):
            raise NonFiniteError(f"non-finite {what}: NaN or inf in a {tuple(t.shape)} tensor")


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


def failure_status(exc: BaseException) -> str | None:
    """The row status of a failed step: ``oom`` for an allocation failure, ``nan`` for a non-finite result, None
    for anything else (a bug, which is not a sweep result and must propagate)."""
    return "oom" if is_oom(exc) else "nan" if isinstance(exc, NonFiniteError) else None


def guarded(fn: Callable[[], dict], device: torch.device | str | None = None) -> dict:
    """Run ``fn() -> dict`` and return it with ``status="ok"``; an OOM returns ``{"status": "oom", "message"}``, a
    NonFiniteError ``{"status": "nan", "message"}``.

    Only these are caught: any other error propagates (a bug is not a sweep result).
    """
    status = None
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - filtered by failure_status below
        status = failure_status(exc)
        if status is None:
            raise
        msg = short_message(exc)
    if status is not None:  # outside the except block, so the traceback no longer pins the step's tensors
        free_memory(device)
        return {"status": status, "message": msg}
    return {"status": "ok", "message": "", **out}
