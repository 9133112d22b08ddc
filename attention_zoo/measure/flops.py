"""Forward FLOPs three ways, with honest units (docs/conventions.md §4, docs/environment.md §2).

- ``fwd_gflops_analytic``: the modules' own closed forms (2 FLOPs per multiply-add, dense kernels, softmax /
  masking / normalisation / elementwise excluded): every attention module's ``analytic_flops``, every
  stack-shared module's (DAMCHA's generator) once, and every other ``nn.Linear`` applied once per token.
- ``fvcore_gmacs``: fvcore ``FlopCountAnalysis``, which counts one multiply-add as one "flop", i.e. **MACs**.
  Handles are registered so that nothing our variants run is left unsupported: an SDPA handle (fvcore has
  none and would count the attention core as 0), an exact einsum handle (fvcore's own rounds 4-D patterns), an
  exact matmul handle (fvcore's undercounts a broadcast first operand), baddbmm, the handles every registered
  variant declares for its own ops (``AttentionBase.fvcore_handles``: the custom autograd Functions that trace as
  opaque ``prim::PythonOp``s, MoA's grouped expert GEMM and DAMCHA's folded generator layer), and ``None``
  (counted as 0, on purpose) for norms, softmax and elementwise / indexing / routing ops.
- ``flop_counter_gflops``: ``torch.utils.flop_counter.FlopCounterMode`` (2 per MAC) with formulas for
  ``aten._scaled_dot_product_flash_attention_for_cpu`` and ``aten._grouped_mm``, which it otherwise counts as 0
  without a warning.

Each counter is compared with the analytic count; a relative difference above ``tol`` (2 %) is flagged.
Tracing (fvcore) freezes data-dependent control flow such as top-k routing to the example input.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..registry import get_attention_spec, list_attentions
from ..variants.base import AttentionBase

# Ops that do no multiply-add work worth counting (elementwise, reductions, softmax, norms, indexing, routing,
# shape and scalar arithmetic): explicitly counted as 0 so that ``unsupported_ops()`` stays empty.
ZERO_COST_OPS = tuple(f"aten::{op}" for op in """
abs add add_ addcmul addcmul_ all amax amin any arange argmax argsort batch_norm bernoulli_ bincount bitwise_and
bitwise_not bitwise_or cat ceil chunk clamp clamp_min clamp_max clone contiguous cos cumsum detach diag_embed div div_
dropout embedding empty empty_like eq erf exp expand expand_as eye feature_dropout fill_ flatten floor_divide
full full_like gather ge gelu group_norm gt index index_add index_put_ index_select instance_norm isinf isnan
isneginf layer_norm le linalg_vector_norm log log_softmax logical_and logical_not logical_or logsumexp lt
masked_fill masked_fill_ masked_scatter max maximum mean min minimum mse_loss mul mul_ ne neg new_ones new_zeros
norm normal_ numel one_hot ones ones_like pow reciprocal relu repeat repeat_interleave reshape resolve_conj resolve_neg
rms_norm rsqrt rsub
scatter scatter_ scatter_add scatter_add_ scatter_reduce select sigmoid sign silu sin size slice softmax softplus
sort split sqrt square squeeze stack std sub sub_ sum tanh tensor_split tile topk tril triu true_divide type_as
unbind unflatten unsqueeze var view view_as where zero_ zeros zeros_like __and__ __or__ __not__ Int Float Bool
ScalarImplicit floordiv
""".split())


def _prod(shape) -> int:
    return math.prod(int(s) for s in shape)


def einsum_macs(equation: str, shapes: list[list[int]]) -> int:
    """Exact multiply-adds of an einsum contracted pairwise along numpy's optimal path."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    letters = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    if "..." in eq:  # give the broadcast axes explicit letters
        n_ell = max(len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes) if "..." in t)
        ell = "".join(letters[:n_ell])
        terms = [t.replace("...", ell[n_ell - (len(s) - len(t.replace("...", ""))):]) for t, s in zip(terms, shapes)]
        out = out.replace("...", ell)
    if not arrow:
        out = "".join(sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1))
    if len(terms) < 2:
        return 0
    sizes: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        for c, n in zip(t, s):
            sizes[c] = max(sizes.get(c, 1), int(n))
    views = [np.broadcast_to(np.zeros(()), [sizes[c] for c in t]) for t in terms]  # shapes only, no memory
    path = np.einsum_path(",".join(terms) + "->" + out, *views, optimize="optimal")[0][1:]
    ops, macs = list(terms), 0
    for step in path:
        chosen = [ops[i] for i in step]
        for i in sorted(step, reverse=True):
            ops.pop(i)
        union = "".join(sorted(set("".join(chosen))))
        if len(chosen) > 1:
            macs += _prod(sizes[c] for c in union) * (len(chosen) - 1)
        keep = "".join(c for c in union if c in out or any(c in o for o in ops))
        ops.append(keep)
    return macs


def fvcore_handles() -> dict:
    """``set_op_handle`` arguments: exact MAC handles for SDPA / einsum / matmul / baddbmm, those every registered
    variant declares for its own ops (``fvcore_handles`` on its class), 0 for the rest."""
    from fvcore.nn.jit_handles import get_shape

    def sdpa(inputs, outputs):
        q, k, v = (get_shape(i) for i in inputs[:3])
        return _prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])  # QK^T + AV

    def matmul(inputs, outputs):
        return _prod(get_shape(outputs[0])) * get_shape(inputs[0])[-1]  # exact under broadcasting

    def baddbmm(inputs, outputs):
        return _prod(get_shape(outputs[0])) * get_shape(inputs[1])[-1]

    def einsum(inputs, outputs):
        shapes = [get_shape(v) for v in inputs[1].node().inputs()]
        return einsum_macs(inputs[0].toIValue(), shapes)

    def zero(inputs, outputs):
        return 0

    # None marks an op as ignored but does not remove one of fvcore's default handles (norms): those get zero()
    handles = {op: zero if op.endswith("_norm") else None for op in ZERO_COST_OPS}
    handles.update({"aten::scaled_dot_product_attention": sdpa, "aten::matmul": matmul, "aten::mm": matmul,
                    "aten::einsum": einsum, "aten::baddbmm": baddbmm})
    for name in list_attentions():  # plugins included: whatever is registered when counting
        handles.update(get_attention_spec(name).cls.fvcore_handles())
    return handles


@dataclass
class FvcoreCount:
    macs: int
    by_op: dict[str, int]
    unsupported: dict[str, int]


@contextlib.contextmanager
def counting_mode(model: nn.Module, quiet_logger: str | None = None):
    """``model`` in eval mode for a count, every module's train/eval flag restored afterwards (a training model
    stays a training model); ``quiet_logger``: a logger held at ERROR meanwhile, its level restored too."""
    modes = [(m, m.training) for m in model.modules()]
    logger = logging.getLogger(quiet_logger) if quiet_logger else None
    level = logger.level if logger is not None else None
    try:
        model.eval()
        if logger is not None:
            logger.setLevel(logging.ERROR)
        yield model
    finally:
        for m, training in modes:
            m.training = training
        if logger is not None:
            logger.setLevel(level)


def fvcore_count(model: nn.Module, inputs: tuple) -> FvcoreCount:
    """fvcore MACs of ``model(*inputs)`` (eval mode, no grad) with ``fvcore_handles``; the model's train/eval
    modes and the ``fvcore`` logger's level are left as they were."""
    from fvcore.nn import FlopCountAnalysis

    with counting_mode(model, "fvcore"), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fca = FlopCountAnalysis(model, inputs)
        for op, handle in fvcore_handles().items():
            fca.set_op_handle(op, handle)
        fca.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
        total = int(fca.total())
        by_op = {k: int(v) for k, v in fca.by_operator().items()}
        unsupported = dict(fca.unsupported_ops())
    return FvcoreCount(total, by_op, unsupported)


def _cpu_flash_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode formula for aten._scaled_dot_product_flash_attention_for_cpu (called with shapes)."""
    return 2 * _prod(query[:-2]) * query[-2] * key[-2] * (query[-1] + value[-1])


def _grouped_mm_flops(mat_a, mat_b, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode formula for aten._grouped_mm (MoA's expert GEMM), which it otherwise counts as 0."""
    if len(mat_a) == 2 and len(mat_b) == 2:  # [K, M] x [M, N] -> [G, K, N], M split into groups: Σ_g K·M_g·N
        return 2 * mat_a[0] * mat_a[1] * mat_b[1]
    return 2 * _prod(out_shape) * mat_a[-1]  # every output element of its own group is one K-long dot product


def flop_counter_count(model: nn.Module, inputs: tuple) -> tuple[int, dict[str, int]]:
    """FlopCounterMode FLOPs (2 per MAC) of ``model(*inputs)`` in eval mode, and the per-op split; the model's
    train/eval modes are left as they were."""
    from torch.utils.flop_counter import FlopCounterMode

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops}
    if hasattr(torch.ops.aten, "_grouped_mm"):
        mapping[torch.ops.aten._grouped_mm] = _grouped_mm_flops
    with counting_mode(model), torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as fc:
        model(*inputs)
    by_op = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
    return int(fc.get_total_flops()), by_op


def analytic_parts(model: nn.Module) -> tuple[list[nn.Module], list[nn.Module], list[nn.Linear]]:
    """(attention modules, stack-shared modules, token-wise Linears outside both), each module once.

    A stack-shared module is any non-attention module with its own ``analytic_flops`` (DAMCHA's generator as
    ``stack.shared``); the walk does not descend into attention or shared modules, whose formulas cover them.
    """
    attn, shared, linears, seen = [], [], [], set()

    def walk(m: nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        if isinstance(m, AttentionBase):
            attn.append(m)
        elif callable(getattr(m, "analytic_flops", None)):
            shared.append(m)
        elif isinstance(m, nn.Linear):
            linears.append(m)
        else:
            for child in m.children():
                walk(child)

    walk(model)
    return attn, shared, linears


def analytic_flops(model: nn.Module, batch: int, seq_len: int) -> int:
    """Forward FLOPs of ``model`` on [batch, seq_len] from the modules' closed forms (see the module docstring)."""
    attn, shared, linears = analytic_parts(model)
    total = sum(m.analytic_flops(batch, seq_len) for m in attn + shared)
    return total + sum(2 * batch * seq_len * lin.in_features * lin.out_features for lin in linears)


@dataclass
class FlopReport:
    analytic: int  # FLOPs
    fvcore_macs: int | None = None
    flop_counter: int | None = None  # FLOPs
    tol: float = 0.02
    unsupported: dict[str, int] = field(default_factory=dict)
    fvcore_by_op: dict[str, int] = field(default_factory=dict)
    flop_counter_by_op: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def _rel(count: int | None, ref: int) -> float | None:
        return None if count is None or ref == 0 else (count - ref) / ref

    @property
    def fvcore_rel(self) -> float | None:
        """(2·fvcore MACs − analytic) / analytic."""
        return self._rel(None if self.fvcore_macs is None else 2 * self.fvcore_macs, self.analytic)

    @property
    def flop_counter_rel(self) -> float | None:
        return self._rel(self.flop_counter, self.analytic)

    @property
    def fvcore_agrees(self) -> bool | None:
        return None if self.fvcore_rel is None else abs(self.fvcore_rel) <= self.tol

    @property
    def flop_counter_agrees(self) -> bool | None:
        return None if self.flop_counter_rel is None else abs(self.flop_counter_rel) <= self.tol

    @property
    def message(self) -> str:
        parts = []
        for name, rel in (("fvcore (2×MACs)", self.fvcore_rel), ("FlopCounterMode", self.flop_counter_rel)):
            if rel is not None and abs(rel) > self.tol:
                parts.append(f"{name} differs from analytic by {100 * rel:+.2f}%")
        if self.unsupported:
            parts.append("fvcore unsupported ops: " + ", ".join(f"{k}×{v}" for k, v in self.unsupported.items()))
        return "; ".join(parts)

    def summary(self) -> dict:
        """The reported columns: ``fwd_gflops_analytic``, ``fvcore_gmacs``, ``flop_counter_gflops`` + flags."""
        return {"fwd_gflops_analytic": self.analytic / 1e9,
                "fvcore_gmacs": None if self.fvcore_macs is None else self.fvcore_macs / 1e9,
                "flop_counter_gflops": None if self.flop_counter is None else self.flop_counter / 1e9,
                "fvcore_agrees": self.fvcore_agrees, "flop_counter_agrees": self.flop_counter_agrees,
                "flops_message": self.message}


def count_flops(model: nn.Module, inputs: tuple, batch: int, seq_len: int, counters=("fvcore", "flop_counter"),
                tol: float = 0.02) -> FlopReport:
    """Analytic FLOPs plus the requested counters on ``model(*inputs)`` (inputs of shape [batch, seq_len, ...])."""
    unknown = sorted(set(counters) - {"fvcore", "flop_counter"})
    if unknown:
        raise ValueError(f"counters: unknown {', '.join(unknown)}; expected fvcore and/or flop_counter")
    report = FlopReport(analytic_flops(model, batch, seq_len), tol=tol)
    if "fvcore" in counters:
        fv = fvcore_count(model, inputs)
        report.fvcore_macs, report.fvcore_by_op, report.unsupported = fv.macs, fv.by_op, fv.unsupported
    if "flop_counter" in counters:
        report.flop_counter, report.flop_counter_by_op = flop_counter_count(model, inputs)
    return report
