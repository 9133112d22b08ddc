"""MoA's sparse expert projections: a grouped per-expert matmul over (token, slot) pairs, one grouped GEMM where
torch has one for the dtype and device (the reference's ParallelLinear), one expert at a time on the CPU (no
temporary holds all N·k pairs). Used by ``variants.moa``; values and gradients equal on every path."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .base import autocast_cast, autocast_off


class _ExpertLinear(torch.autograd.Function):
    """Grouped per-expert matmul over (token, slot) pairs: ``out[p] = inp[p // k_in] @ w[e(p)]``.

    ``pos`` lists every pair index p = t·k + j (token t, rank slot j) once, grouped by expert; ``offs`` [E]
    (int32, on the device) holds the cumulative pair count at the end of each expert's group. ``k_in = k`` reads
    token-layout input [N, n_in] (each token feeds its k slots); ``k_in = 1`` reads slot-layout input
    [N·k, n_in]. ``k_out = 1`` returns slot layout [N·k, n_out]; ``k_out = k`` sums the k slots of each token,
    giving [N, n_out]. Off the CPU one gather puts the rows in expert order, one grouped GEMM runs every expert on
    its contiguous slice, one scatter puts the results back (the reference's ParallelLinear); on the CPU the same
    runs one expert at a time (``_stream_forward``). A Function, so the
    backward does not record gather/scatter nodes and nothing stays on the module between calls (re-entrant,
    checkpoint-safe). Computes in the dtype of ``inp``, autocast off: ``_expert_linear`` casts the inputs to
    autocast's dtype first, so under autocast it computes as a Linear would.
    """

    @staticmethod
    def forward(ctx, inp: Tensor, w: Tensor, pos: Tensor, offs: Tensor, k_in: int, k_out: int) -> Tensor:
        ctx.save_for_backward(inp, w, pos, offs)
        ctx.k_in, ctx.k_out = k_in, k_out
        with autocast_off(inp.device.type):
            if _streams(inp):
                return _stream_forward(inp, w.to(inp.dtype), pos, offs, k_in, k_out)
            rows = _grouped_mm(inp.index_select(0, pos // k_in), w.to(inp.dtype), offs)  # (N*k, n_out)
        return _scatter_rows(rows, pos, k_out)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        inp, w, pos, offs = ctx.saved_tensors
        k_in = ctx.k_in
        with autocast_off(inp.device.type):
            if _streams(inp):
                grad_in, grad_w = _stream_backward(grad.to(inp.dtype), inp, w.to(inp.dtype), pos, offs, k_in,
                                                   ctx.k_out)
                return grad_in, grad_w.to(w.dtype), None, None, None, None
            g = grad.to(inp.dtype).index_select(0, pos // ctx.k_out)  # (N*k, n_out) in expert order
            w_t = w.to(inp.dtype).transpose(1, 2)  # (E, n_out, n_in)
            grad_in = _scatter_rows(_grouped_mm(g, w_t, offs), pos, k_in)
            x = inp.index_select(0, pos // k_in)  # (N*k, n_in) re-gathered instead of kept from the forward
            grad_w = _grouped_mm_wgrad(x, g, offs, w.shape[0])  # (E, n_in, n_out)
        return grad_in, grad_w.to(w.dtype), None, None, None, None


# On the CPU the expert GEMMs stream one expert at a time: gather its rows, multiply, scatter (or accumulate) the
# result. The temporaries are one expert's rows, never the N·k × D block of all pairs (16 MB at B=4, T=512, D=256,
# k=8). Measured (fwd+bwd, 2 threads, AMD EPYC): peak memory of a layer step 30.1 -> 17.4 MiB; the quick benchmark's
# time 52.7 -> 50.6 ms (its plain AdamW loop 54.3 -> 55.1 ms, within its noise); 48.5-49.3 -> 42.3-43.2 ms in a loop
# of MoA and MHA alone (MHA 39 ms). The group ends are read on the host, which costs nothing on the CPU; CUDA keeps
# the one grouped GEMM with its offsets on the device.
def _streams(inp: Tensor) -> bool:
    return inp.device.type == "cpu"


def _stream_forward(inp: Tensor, w: Tensor, pos: Tensor, offs: Tensor, k_in: int, k_out: int) -> Tensor:
    src, dst = pos // k_in, pos // k_out  # (N*k,) input row and output row of every pair, in expert order
    n_pairs = pos.shape[0]
    out = inp.new_empty(n_pairs, w.shape[-1]) if k_out == 1 else inp.new_zeros(n_pairs // k_out, w.shape[-1])
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            rows = inp.index_select(0, src[start:end]) @ w[e]  # (n_e, n_out)
            (out.index_copy_ if k_out == 1 else out.index_add_)(0, dst[start:end], rows)
        start = end
    return out


def _stream_backward(grad: Tensor, inp: Tensor, w: Tensor, pos: Tensor, offs: Tensor, k_in: int,
                     k_out: int) -> tuple[Tensor, Tensor]:
    src, dst = pos // k_in, pos // k_out
    # Slot-layout input (k_in = 1): every input row belongs to exactly one pair, so each is written once (a copy:
    # the same bits as adding it to zero, without the zero fill and the reads of the add); token layout: summed.
    grad_in = torch.empty_like(inp) if k_in == 1 else torch.zeros_like(inp)
    grad_w = inp.new_empty(w.shape)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            g = grad.index_select(0, dst[start:end])  # (n_e, n_out)
            (grad_in.index_copy_ if k_in == 1 else grad_in.index_add_)(0, src[start:end], g @ w[e].T)  # (n_e, n_in)
            torch.mm(inp.index_select(0, src[start:end]).T, g, out=grad_w[e])  # (n_in, n_out)
        else:
            grad_w[e].zero_()  # an expert with no rows: zero gradient
        start = end
    return grad_in, grad_w


def _expert_linear(inp: Tensor, w: Tensor, pos: Tensor, offs: Tensor, k_in: int, k_out: int) -> Tensor:
    """``_ExpertLinear`` in autocast's dtype under autocast (``autocast_cast``), in ``inp``'s dtype outside it."""
    inp, w = autocast_cast(inp, w)
    return _ExpertLinear.apply(inp, w, pos, offs, k_in, k_out)


# Off the CPU, torch's grouped GEMM (one call, group offsets read on the device: no host sync) covers bf16 on CUDA
# (and the meta device, whose kernel is CUDA's); fp32/fp16 on CUDA and row strides that are not 16-byte multiples
# take the per-expert loop, which reads the offsets on the host (``grouped_path`` says). The CPU streams (above);
# its dtypes here serve the test that holds the grouped GEMM equal to the stream.
_GROUPED_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16), "cuda": (torch.bfloat16,),
                   "meta": (torch.bfloat16,)}


def _grouped_kernel_ok(a: Tensor, widths: tuple[int, ...]) -> bool:
    # torch.compile traces grouped_mm through a meta kernel that accepts bf16 only, so a compiled graph takes the
    # per-expert loop (whose group sizes are data-dependent: the one graph break routing needs).
    return (
        hasattr(F, "grouped_mm")
        and not torch.compiler.is_compiling()
        and a.dtype in _GROUPED_DTYPES.get(a.device.type, ())
        and all(n * a.element_size() % 16 == 0 for n in widths)
    )


def grouped_path(device: torch.device | str, dtype: torch.dtype) -> str:
    """Which expert GEMM runs for inputs of ``dtype`` on ``device`` (for the rows that report a speed)."""
    if torch.device(device).type == "cpu":
        return "per-expert stream (CPU)"
    ok = dtype in _GROUPED_DTYPES.get(torch.device(device).type, ())
    return "grouped GEMM" if ok and hasattr(F, "grouped_mm") else "per-expert loop (reads group sizes on the host)"


def _grouped_mm(rows: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """rows [M, n_in] grouped by expert (group e ends at ``offs[e]``) -> rows[group_e] @ w[e], [M, n_out]."""
    if _grouped_kernel_ok(rows, w.shape[1:]):
        return F.grouped_mm(rows, w, offs=offs)
    out = rows.new_empty(rows.shape[0], w.shape[-1])
    start = 0
    for e, end in enumerate(offs.tolist()):
        torch.mm(rows[start:end], w[e], out=out[start:end])
        start = end
    return out


def _grouped_mm_wgrad(x: Tensor, g: Tensor, offs: Tensor, n_experts: int) -> Tensor:
    """Per-expert x[group_e]ᵀ @ g[group_e], [E, n_in, n_out]; an expert with no rows gets a zero gradient."""
    if _grouped_kernel_ok(x, (x.shape[1], g.shape[1])):
        return F.grouped_mm(x.t(), g, offs=offs)
    out = x.new_empty(n_experts, x.shape[1], g.shape[1])
    start = 0
    for e, end in enumerate(offs.tolist()):  # empty inner dim -> zeros
        torch.mm(x[start:end].T, g[start:end], out=out[e])
        start = end
    return out


def _scatter_rows(rows: Tensor, pos: Tensor, k: int) -> Tensor:
    """Rows in expert order back to slot layout (k = 1; ``pos`` is a permutation) or summed per token."""
    if k == 1:
        return torch.empty_like(rows).index_copy_(0, pos, rows)  # (N*k, n)
    return rows.new_zeros(rows.shape[0] // k, rows.shape[1]).index_add_(0, pos // k, rows)  # (N, n)
