"""THA (talking-heads attention): reduction to MHA, mask placement, no leak, parameter and FLOP counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attention_zoo as zoo
from attention_zoo.variants import tha as tha_module

D, H, B, T = 32, 4, 3, 9
FLAVORS = ("paper", "damcha_repo")


def make(causal=False, flavor="paper", **opts):
    torch.manual_seed(0)
    return zoo.create_attention("tha", d_model=D, n_heads=H, causal=causal, flavor=flavor, **opts).double()


def random_mixing(m, seed=1):
    """Non-identity mixing with negative entries (the case where -inf before the mix would give NaN/+inf)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in (m.pre_proj, m.post_proj):
            lin.weight.copy_(torch.randn(H, H, generator=g, dtype=torch.float64))
    return m


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 6:] = False
    pad[2, 2:] = False
    return x, pad


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_identity_mixing_equals_mha(flavor, causal, padded):
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal).double()
    m = make(causal, flavor, mix_init="identity")
    missing, unexpected = m.load_state_dict(mha.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == ["post_proj.weight", "pre_proj.weight"]
    x, pad = inputs()
    pad = pad if padded else None
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = m(xa, padding_mask=pad), mha(xb, padding_mask=pad)
    torch.testing.assert_close(ya, yb)
    (ya * yb.detach()).sum().backward()
    (yb * yb.detach()).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)


def test_default_init_per_flavor():
    eye = torch.eye(H, dtype=torch.float64)
    paper, repo = make(flavor="paper"), make(flavor="damcha_repo")
    assert paper.mix_init == "random" and repo.mix_init == "identity"
    torch.testing.assert_close(repo.pre_proj.weight, eye)
    torch.testing.assert_close(repo.post_proj.weight, eye)
    assert (paper.pre_proj.weight - eye).abs().max() > 0.05


@pytest.mark.parametrize("flavor", FLAVORS)
def test_no_inf_reaches_the_mixing(flavor, monkeypatch):
    """Causal mask + a fully masked row + random signed mixing: the mixes only see finite values."""
    seen = []

    def checked_mix(weight, a):
        seen.append(bool(torch.isfinite(a).all()))
        return mix_heads(weight, a)

    mix_heads = tha_module.mix_heads
    monkeypatch.setattr(tha_module, "mix_heads", checked_mix)
    m = random_mixing(make(causal=True, flavor=flavor))
    x, pad = inputs()
    x.requires_grad_()
    attn_mask = torch.ones(T, T, dtype=torch.bool)
    attn_mask[4] = False  # query 4 sees no key
    y = m(x, padding_mask=pad, attn_mask=attn_mask)
    assert seen == [True, True]
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_post_mix_has_no_bias(monkeypatch):
    """Both mixes are bias-free, and the post-mix leaves exactly 0 on masked keys before any re-zeroing."""
    m = random_mixing(make(causal=True))
    assert m.pre_proj.bias is None and m.post_proj.bias is None
    captured = []

    def capture(weights, masks):
        captured.append(weights.detach().clone())
        return rezero(weights, masks)

    rezero = tha_module.rezero
    monkeypatch.setattr(tha_module, "rezero", capture)
    x, _ = inputs()
    m(x)
    future = ~torch.ones(T, T, dtype=torch.bool).tril()
    assert captured[0].shape == (B, H, T, T)
    assert (captured[0][:, :, future] == 0).all()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_causal_random_mixing_does_not_leak(flavor):
    m = random_mixing(make(causal=True, flavor=flavor)).eval()
    x, _ = inputs()
    x2 = x.clone()
    x2[:, 5:] += 3.0 * torch.randn_like(x2[:, 5:])
    y, y2 = m(x), m(x2)
    torch.testing.assert_close(y[:, :5], y2[:, :5], rtol=0, atol=1e-12)
    assert (y[:, 5:] - y2[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("d_model,n_heads,bias", [(32, 4, True), (48, 6, False), (64, 16, True), (128, 8, True)])
def test_analytic_params_match_count(flavor, d_model, n_heads, bias):
    m = zoo.create_attention("tha", d_model=d_model, n_heads=n_heads, flavor=flavor, bias=bias)
    assert m.analytic_params() == sum(p.numel() for p in m.parameters())


def test_param_count_compact_config():
    for flavor in FLAVORS:  # variants.md §10
        assert zoo.create_attention("tha", d_model=128, n_heads=8, flavor=flavor).analytic_params() == 66_176


def test_analytic_flops_match_counter():
    """Every THA kernel is a plain matmul, so torch's FLOP counter must agree exactly (forward, 2 per MAC)."""
    m = make().eval()
    x, _ = inputs()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        m(x)
    assert counter.get_total_flops() == m.analytic_flops(B, T)
    mha = zoo.create_attention("mha", d_model=D, n_heads=H)
    assert m.analytic_flops(B, T) - mha.analytic_flops(B, T) == B * 4 * H * H * T * T


def test_bad_mix_init():
    with pytest.raises(ValueError, match="^mix_init"):
        zoo.create_attention("tha", d_model=D, n_heads=H, mix_init="orthogonal")


def test_capabilities():
    spec = zoo.get_attention_spec("tha")
    assert spec.needs_full_logits and not spec.fused_kernel and spec.flavors == FLAVORS


def reference_tha(m, x, keep):
    """THA written out with plain autograd over full [B,H,T,S] tensors (the formulation before query chunking)."""
    Bn, Tn, _ = x.shape
    q, k, v = m.qkv(x).view(Bn, Tn, 3, H, D // H).permute(2, 0, 3, 1, 4)
    logits = torch.einsum("oi,bits->bots", m.pre_proj.weight, q @ k.transpose(-2, -1) / (D // H) ** 0.5)
    weights = torch.softmax(logits.masked_fill(~keep, torch.finfo(x.dtype).min), dim=-1)
    weights = torch.einsum("oi,bits->bots", m.post_proj.weight, weights).masked_fill(~keep, 0.0)
    return m.out_proj((weights @ v).transpose(1, 2).reshape(Bn, Tn, D))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [2, 64])
def test_chunked_core_matches_autograd_reference(causal, chunk, monkeypatch):
    """Chunked core (softmax outputs saved, the rest recomputed, causal blocks read only visible keys) against
    plain autograd: values and every gradient, float64, with padding and a fully masked query row."""
    monkeypatch.setattr(tha_module.TalkingHeadsAttention, "query_chunk", chunk)
    m = random_mixing(make(causal=causal))
    x, pad = inputs()
    attn_mask = torch.ones(T, T, dtype=torch.bool)
    attn_mask[3] = False  # query 3 sees no key
    keep = pad[:, None, None, :] & attn_mask & (torch.ones(T, T, dtype=torch.bool).tril() if causal else True)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = m(x1, padding_mask=pad, attn_mask=attn_mask)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=y.dtype)
    grads = torch.autograd.grad(y, [x1, *m.parameters()], g)
    ref = reference_tha(m, x2, keep).masked_fill(~pad[..., None], 0.0)
    ref_grads = torch.autograd.grad(ref, [x2, *m.parameters()], g)
    torch.testing.assert_close(y, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
