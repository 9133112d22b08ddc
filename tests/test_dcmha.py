"""DCMHA: Compose against a per-(t, s) loop, both flavours against naive references, reduction to MHA,
query chunking, the RMS-normalised generator, and parameter / FLOP counts."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attention_zoo as zoo
from attention_zoo.variants.dcmha import compose

D, H, B, T = 32, 4, 2, 7
FLAVORS = ("paper", "damcha_repo")


def make(causal=False, flavor="paper", strong=False, **opts):
    torch.manual_seed(0)
    m = zoo.create_attention("dcmha", d_model=D, n_heads=H, causal=causal, flavor=flavor, **opts).double()
    if strong:  # composition weights far from the near-identity init, so every term matters
        with torch.no_grad():
            for name, p in m.named_parameters():
                if not name.startswith(("qkv", "out_proj")):
                    p.normal_(0.0, 0.5)
    return m


def inputs(seed=0, batch=B, seq=T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, D, generator=g, dtype=torch.float64)
    pad = torch.ones(batch, seq, dtype=torch.bool)
    pad[0, seq - 2 :] = False
    return x, pad


def loop_compose(a, qw, kw, static):
    """Compose written per (b, t, s) exactly as variants.md §3.1."""
    out = torch.empty_like(a)
    Bn, _, Tn, Sn = a.shape
    for b in range(Bn):
        for t in range(Tn):
            for s in range(Sn):
                v = a[b, :, t, s]
                o = v + static @ v
                for (w1, w2, dd), i in ((qw, t), (kw, s)):
                    o = o + (w2[b, i].T @ (w1[b, i] @ v)) + dd[b, i] * v
                out[b, :, t, s] = o
    return out


def test_compose_matches_per_pair_loop():
    g = torch.Generator().manual_seed(0)
    Bn, Hn, Tn, Sn, R = 2, 3, 4, 5, 2

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    a = r(Bn, Hn, Tn, Sn)
    qw = (r(Bn, Tn, R, Hn), r(Bn, Tn, R, Hn), r(Bn, Tn, Hn))
    kw = (r(Bn, Sn, R, Hn), r(Bn, Sn, R, Hn), r(Bn, Sn, Hn))
    static = r(Hn, Hn)
    torch.testing.assert_close(compose(a, qw, kw, static), loop_compose(a, qw, kw, static))


def reference_paper(m, x, keep):
    """Naive DCMHA paper forward: logits -> Compose_pre -> mask -> softmax -> Compose_post -> re-zero -> V."""
    Bn, Tn, _ = x.shape
    q, k, v = m.qkv(x).view(Bn, Tn, 3, H, D // H).permute(2, 0, 3, 1, 4)
    dyn = m.dynamic_weights(x)
    static = m.static if m.use_static else torch.zeros(2, H, H, dtype=x.dtype)
    logits = loop_compose(q @ k.transpose(-2, -1) / math.sqrt(D // H), dyn["pre_q"], dyn["pre_k"], static[0])
    probs = torch.softmax(logits.masked_fill(~keep, -1e300), dim=-1)
    probs = loop_compose(probs, dyn["post_q"], dyn["post_k"], static[1]).masked_fill(~keep, 0.0)
    return m.out_proj((probs @ v).transpose(1, 2).reshape(Bn, Tn, D))


def reference_repo(m, x, keep):
    """Naive damcha_repo forward, term by term as variants.md §3.2."""
    Bn, Tn, _ = x.shape
    q, k, v = m.qkv(x).view(Bn, Tn, 3, H, D // H).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)
    alpha = torch.softmax(m.router(x).view(Bn, Tn, H, H), dim=2)  # [b, t, in, out]
    composed = torch.einsum("btio,bits->bots", alpha, scores)
    g = torch.sigmoid(m.gate(x)).transpose(1, 2)[..., None]  # [b, out, t, 1]
    scores = (g * composed + (1 - g) * scores).masked_fill(~keep, float("-inf"))
    return m.out_proj((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(Bn, Tn, D))


@pytest.mark.parametrize("flavor,use_static", [("paper", False), ("paper", True), ("damcha_repo", False)])
def test_matches_naive_reference(flavor, use_static):
    m = make(causal=True, flavor=flavor, strong=True, use_static=use_static, query_chunk=3)
    x, pad = inputs()
    keep = torch.ones(T, T, dtype=torch.bool).tril() & pad[:, None, None, :]
    ref = (reference_paper if flavor == "paper" else reference_repo)(m, x, keep)
    torch.testing.assert_close(m(x, padding_mask=pad), ref.masked_fill(~pad[..., None], 0.0))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("opts", [{}, {"use_static": True, "query_chunk": 3}, {"key_wise": False, "query_chunk": 2},
                                  {"query_wise": False, "pre_compose": False}, {"post_compose": False}])
def test_chunked_core_gradients_match_autograd_reference(causal, opts):
    """The chunked core (saves softmax outputs, recomputes the rest in its own backward, skips keys a causal block
    cannot see) against plain autograd through the per-pair reference: values and all gradients, float64."""
    m = make(causal, strong=True, **opts)
    x, pad = inputs()
    keep = pad[:, None, None, :] & (torch.ones(T, T, dtype=torch.bool).tril() if causal else True)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = m(x1, padding_mask=pad)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=y.dtype)
    grads = torch.autograd.grad(y, [x1, *m.parameters()], g)
    ref = reference_paper_opts(m, x2, keep).masked_fill(~pad[..., None], 0.0)
    ref_grads = torch.autograd.grad(ref, [x2, *m.parameters()], g)
    torch.testing.assert_close(y, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def reference_paper_opts(m, x, keep):
    """reference_paper for any stage/side switches: absent terms drop out of the per-pair Compose."""
    Bn, Tn, _ = x.shape
    q, k, v = m.qkv(x).view(Bn, Tn, 3, H, D // H).permute(2, 0, 3, 1, 4)
    dyn = m.dynamic_weights(x) if m.splits else {}
    zero = (torch.zeros(Bn, Tn, 2, H, dtype=x.dtype),) * 2 + (torch.zeros(Bn, Tn, H, dtype=x.dtype),)

    def stage(a, name):
        if name not in m.stages:
            return a
        static = m.static[m.stages.index(name)] if m.use_static else torch.zeros(H, H, dtype=x.dtype)
        return loop_compose(a, dyn.get(f"{name}_q", zero), dyn.get(f"{name}_k", zero), static)

    logits = stage(q @ k.transpose(-2, -1) / math.sqrt(D // H), "pre")
    probs = torch.softmax(logits.masked_fill(~keep, -1e300), dim=-1)
    probs = stage(probs, "post").masked_fill(~keep, 0.0)
    return m.out_proj((probs @ v).transpose(1, 2).reshape(Bn, Tn, D))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("use_static", [False, True])
def test_zeroed_composition_equals_mha(causal, padded, use_static):
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal).double()
    m = make(causal, use_static=use_static)
    with torch.no_grad():  # generator outputs and gates to zero: w2 = 0, gates = tanh(0) = 0
        m.dyn_w2.zero_()
        m.dyn_d.weight.zero_()
        if use_static:
            m.static.zero_()
    m.load_state_dict(mha.state_dict(), strict=False)
    x, pad = inputs()
    pad = pad if padded else None
    torch.testing.assert_close(m(x, padding_mask=pad), mha(x, padding_mask=pad))


def test_paper_init_is_close_to_mha():
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=True).double()
    m = make(causal=True)
    m.load_state_dict(mha.state_dict(), strict=False)
    x, _ = inputs()
    y, ref = m(x), mha(x)
    assert (y - ref).abs().max() < 0.02 * ref.abs().max()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("causal", [False, True])
def test_query_chunking_is_exact(flavor, causal):
    x, pad = inputs(seq=8)
    attn_mask = torch.rand(B, H, 8, 8, generator=torch.Generator().manual_seed(3)) > 0.3
    attn_mask[:, :, 5] = False  # a fully masked query row
    outs, grads = [], []
    for chunk in (1, 3, 8):
        m = make(causal, flavor, strong=True, query_chunk=chunk)
        xi = x.clone().requires_grad_()
        y = m(xi, padding_mask=pad, attn_mask=attn_mask)
        y.square().sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(xi.grad).all()
        outs.append(y)
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    for y, g in zip(outs[1:], grads[1:]):
        torch.testing.assert_close(y, outs[0])
        for a, b in zip(g, grads[0]):
            torch.testing.assert_close(a, b)


def test_generator_w1_is_rms_normalised():
    m = make(strong=True)
    x, _ = inputs()
    dyn = m.dynamic_weights(x)
    assert sorted(dyn) == ["post_k", "post_q", "pre_k", "pre_q"]
    for w1, w2, gate in dyn.values():
        assert w1.shape == w2.shape == (B, T, 2, H) and gate.shape == (B, T, H)
        torch.testing.assert_close(w1.pow(2).mean(-1).sqrt(), torch.ones(B, T, 2, dtype=x.dtype), atol=1e-5, rtol=0)
        assert gate.abs().max() < 1
    with torch.no_grad():  # scale invariance: the w1 half of W2 scaled by 10 leaves w1 unchanged
        m.dyn_w2.view(4, -1, 2, 2, H)[:, :, 0] *= 10.0
    for (a, _, _), (b, _, _) in zip(dyn.values(), m.dynamic_weights(x).values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_repo_flavor_is_not_mha_at_init_but_causal():
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=True).double()
    m = make(causal=True, flavor="damcha_repo")
    m.load_state_dict(mha.state_dict(), strict=False)
    x, _ = inputs()
    y = m(x)
    assert (y - mha(x)).abs().max() > 1e-3  # alpha ~ 1/H, g ~ 0.5: half of every score is the head mean
    x2 = x.clone()
    x2[:, 4:] += 3.0 * torch.randn_like(x2[:, 4:])
    torch.testing.assert_close(m(x2)[:, :4], y[:, :4], rtol=0, atol=1e-12)


def test_paper_fully_masked_rows_and_causal_stay_finite():
    m = make(causal=True, strong=True)
    x, pad = inputs()
    x.requires_grad_()
    attn_mask = torch.ones(T, T, dtype=torch.bool)
    attn_mask[3] = False
    y = m(x, padding_mask=pad, attn_mask=attn_mask)
    y.square().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("d_model,n_heads,bias", [(32, 4, True), (48, 6, False), (64, 16, True), (128, 8, True)])
def test_analytic_params_match_count(flavor, d_model, n_heads, bias):
    m = zoo.create_attention("dcmha", d_model=d_model, n_heads=n_heads, flavor=flavor, bias=bias)
    assert m.analytic_params() == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(
    "opts",
    [
        {"rank": 3, "use_static": True},
        {"pre_compose": False},
        {"key_wise": False, "use_static": True},
        {"query_wise": False, "key_wise": False},
        {"pre_compose": False, "post_compose": False},
    ],
)
def test_analytic_params_match_count_options(opts):
    m = zoo.create_attention("dcmha", d_model=48, n_heads=6, **opts)
    assert m.analytic_params() == sum(p.numel() for p in m.parameters())
    x = torch.randn(2, 5, 48)
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("gelu", ["tanh", "none"])
def test_bias_and_gelu_options_count_as_the_formula(bias, gelu):
    """The references' bias-free q/k/v/o and DCFormer's PyTorch exact GELU are both buildable; their parameters
    are 4D^2 (+4D) + 20DH + 64H^2 at R = 2 (docs/variants.md §3.5)."""
    D_, H_ = 48, 6
    m = zoo.create_attention("dcmha", d_model=D_, n_heads=H_, bias=bias, gelu_approximate=gelu)
    assert m.analytic_params() == sum(p.numel() for p in m.parameters())
    assert m.analytic_params() == 4 * D_ * D_ + (4 * D_ if bias else 0) + 20 * D_ * H_ + 64 * H_ * H_
    assert (m.qkv.bias is None) == (m.out_proj.bias is None) == (not bias)


def test_gelu_choice_reaches_the_generator():
    torch.manual_seed(0)
    tanh = zoo.create_attention("dcmha", d_model=D, n_heads=H).double()
    exact = zoo.create_attention("dcmha", d_model=D, n_heads=H, gelu_approximate="none").double()
    exact.load_state_dict(tanh.state_dict())
    assert tanh.gelu_approximate == "tanh"  # the default (DCFormer's JAX code) is unchanged
    x = torch.randn(2, 5, D, dtype=torch.float64) * 3
    n, R = len(exact.splits), exact.rank
    hidden = torch.nn.functional.gelu(exact.dyn_w1(x)).view(2, 5, n, -1)  # exact GELU, by hand
    w = torch.einsum("btnc,nck->btnk", hidden, exact.dyn_w2).view(2, 5, n, 2 * R, H)
    torch.testing.assert_close(exact.dynamic_weights(x)["pre_q"][1], w[:, :, 0, R:])  # w2 of split pre_q
    assert not torch.allclose(tanh.dynamic_weights(x)["pre_q"][1], w[:, :, 0, R:])


def test_param_counts_compact_config():
    paper = zoo.create_attention("dcmha", d_model=128, n_heads=8)
    repo = zoo.create_attention("dcmha", d_model=128, n_heads=8, flavor="damcha_repo")
    assert repo.router_dim == 4 and repo.analytic_params() == 67_916  # variants.md §10
    D_, H_ = 128, 8
    assert paper.analytic_params() == 4 * D_ * D_ + 4 * D_ + 20 * D_ * H_ + 64 * H_ * H_ == 90_624


@pytest.mark.parametrize("flavor", FLAVORS)
def test_analytic_flops_match_counter(flavor):
    """The counter sees every matmul; it skips the elementwise products the paper formula counts: the gates and
    the key-wise terms (projection and expansion, 2RH MACs per pair, elementwise in the chunked core). The
    query-side terms of a stage (low rank, gate, static) run as one H x H matrix per query row: H^2 MACs per pair
    instead of the formula's 2RH (+ H^2 static), plus R H^2 per row to form the matrix."""
    m = make(flavor=flavor, use_static=flavor == "paper").eval()
    x, _ = inputs()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        m(x)
    expected = m.analytic_flops(B, T)
    if flavor == "paper":
        n_q = sum(c.endswith("_q") for c in m.splits)
        n_k = len(m.splits) - n_q
        R, pairs = m.rank, B * T * T
        expected -= 2 * pairs * len(m.splits) * H  # gates
        expected -= 2 * pairs * n_k * 2 * R * H  # key-wise terms
        expected -= 2 * pairs * n_q * 2 * R * H + (2 * pairs * len(m.stages) * H * H if m.use_static else 0)
        expected += 2 * pairs * n_q * H * H + 2 * B * T * n_q * R * H * H  # the per-row matrices
    assert counter.get_total_flops() == expected


def test_default_flops_formula():
    m = zoo.create_attention("dcmha", d_model=128, n_heads=8)
    mha = zoo.create_attention("mha", d_model=128, n_heads=8)
    Tn, D_, H_ = 64, 128, 8
    extra = 2 * Tn * (20 * D_ * H_ + 64 * H_ * H_) + 40 * H_ * Tn * Tn  # variants.md §3.5
    assert m.analytic_flops(3, Tn) - mha.analytic_flops(3, Tn) == 3 * extra


@pytest.mark.parametrize(
    "opts,arg",
    [
        ({"rank": 0}, "rank"),
        ({"query_chunk": 0}, "query_chunk"),
        ({"use_static": 1}, "use_static"),
        ({"flavor": "damcha_repo", "use_static": True}, "use_static"),
        ({"flavor": "damcha_repo", "rank": 4}, "rank"),
        ({"gelu_approximate": "erf"}, "gelu_approximate"),
        ({"flavor": "damcha_repo", "gelu_approximate": "none"}, "gelu_approximate"),
    ],
)
def test_bad_options(opts, arg):
    with pytest.raises(ValueError, match=f"^{arg}"):
        zoo.create_attention("dcmha", d_model=D, n_heads=H, **opts)


def test_capabilities():
    spec = zoo.get_attention_spec("dcmha")
    assert spec.needs_full_logits and not spec.fused_kernel and spec.flavors == FLAVORS
