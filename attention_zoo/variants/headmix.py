"""Attention whose logits and weights are mixed across heads (THA, DCMHA ``paper``), chunked over queries.

``mixed_attention`` runs logits = q kᵀ -> pre-mix -> mask -> softmax -> post-mix -> re-zero -> dropout -> ·V in
blocks of query rows inside one autograd Function. Only q, k, v, the mixing weights and the softmax output of each
block are saved; the logits and the post-mixed weights are recomputed in backward (one GEMM and one mix pass).
That keeps one [B,H,T,S] tensor per layer alive instead of four (saving more is slower, not faster: every saved
byte is fresh memory each step, page-faulted in on first touch), and every temporary is a block, small enough to
stay in the allocator's cache instead of being page-faulted in as a fresh mmap each time. Under causality the
block of rows [t0, t1) only reads keys [0, t1): the later keys are invisible to every head, so their weights are
exactly 0 before and after any linear head mix, and they contribute nothing to values or gradients.

A mixing stage (``MixStage``) is DCMHA's ``Compose`` over the head axis at every (t, s):
out = [a] + static·a + Σ_r w2_q[t,r] <w1_q[t,r], a> + Σ_r w2_k[s,r] <w1_k[s,r], a> + (dd_q[t] + dd_k[s]) ⊙ a,
with the identity branch optional (THA's mixes are a plain static H×H matrix). Everything that reads the query
token is one H×H matrix per query row, M_q[t] = [I] + static + Σ_r w2_q[t,r]ᵀ w1_q[t,r] + diag(dd_q[t]) (formed
outside the Function from the small weights, so autograd takes their gradients from ∂M_q), applied to the block
as one batched GEMM over (b, t); the key-side terms vary along the key axis, the block's contiguous one, and are
broadcast products over the H planes (low rank: R projections and R expansions, plus the gate). The same values as
the term-by-term sum up to float reassociation. Its backward with respect to a is the same map transposed.

That is the CPU's core. On every other device ``mixed_attention`` runs ``headmix_batched.batched_attention``
instead, the same pipeline on the whole [B,H,T,S] tensor with autograd's backward: there each iteration of the
loops below would be a kernel launch.

Under ``torch.compile`` on the CPU the core is one custom op, ``attention_zoo::mixed_attention_core`` (and its
backward op): the graph holds one node for the blocked eager code instead of the unrolled block loop, so it neither
breaks nor grows with T, and inductor compiles the layer around it (``headmix_compiled``). The stages' math is in
``headmix_stages``, the blocked Function in ``headmix_blocks``.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from .base import Masks, autocast_cast, autocast_enabled, autocast_off
from .headmix_batched import batched_attention, use_batched
from .headmix_blocks import _forward_blocks, _MixedAttention
from .headmix_compiled import _compiled_core
from .headmix_native import _observed
from .headmix_ops import _Stage, mix_heads, rezero, softmax_fp32  # noqa: F401  (imported from here by THA, DCMHA)
from .headmix_stages import MixStage, _prepare, query_matrix  # noqa: F401  (MixStage, query_matrix: the public names)
from .headmix_workspace import Workspace


def mixed_attention(q: Tensor, k: Tensor, v: Tensor, masks: Masks, pre: MixStage | None, pre_tensors: list,
                    post: MixStage | None, post_tensors: list, *, chunk: int, dropout: float, mix=mix_heads,
                    rezero_fn=rezero, workspace: Workspace | None = None) -> Tensor:
    """Head-mixed attention core: q [B,H,T,dh] (pre-scaled), k [B,H,S,dh], v [B,H,S,dv] -> [B,H,T,dv].

    ``mix`` and ``rezero_fn`` are the caller's static head mix and re-zeroing (THA passes its module's own, which
    its tests patch). ``dropout`` is the attention-dropout probability in effect (0 in eval). Under autocast the
    whole core runs in autocast's dtype with autocast off (``autocast_cast``): its backward, which autocast does
    not reach, recomputes the mixes in the forward's dtype. Off the CPU (or inside ``batched_core()``) the core is
    the batched one, eager and under torch.compile alike.
    """
    if autocast_enabled(q.device.type):
        n_pre = len(pre_tensors)
        q, k, v, *tensors = autocast_cast(q, k, v, *pre_tensors, *post_tensors)
        with autocast_off(q.device.type):
            return mixed_attention(q, k, v, masks, pre, tensors[:n_pre], post, tensors[n_pre:], chunk=chunk,
                                   dropout=dropout, mix=mix, rezero_fn=rezero_fn, workspace=workspace)
    if workspace is not None and (torch.compiler.is_compiling() or _observed()):
        workspace = None  # compiled: the custom op; counted or traced: the plain ops, not their out= forms
    batched = use_batched(q.device)
    pre_s, post_s = _prepare(pre, pre_tensors, not batched), _prepare(post, post_tensors, not batched)
    if batched:  # off the CPU: a few large kernels instead of the blocked loops' many small ones
        return batched_attention(q, k, v, masks, pre_s, post_s, dropout, mix, rezero_fn)
    if torch.compiler.is_compiling():  # one opaque op in the graph (see _core_op): nothing unrolled
        return _compiled_core(q, k, v, masks, pre_s, post_s, chunk, dropout)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tensors = [*(pre_s.tensors if pre_s else ()), *(post_s.tensors if post_s else ())]
    cfg = (None if pre_s is None else pre_s.copy, None if post_s is None else post_s.copy, chunk, dropout, mix,
           rezero_fn)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *tensors) if t is not None):
        return _MixedAttention.apply(cfg, workspace, masks, q, k, v, *tensors)
    with workspace.scratch() if workspace is not None else contextlib.nullcontext() as scratch:
        return _forward_blocks(q, k, v, masks, pre_s, post_s, chunk, dropout, mix, rezero_fn, save=False,
                               scratch=scratch)[0]


