"""``torch.compile`` of a model's training forward (``TrainConfig.compile``), with a clean fallback to eager.

Opt-in: a compiled step computes the eager values to float rounding, and it pays a compile time up front (≈25 s per
model structure on a 2-core host, less from inductor's on-disk cache) that a short run does not earn back. Measured
on one thread at the Table 5 decide shape (busy 2-core host, ms per step, eager → compiled): MHA 19.0 → 18.2,
DAMCHA 32.9 → 28.0; ``python -m attention_zoo.bench train --task lm --compile`` measures it per arm. It stays eager,
with the reason, where it cannot help: no C++ compiler on the path (inductor builds its CPU kernels with one), a
variant whose ``compile_fallback()`` says compiling is slower (MoA ``paper``: its routing breaks the graph), or a
compile that fails at the first step (then with a warning).
"""

from __future__ import annotations

import os
import shutil
import warnings

import torch
from torch import nn


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on the CPU (``$CXX``, else g++/c++/clang++ on the path), or None."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def compile_reason(model: nn.Module, device: torch.device | str = "cpu") -> str | None:
    """Why ``model``'s forward stays eager (None: it compiles)."""
    if torch.device(device).type == "cpu" and cxx_compiler() is None:
        return "no C++ compiler on the path (inductor needs one for CPU kernels)"
    for m in model.modules():
        hook = getattr(m, "compile_fallback", None)
        reason = hook() if callable(hook) else None
        if reason:
            return reason
    return None


class CompiledForward:
    """Calls ``torch.compile(model)``; if compiling fails at the first call, warns and calls ``model`` from then on.
    ``how`` says which ran ("compiled" or "eager: <why>")."""

    def __init__(self, model: nn.Module, device: torch.device | str = "cpu"):
        self.model = model
        reason = compile_reason(model, device)
        self.compiled = torch.compile(model) if reason is None else None
        self.how = "compiled" if reason is None else f"eager: {reason}"

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.model(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager model, once and for all
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            self.compiled, self.how = None, f"eager: the compile failed ({first})"
            warnings.warn(f"compile: falling back to eager ({first})", RuntimeWarning, stacklevel=2)
            return self.model(*args, **kwargs)

    def __getattr__(self, name):  # train/eval, parameters, ... reach the model
        return getattr(self.model, name)


__all__ = ["CompiledForward", "compile_reason", "cxx_compiler"]
