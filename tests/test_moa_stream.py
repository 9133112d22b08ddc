"""MoA's CPU expert stream (variants/moa.py): the slot-layout backward writes each input row once instead of adding
it to zeros, with the same float32 bits as the summed form."""

import torch

from attention_zoo.variants import moa_experts as moa


def _summed(grad, inp, w, pos, offs, k_in, k_out):  # the previous form: zero fill, then index_add_
    src, dst = pos // k_in, pos // k_out
    grad_in, grad_w = torch.zeros_like(inp), inp.new_zeros(w.shape)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            g = grad.index_select(0, dst[start:end])
            grad_in.index_add_(0, src[start:end], g @ w[e].T)
            torch.mm(inp.index_select(0, src[start:end]).T, g, out=grad_w[e])
        start = end
    return grad_in, grad_w


def test_stream_backward_bits_unchanged_and_empty_experts_zero():
    g = torch.Generator().manual_seed(0)
    N, k, E, n_in, n_out = 64, 2, 6, 8, 5
    idx = torch.stack([torch.randperm(E - 1, generator=g)[:k] for _ in range(N)])  # expert E-1 gets no rows
    pos = torch.argsort(idx.reshape(-1), stable=True)
    offs = torch.bincount(idx.reshape(-1), minlength=E).cumsum(0).to(torch.int32)
    for k_in, k_out, rows_in, rows_out in ((1, k, N * k, N), (k, 1, N, N * k)):
        inp = torch.randn(rows_in, n_in, generator=g)
        w = torch.randn(E, n_in, n_out, generator=g)
        grad = torch.randn(rows_out, n_out, generator=g)
        got, want = moa._stream_backward(grad, inp, w, pos, offs, k_in, k_out), _summed(grad, inp, w, pos, offs,
                                                                                        k_in, k_out)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert not got[1][E - 1].any()
