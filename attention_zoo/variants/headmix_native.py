"""``headmix``'s mixing stages and fused blocks as the native kernels of attention_zoo/native/compose.c: the ctypes
glue (when a kernel applies, the structs it reads, the per-thread gradient buffers it writes and their reduction).
``headmix.py`` calls these; where they return None it runs its ATen path."""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from .. import native
from .base import Masks
from .headmix_ops import _Stage, mix_heads, rezero

# ---- the stages as native kernels (attention_zoo/native/compose.c) ---------------------------------------------
# A stage is one pass over the block in the C kernel (per key chunk: the H×H row matrix, the key projections and the
# gate, all in L1) instead of 2 + 3R + H broadcast passes of ATen ops; its backward is one more pass that also forms
# every weight gradient. Same values up to float reassociation (tests/test_native.py); headmix.py's ATen code stays
# the path for anything the kernel does not take (another device or dtype, the caller's own ``mix``, more heads or
# ranks than it is built for) and where the kernels are unavailable.
_DTYPES = {torch.float32: "f32", torch.float64: "f64"}


def _native_lib(st: _Stage, a: Tensor, mix):
    if a.device.type != "cpu" or a.dtype not in _DTYPES or _observed():
        return None
    lib = native.library()
    if lib is None or a.stride(-1) != 1 or a.shape[1] > lib.max_heads:
        return None
    if st.k1 is None and st.qmat is None:  # a static mix alone (THA) is one GEMM on the block: ATen's is faster
        return None
    if st.mixmat is not None and (mix is not mix_heads or not st.mixmat.is_contiguous()):
        return None
    if st.k1 is not None and st.k1.shape[1] > lib.max_rank:
        return None
    for t in st.tensors:
        if t is not None and (t.dtype != a.dtype or t.stride(-1) != 1):
            return None
    if st.qmat is not None and st.qmat.stride(-2) != a.shape[1]:
        return None
    return lib


def _observed() -> bool:
    """A FLOP counter (a dispatch mode) or a tracer (fvcore's jit trace) is watching: it must see the stage as the
    ATen ops it is, so the counts describe the mechanism whatever kernel runs it."""
    return torch.jit.is_tracing() or bool(torch.utils._python_dispatch._get_current_dispatch_mode_stack())


def _layout(t: Tensor) -> native.Layout:
    return native.Layout(t.stride(0), t.stride(1), t.stride(2))


def _native_stage(st: _Stage, rows: slice) -> native.Stage:
    head = 2 if st.qmat is not None or st.mixmat is not None else int(st.copy)
    m, mb, mt = None, 0, 0
    if st.qmat is not None:
        qm = st.qmat[:, rows]
        m, mb, mt = qm.data_ptr(), qm.stride(0), qm.stride(1)
    elif st.mixmat is not None:
        m = st.mixmat.data_ptr()
    k = (st.k1.data_ptr(), st.k2.data_ptr(), st.kdd.data_ptr(), st.k1.stride(0), st.k1.stride(1), st.k1.stride(2),
         st.kdd.stride(0), st.kdd.stride(1)) if st.k1 is not None else (None, None, None, 0, 0, 0, 0, 0)
    return native.Stage(head, m, mb, mt, *k)


def _native_forward(lib, st: _Stage, a: Tensor, rows: slice) -> Tensor:
    B, H, c, S = a.shape
    out = torch.empty_like(a)  # the block's own layout
    fn = getattr(lib, f"compose_forward_{_DTYPES[a.dtype]}")
    R = 0 if st.k1 is None else st.k1.shape[1]
    fn(_native_stage(st, rows), H, R, S, B, c, torch.get_num_threads(), a.data_ptr(), _layout(a), out.data_ptr(),
       _layout(out))
    return out


def _native_backward(lib, st: _Stage, a: Tensor, g: Tensor, rows: slice, cols: int, grads: list) -> Tensor:
    B, H, c, S = a.shape
    ga = torch.empty_like(g)
    n = torch.get_num_threads()
    gs, bufs = _grads_struct(st, grads, rows, n, a)  # the fused kernels' gradient destinations, as arguments here
    getattr(lib, f"compose_backward_{_DTYPES[a.dtype]}")(
        _native_stage(st, rows), H, _rank(st), S, B, c, n, a.data_ptr(), _layout(a), g.data_ptr(), _layout(g),
        ga.data_ptr(), _layout(ga), *(getattr(gs, name) for name, _ in gs._fields_))
    _reduce_grads(bufs, grads, cols)
    return ga


def _fused_lib(pre_s: _Stage | None, post_s: _Stage | None, a: Tensor, masks: Masks, drop_p: float, mix, rz):
    """The kernels when a whole block's elementwise chain (stages, mask, softmax, and their backward) can run as one
    native pass per row: head-shared masks without dead rows (nothing to re-zero), no dropout, the default mix and
    re-zeroing, and stages the kernels take; else None (the stage-by-stage path)."""
    if drop_p or masks.dead is not None or mix is not mix_heads or rz is not rezero:
        return None
    if masks.keep is not None and masks.keep.shape[1] != 1 or masks.bias is not None and masks.bias.dtype != a.dtype:
        return None
    if pre_s is None and post_s is None:
        return None
    libs = [_native_lib(st, a, mix) for st in (pre_s, post_s) if st is not None]
    return libs[0] if all(lib is not None for lib in libs) else None


def _rank(st: _Stage | None) -> int:
    return 0 if st is None or st.k1 is None else st.k1.shape[1]


def _masks_struct(m: Masks) -> native.Masks:
    def strides(t, axes):
        return [0 if t.shape[ax] == 1 else t.stride(ax) for ax in axes]

    keep = (m.keep.data_ptr(), *strides(m.keep, (0, 2, 3))) if m.keep is not None else (None, 0, 0, 0)
    bias = (m.bias.data_ptr(), *strides(m.bias, (0, 1, 2, 3))) if m.bias is not None else (None, 0, 0, 0, 0)
    return native.Masks(*keep, *bias)


def _fused_forward(lib, pre_s, post_s, a0: Tensor, m: Masks, rows: slice, w: Tensor,
                   p_into: Tensor | None = None) -> Tensor:
    """One block's w = softmax(mask(pre(a0))) into ``w`` and p = post(w), returned (w itself without a post stage);
    ``p_into``: a contiguous block of w's shape p may be written into (a workspace's scratch)."""
    B, H, c, S = a0.shape
    p = w if post_s is None else p_into if p_into is not None else torch.empty_like(w)
    stages = [None if st is None else ctypes.byref(_native_stage(st, rows)) for st in (pre_s, post_s)]
    getattr(lib, f"fused_forward_{_DTYPES[a0.dtype]}")(
        *stages, H, _rank(pre_s), _rank(post_s), S, B, c, torch.get_num_threads(), a0.data_ptr(), _layout(a0),
        ctypes.byref(_masks_struct(m)), torch.finfo(a0.dtype).min, w.data_ptr(), _layout(w), p.data_ptr(),
        _layout(p))
    return p


def _grads_struct(st: _Stage | None, grads: list, rows: slice, n: int, a: Tensor):
    """(the kernel's gradient destinations for a stage, the per-thread buffers to reduce afterwards)."""
    if st is None:
        return None, None
    gm, gmb, gmt, shared, bufs = None, 0, 0, 0, {}
    if st.qmat is not None:
        gm = grads[0][:, rows]  # every row is written by exactly one thread
        gmb, gmt = gm.stride(0), gm.stride(1)
    elif st.mixmat is not None:
        gm = bufs["mix"] = a.new_zeros(n, *st.mixmat.shape)
        shared = 1
    k = (None, None, None, 0, 0)
    if st.k1 is not None:
        bufs["key"] = (a.new_zeros(n, *st.k1.shape), a.new_zeros(n, *st.k1.shape), a.new_zeros(n, *st.kdd.shape))
        k = (*(x.data_ptr() for x in bufs["key"]), bufs["key"][0].stride(0), bufs["key"][2].stride(0))
    return native.Grads(None if gm is None else gm.data_ptr(), gmb, gmt, shared, *k), bufs


def _reduce_grads(bufs: dict | None, grads: list, cols: int) -> None:
    if not bufs:
        return
    if "mix" in bufs:
        grads[1] += bufs["mix"].sum(0)
    for dst, part in zip(grads[2:5], bufs.get("key", ())):
        dst[..., :cols] += part[..., :cols].sum(0)


def _fused_backward(lib, pre_s, post_s, a0: Tensor | None, w: Tensor, g_p: Tensor, rows: slice, cols: int,
                    g_pre: list, g_post: list, into: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """One block's backward chain: (p recomputed, ∂a0), the stages' weight gradients accumulated; ``into``: two
    contiguous blocks of w's shape, aliasing none of the inputs, for p and ∂a0 (a workspace's scratch)."""
    B, H, c, S = w.shape
    n = torch.get_num_threads()
    p_into, ga_into = into if into is not None else (None, None)
    p = w if post_s is None else p_into if p_into is not None else torch.empty_like(w)
    ga = ga_into if ga_into is not None else torch.empty_like(w)
    scratch = w.new_empty(n, H, S) if pre_s is not None else w.new_empty(1)
    gs_pre, bufs_pre = _grads_struct(pre_s, g_pre, rows, n, w)
    gs_post, bufs_post = _grads_struct(post_s, g_post, rows, n, w)
    stages = [None if st is None else ctypes.byref(_native_stage(st, rows)) for st in (pre_s, post_s)]
    a0_ptr, la = (a0.data_ptr(), _layout(a0)) if a0 is not None else (None, native.Layout(0, 0, 0))
    getattr(lib, f"fused_backward_{_DTYPES[w.dtype]}")(
        *stages, None if gs_pre is None else ctypes.byref(gs_pre), None if gs_post is None else ctypes.byref(gs_post),
        H, _rank(pre_s), _rank(post_s), S, B, c, n, a0_ptr, la, w.data_ptr(), _layout(w), g_p.data_ptr(),
        _layout(g_p), p.data_ptr(), _layout(p), ga.data_ptr(), _layout(ga), scratch.data_ptr())
    _reduce_grads(bufs_pre, g_pre, cols)
    _reduce_grads(bufs_post, g_post, cols)
    return p, ga
