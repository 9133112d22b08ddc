"""The native compose kernels (attention_zoo/native): built here, equal to the ATen path in float64 (forward, every
gradient) for every stage form and block layout, used by DCMHA and THA, and not needed: disabled, the same layers
give the same values through ATen."""

import pytest
import torch

from attention_zoo import create_attention, native
from attention_zoo.variants import headmix_blocks, headmix_native, headmix_ops, headmix_stages
from attention_zoo.variants.base import Masks

lib = native.library()
needs_lib = pytest.mark.skipif(lib is None, reason="no C compiler: the ATen path is the only one")


def _stage(B, H, T, S, R, head: str, key: bool, dtype=torch.float64) -> headmix_ops._Stage:
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    qmat = rnd(B, T, H, H) if head == "qmat" else None
    mixmat = rnd(H, H) if head == "mixmat" else None
    k1, k2, kdd = (rnd(B, R, H, S), rnd(B, R, H, S), rnd(B, H, S)) if key else (None, None, None)
    return headmix_ops._Stage(qmat, mixmat, head == "copy", k1, k2, kdd)


def _block(B, H, c, S, layout: str, dtype=torch.float64) -> torch.Tensor:
    x = torch.randn(B, c, H, S, dtype=dtype) if layout == "bchs" else torch.randn(B, H, c, S, dtype=dtype)
    return x.transpose(1, 2) if layout == "bchs" else x  # a [B,H,c,S] view either way


def _both(monkeypatch, fn):
    """fn() with the native kernels, then with ATen only."""
    fast = fn()
    monkeypatch.setenv("ATTENTION_ZOO_NATIVE", "0")
    slow = fn()
    monkeypatch.delenv("ATTENTION_ZOO_NATIVE")
    return fast, slow


@needs_lib
@pytest.mark.parametrize(("head", "key"), [(h, k) for h in ("qmat", "mixmat", "copy", "none") for k in (True, False)
                                          if h != "none" or k])  # every stage form but the empty one
@pytest.mark.parametrize("layout", ["bhcs", "bchs"])
def test_stage_forward_and_backward_equal_the_aten_path(monkeypatch, head, key, layout):
    B, H, T, S, R = 2, 5, 11, 37, 2  # S spans a partial key chunk; H, R not powers of two
    rows, cols = slice(3, 9), 29
    st = _stage(B, H, T, S, R, head, key)
    a = _block(B, H, rows.stop - rows.start, cols, layout)
    g = torch.randn(a.shape, dtype=a.dtype)

    def run():
        out, _ = headmix_stages._stage_forward(st, a, rows, cols, headmix_ops.mix_heads)
        grads = [None if t is None else torch.zeros_like(t) for t in st.tensors]
        low = None if st.k1 is None else headmix_stages._key_project(a, st.k1[..., :cols])
        ga = headmix_stages._stage_backward(st, a, g, low, rows, cols, headmix_ops.mix_heads, grads)
        return out, ga, grads

    (out, ga, grads), (out0, ga0, grads0) = _both(monkeypatch, run)
    torch.testing.assert_close(out, out0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ga, ga0, rtol=1e-12, atol=1e-12)
    for x, y in zip(grads, grads0):
        if x is not None:
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@needs_lib
def test_the_kernels_run_where_they_claim_to(monkeypatch):
    calls = []
    for module, name in ((headmix_stages, "_native_forward"), (headmix_blocks, "_fused_forward"),
                         (headmix_blocks, "_fused_backward")):  # patched where the core calls them
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    attn = create_attention("dcmha", d_model=32, n_heads=4, causal=True)
    attn(torch.randn(2, 9, 32, requires_grad=True)).sum().backward()
    assert {"_fused_forward", "_fused_backward"} <= set(calls), "DCMHA's blocks did not run natively"
    calls.clear()
    attn(torch.randn(2, 9, 32), attn_mask=torch.rand(2, 4, 9, 9) > 0.5)  # per-head masks: the stage-by-stage path
    assert calls and set(calls) == {"_native_forward"}
    st = _stage(1, 4, 3, 6, 1, "qmat", True, dtype=torch.float16)
    mix = headmix_ops.mix_heads
    assert headmix_native._native_lib(st, torch.randn(1, 4, 3, 6).half(), mix) is None  # another dtype


@needs_lib
@pytest.mark.parametrize("name", ["dcmha", "tha"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask", ["padding", "bias"])
def test_layers_equal_with_and_without_the_kernels(monkeypatch, name, causal, threads, dtype, mask):
    """Whole layers (fused blocks: stages, mask, softmax and their backward in one pass per row) against ATen."""
    torch.manual_seed(0)
    attn = create_attention(name, d_model=32, n_heads=4, causal=causal).to(dtype)
    for p in attn.parameters():  # weights big enough that every term matters
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(3, 37, 32, dtype=dtype, requires_grad=True)  # 37 keys: a partial chunk
    kw = {}
    if mask == "padding":
        kw["padding_mask"] = torch.ones(3, 37, dtype=torch.bool)
        kw["padding_mask"][1, 30:] = False
    else:  # a float mask added to the logits, head-shared
        kw["attn_mask"] = torch.randn(37, 37, dtype=dtype)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)

    def run():
        x.grad = None
        attn.zero_grad(set_to_none=True)
        y = attn(x, **kw)
        y.square().sum().backward()
        return y.detach(), x.grad.clone(), [p.grad.clone() for p in attn.parameters()]

    try:
        (y, gx, gp), (y0, gx0, gp0) = _both(monkeypatch, run)
    finally:
        torch.set_num_threads(saved)
    # Sums in another order: float rounding, amplified where terms cancel, so the bound scales with each tensor's
    # largest entry (float32: about 1e-4 of it; float64: 1e-10).
    eps = 1e-10 if dtype == torch.float64 else 1e-4
    for a, b in zip([y, gx, *gp], [y0, gx0, *gp0]):
        torch.testing.assert_close(a, b, rtol=100 * eps, atol=eps * float(b.abs().max()))


@needs_lib
def test_the_float32_softmax_exponential_is_within_float_rounding():
    st = _stage(2, 4, 5, 300, 2, "qmat", True, dtype=torch.float32)
    a0 = 30 * torch.randn(2, 4, 5, 300)  # logits far apart: exp underflows to exactly 0 for some
    masks = Masks(None, None, None, None, False, False)
    w = torch.empty_like(a0)
    headmix_native._fused_forward(lib, st, None, a0, masks, slice(0, 5), w)
    logits = headmix_stages._stage_forward(st, a0, slice(0, 5), 300, headmix_ops.mix_heads)[0]
    ref = torch.softmax(logits.double(), -1).float()
    torch.testing.assert_close(w, ref, rtol=2e-6, atol=1e-30)
    assert (w[ref == 0] == 0).all() and torch.allclose(w.sum(-1), torch.ones(()))


def test_disabled_kernels_leave_the_aten_path(monkeypatch):
    monkeypatch.setenv("ATTENTION_ZOO_NATIVE", "0")
    assert native.library() is None
    st = _stage(1, 4, 3, 6, 1, "qmat", True)
    assert headmix_native._native_lib(st, torch.randn(1, 4, 3, 6, dtype=torch.float64), headmix_ops.mix_heads) is None


def test_a_cache_directory_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OSError, match="not a private directory"):
        native._private_dir(shared)
    mine = tmp_path / "mine"
    native._private_dir(mine)
    assert mine.stat().st_mode & 0o077 == 0


def test_masks_the_kernels_leave_to_aten_still_match(monkeypatch):
    """Per-head masks and dropout keep the ATen re-zeroing: same values with the kernels on as off."""
    torch.manual_seed(1)
    attn = create_attention("dcmha", d_model=16, n_heads=4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    keep = torch.rand(2, 4, 7, 7) > 0.3
    keep[..., 0] = True

    def run():
        return attn(x, attn_mask=keep).detach()

    fast, slow = _both(monkeypatch, run)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
