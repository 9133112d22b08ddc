"""The head-mixed core under ``torch.compile``: the blocked eager code as one custom op
(``attention_zoo::mixed_attention_core``) and its backward op, so the graph neither breaks nor grows with T."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Masks
from .headmix_blocks import _backward_blocks, _forward_blocks, _key_cols, _slot
from .headmix_ops import _Stage, mix_heads, rezero
from .headmix_stages import (
    _stages,
)

# ---- the core as one custom op (torch.compile) -----------------------------------------------------------------
# Under torch.compile the Function above would be traced: dynamo inlines its forward and backward, unrolling the
# block loop and the per-batch / per-plane loops inside it into thousands of small graph nodes (about 400 forward
# and 950 backward nodes per block), which inductor then runs as separate kernels, slower than eager. As a custom
# op (forward and backward each one node whose implementation is the blocked eager code) the graph stays small
# and independent of T, nothing in it breaks or recompiles on the block count, and inductor compiles everything
# around the core (projections, the generator, the per-row matrices). The op saves the blocks' softmax outputs
# packed into one [B,H,T,S] tensor (and the dropout keep mask) as extra outputs for its backward op.

_N_STAGE = 5  # tensors per stage in the op's signature: qmat, mixmat, k1, k2, kdd


def _op_masks(keep, bias, dead, causal: bool) -> Masks:
    """The op's masks. A compiled graph cannot test for dead rows (data-dependent), so ``resolve_masks`` always hands
    it a ``dead`` tensor; inside the op the test is cheap, and dropping an all-False one restores the eager path's
    causal skip of invisible keys (``_key_cols``)."""
    if dead is not None and not bool(dead.any()):
        dead = None
    return Masks(keep, bias, dead, None, causal, False)


def _op_stages(flags: list[int], tensors) -> tuple[_Stage | None, _Stage | None]:
    """flags [pre, post]: -1 for an absent stage, else its ``copy`` flag as 0/1."""
    pre = None if flags[0] < 0 else bool(flags[0])
    post = None if flags[1] < 0 else bool(flags[1])
    present = [t for i, t in enumerate(tensors) if (pre is not None if i < _N_STAGE else post is not None)]
    return _stages(pre, post, present)


@torch.library.custom_op("attention_zoo::mixed_attention_core", mutates_args=())
def _core_op(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, bias: Tensor | None, dead: Tensor | None,
             causal: bool, flags: list[int], pre_qmat: Tensor | None, pre_mixmat: Tensor | None,
             pre_k1: Tensor | None, pre_k2: Tensor | None, pre_kdd: Tensor | None, post_qmat: Tensor | None,
             post_mixmat: Tensor | None, post_k1: Tensor | None, post_k2: Tensor | None, post_kdd: Tensor | None,
             chunk: int, dropout: float) -> tuple[Tensor, Tensor, Tensor]:
    """(out [B,H,T,dv], the softmax outputs [B,H,T,S], the dropout keep mask [B,H,T,S] or an empty tensor)."""
    tensors = (pre_qmat, pre_mixmat, pre_k1, pre_k2, pre_kdd, post_qmat, post_mixmat, post_k1, post_k2, post_kdd)
    pre_s, post_s = _op_stages(flags, tensors)
    masks = _op_masks(keep, bias, dead, causal)
    B, H, T, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    w_all = q.new_empty(B, H, T, S)  # the blocks one after another (``_slot``); causal ones fill a prefix
    keep_all = q.new_empty(B, H, T, S, dtype=torch.bool) if dropout else q.new_empty(0, dtype=torch.bool)
    out, _ = _forward_blocks(q, k, v, masks, pre_s, post_s, chunk, dropout, mix_heads, rezero, save=True,
                             store=(w_all, keep_all))
    return out, w_all, keep_all


@_core_op.register_fake
def _(q, k, v, keep, bias, dead, causal, flags, *rest):
    *_, chunk, dropout = rest
    B, H, T, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    keep_shape = (B, H, T, S) if dropout else (0,)
    return (q.new_empty(B, H, T, v.shape[-1]), q.new_empty(B, H, T, S), q.new_empty(keep_shape, dtype=torch.bool))


@torch.library.custom_op("attention_zoo::mixed_attention_core_backward", mutates_args=())
def _core_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, bias: Tensor | None,
                      dead: Tensor | None, causal: bool, flags: list[int], pre_qmat: Tensor | None,
                      pre_mixmat: Tensor | None, pre_k1: Tensor | None, pre_k2: Tensor | None,
                      pre_kdd: Tensor | None, post_qmat: Tensor | None, post_mixmat: Tensor | None,
                      post_k1: Tensor | None, post_k2: Tensor | None, post_kdd: Tensor | None, chunk: int,
                      dropout: float, w_all: Tensor, keep_all: Tensor) -> list[Tensor]:
    """[gq, gk, gv, then one gradient per stage tensor slot (an empty tensor where the slot is None)]."""
    tensors = (pre_qmat, pre_mixmat, pre_k1, pre_k2, pre_kdd, post_qmat, post_mixmat, post_k1, post_k2, post_kdd)
    pre_s, post_s = _op_stages(flags, tensors)
    masks = _op_masks(keep, bias, dead, causal)
    T, S = q.shape[2], k.shape[2]
    blocks, offset, B, H = [], 0, q.shape[0], q.shape[1]
    for t0 in range(0, T, chunk):
        rows = slice(t0, min(t0 + chunk, T))
        shape = (B, H, rows.stop - rows.start, _key_cols(masks, rows, S))
        blocks.append((_slot(w_all, offset, shape), _slot(keep_all, offset, shape) if dropout else None))
        offset += math.prod(shape)
    grads = _backward_blocks(grad_out, q, k, v, masks, pre_s, post_s, chunk, dropout, mix_heads, rezero, blocks)
    it = iter(grads[3:])
    slots = []
    for i in range(len(tensors)):
        stage_on = flags[0 if i < _N_STAGE else 1] >= 0
        g = next(it) if stage_on else None
        slots.append(q.new_empty(0) if g is None else g)
    return [*grads[:3], *slots]


@_core_backward_op.register_fake
def _(grad_out, q, k, v, keep, bias, dead, causal, flags, *rest):
    tensors = rest[:2 * _N_STAGE]
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            *[q.new_empty(0) if t is None else torch.empty_like(t) for t in tensors]]


def _core_setup_context(ctx, inputs, output):
    ctx.inputs = inputs[3:]  # everything but q, k, v: masks, flags, stage tensors, chunk, dropout
    ctx.save_for_backward(inputs[0], inputs[1], inputs[2], output[1], output[2])


def _core_op_backward(ctx, grad_out, _grad_w, _grad_keep):
    q, k, v, w_all, keep_all = ctx.saved_tensors
    rest = ctx.inputs
    grads = _core_backward_op(grad_out, q, k, v, *rest, w_all, keep_all)
    tensors = rest[5 : 5 + 2 * _N_STAGE]
    slots = [None if t is None else g for t, g in zip(tensors, grads[3:])]
    return (*grads[:3], None, None, None, None, None, *slots, None, None)


_core_op.register_autograd(_core_op_backward, setup_context=_core_setup_context)


def _compiled_core(q, k, v, masks: Masks, pre_s: _Stage | None, post_s: _Stage | None, chunk: int,
                   dropout: float) -> Tensor:
    """``mixed_attention`` under torch.compile: the blocked core as ``attention_zoo::mixed_attention_core``. It
    runs the module's default mix and re-zeroing (``mix_heads``, ``rezero``), not the caller's hooks."""
    flags = [-1 if pre_s is None else int(pre_s.copy), -1 if post_s is None else int(post_s.copy)]
    none = (None,) * _N_STAGE
    tensors = [*(pre_s.tensors if pre_s else none), *(post_s.tensors if post_s else none)]
    return _core_op(q.contiguous(), k.contiguous(), v.contiguous(), masks.keep, masks.bias, masks.dead, masks.causal,
                    flags, *tensors, chunk, dropout)[0]
