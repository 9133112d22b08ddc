"""A correctness gate before any timing: a speed is never reported for a variant that computes the wrong thing.

On a small shape (B = 2, T = 8, D = 32, H = 4; non-causal, and causal where the variant allows it), with the
options the benchmark will time:
1. forward + backward in float64 is finite (output, input gradient, every parameter gradient);
2. the same weights in the timed dtype (or in float32 under autocast to it, as the timed step runs) give a finite
   output, input gradient and parameter gradients, and the float64 ones within a tolerance scaled to the dtype
   (relative to the largest float64 value; the parameter gradients all together: 1e-3 in float32, 5e-2 in
   bfloat16/float16): a fast path that only goes wrong in low precision, or a kernel that reads uninitialised
   memory, is caught;
3. where the variant declares ``reference_options`` (options that select its explicit/reference path, e.g.
   DAMCHA's unfused RowSum), the default path equals the reference path in float64 to 1e-8.
Comparisons run in eval mode (no dropout or sampling), the gradient of ``y.square().mean()`` plus the variant's
auxiliary losses. A variant with data-dependent discrete decisions (MoA's top-k routing; ``AttentionBase.routing``)
runs step 2 under the float64 pass's decisions: bfloat16 rounding can swap two experts whose router logits nearly
tie, which changes which computation runs rather than showing a wrong path; how many decisions the timed dtype
flips on its own is returned as a note (``check_variant(..., notes=[])``), which the benchmarks put in the row.
"""

from __future__ import annotations

import contextlib
import copy
import sys

import torch

from ..registry import create_attention, get_attention_spec
from ..variants.base import collect_aux_losses
from .workload import private_rng

SHAPE = (2, 8, 32, 4)  # B, T, D, H
TOL = {torch.float32: 1e-3, torch.float64: 1e-10, torch.bfloat16: 5e-2, torch.float16: 5e-2}


def _run(model: torch.nn.Module, x: torch.Tensor, amp: torch.dtype | None = None
         ) -> tuple[torch.Tensor, torch.Tensor, list]:
    x = x.detach().clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=amp) if amp is not None else contextlib.nullcontext():
        y = model(x)
    aux = collect_aux_losses(model)
    loss = y.float().square().mean() + (0 if aux is None else aux)
    loss.backward()
    return y.detach().double(), x.grad.double(), [p.grad for p in model.parameters() if p.requires_grad]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).abs().max() / ref.abs().max().clamp(min=1e-12))


def check_variant(name: str, options: dict | None = None, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu", autocast: bool = False,
                  notes: list[str] | None = None) -> str | None:
    """None when ``name`` with ``options`` passes the gate (module docstring), else the reason it fails.
    ``autocast``: the low-precision run keeps float32 weights and runs under autocast to ``dtype`` (as the timed
    step does), instead of holding its weights in ``dtype``. ``notes``: a list that receives how the check
    compared where that is worth saying (a routed variant compared under the float64 pass's routing whose own
    routing differs in ``dtype``)."""
    options = dict(options or {})
    spec = get_attention_spec(name)
    with private_rng(torch.device(device)):  # seeded below: the caller's RNG stream is left as it was
        return _check(name, spec, options, dtype, device, autocast, notes if notes is not None else [])


def _routes(spec) -> bool:
    """Whether the variant makes data-dependent discrete decisions it can record and replay."""
    return callable(getattr(spec.cls, "routing", None)) and spec.cls.routing() is not None


def _routed(spec, replay=None):
    """The variant's routing record/replay context (``AttentionBase.routing``), or a null context."""
    return spec.cls.routing(replay) if _routes(spec) else contextlib.nullcontext()


def _flips(own: list, ref: list) -> tuple[int, int]:
    """(decisions that differ, decisions) between two recordings of the same calls (a decision: one token's
    ordered top-k)."""
    total = sum(int(r.reshape(-1, r.shape[-1]).shape[0]) for r in ref)
    if len(own) != len(ref) or any(a.shape != b.shape for a, b in zip(own, ref)):
        return total, total
    return sum(int((a.cpu() != b.cpu()).any(-1).sum()) for a, b in zip(own, ref)), total


def _check(name, spec, options, dtype, device, autocast, notes) -> str | None:
    B, T, D, H = SHAPE
    for causal in (False, True) if spec.causal_ok else (False,):
        where = "causal" if causal else "non-causal"
        try:
            torch.manual_seed(0)
            m64 = create_attention(name, d_model=D, n_heads=H, causal=causal, **options).double().to(device).eval()
            x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device)
            low = copy.deepcopy(m64).to(torch.float32 if autocast else dtype)  # before a forward leaves state
            free = copy.deepcopy(low) if _routes(spec) else None  # the timed dtype on its own routing
            with _routed(spec) as routes64:
                y64, g64, pgrads = _run(m64, x)
            if not (torch.isfinite(y64).all() and torch.isfinite(g64).all()
                    and all(g is None or torch.isfinite(g).all() for g in pgrads)):
                return f"{where}: non-finite output or gradient in float64"
            x_low, amp = x.to(torch.float32 if autocast else dtype), dtype if autocast else None
            tol, dname = TOL.get(dtype, 5e-2), str(dtype).split('.')[-1]
            # A routed variant runs under the float64 pass's routing decisions: rounding that flips a near tie
            # changes which computation runs, not whether the path computes it right. How many it flips is said.
            with _routed(spec, routes64 or None):
                y, g, plow = _run(low, x_low, amp)
            if routes64 and free is not None:
                with _routed(spec) as own:
                    _run(free, x_low, amp)
                flipped, total = _flips(own, routes64)
                if flipped:
                    notes.append(f"{where}: compared under the float64 pass's routing ({dname} alone routes "
                                 f"{flipped} of {total} tokens differently: near ties that rounding flips)")
            pairs = [(a, b) for a, b in zip(plow, pgrads) if a is not None and b is not None]
            bad = [what for what, t in (("output", y), ("input gradient", g)) if not torch.isfinite(t).all()]
            bad += ["parameter gradient"] if any(not torch.isfinite(a).all() for a, _ in pairs) else []
            if bad:  # the timed dtype's own gradients too: a NaN there is never timed
                return f"{where}: non-finite {' and '.join(bad)} in {dname}"
            flat = torch.zeros(1, dtype=torch.float64)  # a variant without parameters
            p = torch.cat([a.double().flatten() for a, _ in pairs]) if pairs else flat
            p64 = torch.cat([b.double().flatten() for _, b in pairs]) if pairs else flat
            for what, a, ref in (("output", y, y64), ("input gradient", g, g64), ("parameter gradients", p, p64)):
                err = _rel(a, ref)
                if not err <= tol:
                    return f"{where}: {what} in {dname} differs from float64 by {err:.2g} " \
                           f"(relative; tolerance {tol:g})"
            ref_opts = {k: v for k, v in (getattr(spec.cls, "reference_options", None) or {}).items()
                        if k in spec.options}  # a subclass (a control arm) may not take its parent's options
            if ref_opts:
                ref = create_attention(name, d_model=D, n_heads=H, causal=causal,
                                       **{**options, **ref_opts}).double().to(device).eval()
                ref.load_state_dict(m64.state_dict())
                y_ref, g_ref, _ = _run(ref, x)
                for what, a, b in (("output", y64, y_ref), ("input gradient", g64, g_ref)):
                    err = _rel(a, b)
                    if not err <= 1e-8:
                        return f"{where}: {what} differs from the reference path {ref_opts} by {err:.2g}"
        except Exception as exc:  # noqa: BLE001 — the reason is the row's message
            return f"{where}: {type(exc).__name__}: {exc}"
    return None


def announce_refusal(label: str, reason: str) -> None:
    """One stderr line naming a variant the gate refused and why; printed whatever the caller's verbosity
    (``--quiet`` hides tables, never a refusal)."""
    print(f"warning: {label}: refused by the correctness gate, no speed reported ({reason})", file=sys.stderr)


def gate_status(reason: str) -> str:
    """The row status of a gate failure: ``nan`` (non-finite values), ``incorrect`` (finite but wrong values) or
    ``error`` (the variant raised)."""
    if "non-finite" in reason:
        return "nan"
    return "incorrect" if " differs " in reason else "error"


__all__ = ["announce_refusal", "check_variant", "gate_status"]
