"""How many kernels a step launches, and whether it waits on the device: counted without a GPU.

A fwd+bwd step is run on the meta device (shapes only, nothing computed) under a dispatch mode that sees every
ATen op: the number of non-view ops is the number of kernels an accelerator would launch (the CPU paths that
only exist for CPU tensors — native kernels, host-side mask checks — are not taken there), and
``aten::_local_scalar_dense`` is what ``.item()``, ``.tolist()`` and ``int(tensor)`` call: a host synchronisation.
At small shapes a GPU step is bound by launches, so a variant whose step issues many times MHA's ops measures its
launch overhead, not its mechanism. Parameters and inputs are bfloat16 (what a GPU run uses under autocast).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .latency import step_fn
from .workload import build_workload

# Ops that return a view (or metadata) and launch no kernel.
VIEW_OPS = frozenset({
    "view", "reshape", "expand", "permute", "transpose", "t", "detach", "alias", "unsqueeze", "squeeze", "select",
    "slice", "as_strided", "split", "unbind", "chunk", "_unsafe_view", "narrow", "unflatten", "flatten",
    "split_with_sizes", "_reshape_alias", "movedim", "expand_as", "view_as", "diagonal", "unfold", "lift_fresh",
})
SYNC_OP = "_local_scalar_dense"


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_ops(spec: dict, device: torch.device | str = "meta") -> dict:
    """{"ops": non-view ATen ops of one fwd+bwd, "syncs": host synchronisations, "status", "message"} of the
    workload ``spec`` (bfloat16 unless it says float64), after one uncounted step."""
    spec = {**spec, "dtype": spec.get("dtype") if spec.get("dtype") == "float64" else "bfloat16", "amp": None}
    try:
        fn = step_fn(build_workload(spec, device), "fwd_bwd")
        fn()
        with _Count() as c:
            fn()
    except Exception as exc:  # noqa: BLE001 — a variant that cannot run there says why
        return {"ops": None, "syncs": None, "status": "error", "message": f"{type(exc).__name__}: {exc}"}
    return {"ops": sum(n for op, n in c.ops.items() if op not in VIEW_OPS), "syncs": c.ops[SYNC_OP],
            "status": "ok", "message": None}


__all__ = ["VIEW_OPS", "count_ops"]
