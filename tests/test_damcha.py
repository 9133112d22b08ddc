"""DAMCHA-specific invariants (variants.md §7.7) and parameter counts (§10)."""

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.variants.base import StackShare
from attention_zoo.variants.damcha import set_block_scales
from attention_zoo.variants.damcha_generator import MetricConfig, StructuredMLPForM, token_context

D, H, B, T = 16, 4, 2, 6
dh = D // H


def damcha(causal=False, dtype=torch.float64, seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("hidden_dims", (8, 12))
    return zoo.create_attention("damcha", d_model=D, n_heads=H, causal=causal, **kw).to(dtype).eval()


def x_and_pad(dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, D, generator=g, dtype=dtype)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, 4:] = False
    return x, pad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.7, 0.2)])
@pytest.mark.parametrize("extra", [{}, {"compact_rank": 3}, {"use_layer_bias": True, "layer_bias_rank": 2},
                                   {"compact_rank": 2, "use_layer_bias": True, "layer_bias_rank": 2}],
                         ids=["plain", "compact", "layer_bias", "compact+layer_bias"])
def test_fused_rowsum_equals_explicit_values_and_gradients(causal, scales, extra):
    # layer 1 of 2 without sharing: the layer builds its own generator and uses layer_idx 1's bias
    opts = dict(diag_scale=scales[0], off_diag_scale=scales[1], stack=StackShare(None, layer_idx=1, n_layers=2),
                **extra)
    fused = damcha(causal, fused_rowsum=True, **opts)
    explicit = damcha(causal, fused_rowsum=False, **opts)
    explicit.load_state_dict(fused.state_dict())
    assert fused.generator.fused and not explicit.generator.fused
    x, pad = x_and_pad()
    grads = []
    for attn in (fused, explicit):
        xi = x.clone().requires_grad_(True)
        y = attn(xi, padding_mask=pad)
        (y * torch.linspace(-1, 1, D, dtype=y.dtype)).sum().backward()
        grads.append((y.detach(), xi.grad, {n: p.grad for n, p in attn.named_parameters()}))
    assert_close(grads[0][0], grads[1][0])
    assert_close(grads[0][1], grads[1][1])
    for n in grads[0][2]:
        assert_close(grads[0][2][n], grads[1][2][n], msg=f"parameter gradient {n}")


def test_scores_use_raw_head_slices_and_rowsum():
    """Scores of head i are X_i m_i X_iᵀ/√dh with m_i = Σ_j M_ij, checked against a direct computation."""
    attn = damcha(False, fused_rowsum=False)
    x, _ = x_and_pad()
    gen = attn.generator
    ctx = x.mean(1)
    M = gen.full_metric(gen.trunk(ctx), None, 0).reshape(B, D, D)
    v = attn.v_proj(x).view(B, T, H, dh).transpose(1, 2)
    out = []
    for i in range(H):
        Xi = x[..., i * dh : (i + 1) * dh]
        mi = sum(M[:, i * dh : (i + 1) * dh, j * dh : (j + 1) * dh] for j in range(H))
        S = Xi @ mi @ Xi.transpose(1, 2) / dh**0.5
        out.append(torch.softmax(S, -1) @ v[:, i])
    ref = attn.out_proj(torch.cat(out, -1))
    assert_close(attn(x), ref)


def test_metric_depends_on_input_but_not_on_padding():
    attn = damcha(False)
    x, pad = x_and_pad()
    attn(x, padding_mask=pad)
    M1 = attn.get_M_matrices()[0][1]
    x2 = x.clone()
    x2[~pad] = 50.0
    attn(x2, padding_mask=pad)
    assert_close(attn.get_M_matrices()[0][1], M1, msg="padding content changed the metric")
    attn(x + 1.0, padding_mask=pad)
    assert not torch.allclose(attn.get_M_matrices()[0][1], M1), "metric must depend on the input"
    ctx = token_context(x, pad, causal=True)
    assert_close(ctx[1, 5], x[1, :4].mean(0))  # prefix mean over real tokens only


@pytest.mark.parametrize("chunk", [1, 4, None])
def test_causal_query_chunking_is_exact(chunk):
    ref, attn = damcha(True, query_chunk=T), damcha(True, query_chunk=chunk)
    x, pad = x_and_pad()
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = ref(xa, padding_mask=pad), attn(xb, padding_mask=pad)
    assert_close(yb, ya)
    ya.sum().backward()
    yb.sum().backward()
    assert_close(xb.grad, xa.grad)
    assert_close(attn.generator.out.weight.grad, ref.generator.out.weight.grad)


def test_causal_path_never_stores_per_position_metrics():
    """Autograd must not keep [B,T,H,dh,dh]: every saved tensor is O(B·T·D) or a parameter-sized tensor."""
    torch.manual_seed(0)
    Bb, Tt, Dd, Hh = 2, 64, 32, 2  # dh = 16, so one per-position metric tensor is B·T·D·dh = 65,536 elements
    attn = zoo.create_attention("damcha", d_model=Dd, n_heads=Hh, causal=True, hidden_dims=(8,), query_chunk=8)
    x = torch.randn(Bb, Tt, Dd, requires_grad=True)
    params = {p.data_ptr() for p in attn.parameters()}
    sizes = []

    def pack(t):
        if t.data_ptr() not in params:
            sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = attn(x)
    y.sum().backward()
    per_position_metrics = Bb * Tt * Dd * (Dd // Hh)
    assert sum(sizes) < per_position_metrics, (sum(sizes), per_position_metrics)


def test_shared_generator_called_once_and_referenced_by_every_layer():
    model = zoo.models.Decoder(vocab_size=20, d_model=D, n_layers=3, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8,)})
    gen = model.stack.shared
    assert isinstance(gen, StructuredMLPForM)
    assert all(layer.attn.metric_generator is gen for layer in model.stack.layers)
    calls = []
    gen.trunk.register_forward_hook(lambda *a: calls.append(1))
    model(torch.randint(0, 20, (2, 5)))
    assert len(calls) == 1
    # counted once: no duplicate parameters under the layers
    names = [n for n, _ in model.named_parameters()]
    assert sum(n.startswith("stack.shared.") for n in names) == len(list(gen.parameters()))
    assert not any(".attn._shared" in n or ".attn.generator" in n for n in names)


@pytest.mark.parametrize("share", [True, False])
def test_all_parameters_registered_at_construction_and_trained(share):
    model = zoo.models.Decoder(vocab_size=20, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8,)}, share_mlp=share)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n_opt = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n_opt == sum(p.numel() for p in model.parameters())
    gens = [m for m in model.modules() if isinstance(m, StructuredMLPForM)]
    assert len(gens) == (1 if share else 2)
    before = [p.detach().clone() for p in model.parameters()]
    out = model(torch.randint(0, 20, (2, 5)))
    out.logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("mode", ["mlp", "linear_comb", "bayesian", "separate_B"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_off_diag_mode_backpropagates(mode, causal):
    attn = damcha(causal, off_diag_mode=mode, compact_rank=0).train()
    x, pad = x_and_pad()
    y = attn(x.requires_grad_(True), padding_mask=pad)
    loss = y.square().mean() + (attn.generator.aux_loss if attn.generator.aux_loss is not None else 0)
    loss.backward()
    for n, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), (mode, n)


def test_bayesian_kl_reaches_the_loss():
    model = zoo.models.Decoder(vocab_size=20, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8,), "off_diag_mode": "bayesian"})
    out = model(torch.randint(0, 20, (2, 5)))
    gen = model.stack.shared
    assert_close(out.aux_loss, gen.cfg.kl_weight * gen.kl_divergence())
    assert out.aux_loss > 0
    out.aux_loss.backward()
    assert gen.alpha_logvar.grad.abs().sum() > 0
    unshared = zoo.models.Decoder(vocab_size=20, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                                  share_mlp=False, attention_options={"hidden_dims": (8,), "off_diag_mode": "bayesian"})
    out = unshared(torch.randint(0, 20, (2, 5)))
    total = sum(layer.attn.get_kl_divergence() for layer in unshared.stack.layers) * gen.cfg.kl_weight
    assert_close(out.aux_loss, total)  # unshared: the sum over layers


def test_block_scales_act_on_final_metric():
    gen = StructuredMLPForM(D, H, config=MetricConfig(hidden_dims=(8,), use_layer_bias=True, layer_bias_rank=2))
    z = gen.trunk(torch.randn(3, D))
    full = gen.full_metric(z, None, 0)
    eye = torch.eye(H)[:, None, :, None]
    gen.block_scales = (0.0, 1.0)
    assert_close(gen.full_metric(z, None, 0), full * (1 - eye))
    gen.block_scales = (1.0, 0.0)
    assert_close(gen.full_metric(z, None, 0), full * eye)
    attn = damcha(False)
    set_block_scales(attn, 1.0, 0.0)
    assert attn.generator.block_scales == (1.0, 0.0)


def test_off_diagonal_structures():
    cfg = dict(hidden_dims=(8,))
    z = torch.randn(2, 8)
    lc = StructuredMLPForM(D, H, config=MetricConfig(off_diag_mode="linear_comb", **cfg))
    M = lc.full_metric(z, lc.alpha, None)
    diag = torch.stack([M[:, k, :, k, :] for k in range(H)], 1)  # (B, H, dh, dh)
    assert_close(M[:, 0, :, 1, :], torch.einsum("k,bkac->bac", lc.alpha[0, 1], diag))
    sb = StructuredMLPForM(D, H, config=MetricConfig(off_diag_mode="separate_B", **cfg))
    M = sb.full_metric(z, None, None)
    assert_close(M[:, 2, :, 0, :], sb.B.reshape(H, dh, H, dh)[2, :, 0, :].expand(2, dh, dh))
    cr = StructuredMLPForM(D, H, config=MetricConfig(compact_rank=2, **cfg))
    M = cr.full_metric(z, None, None).reshape(2, D, D)
    assert torch.linalg.matrix_rank(M[0]).item() <= 2


def test_static_metric_starts_at_identity_and_trains():
    attn = damcha(False, use_mlp=False)
    assert_close(attn.static_metrics(), torch.eye(dh, dtype=torch.float64).expand(H, dh, dh))
    assert attn.get_M_matrices()[0][0] == "attn.M0"
    model = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=1, n_heads=H, attention="damcha",
                               attention_options={"use_mlp": False})
    from attention_zoo.variants.damcha import StaticMetric

    assert isinstance(model.stack.shared, StaticMetric)  # "w/o f(x)" keeps sharing: one M0 for the stack
    two = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                             attention_options={"use_mlp": False}, share_mlp=False)
    assert two.stack.shared is None  # "w/o both": one M0 per layer
    assert two.stack.layers[0].attn.static_M0 is not two.stack.layers[1].attn.static_M0
    three = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"use_mlp": False})
    assert three.stack.layers[0].attn.static_M0 is three.stack.layers[1].attn.static_M0
    assert sum(p.numel() for p in three.parameters()) + D * D == sum(p.numel() for p in two.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.arange(11).repeat(2, 1)[:, :10]  # a deterministic cycle: learnable
    losses = []
    for _ in range(30):
        out = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 11), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert not torch.equal(model.stack.layers[0].attn.static_M0, torch.eye(D))


def test_use_M_false_is_standard_attention():
    attn = damcha(False, use_M=False)
    mha = zoo.create_attention("mha", d_model=D, n_heads=H).double().eval()
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        mha.qkv.bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        mha.out_proj.load_state_dict(attn.out_proj.state_dict())
    x, pad = x_and_pad()
    assert_close(attn(x, padding_mask=pad), mha(x, padding_mask=pad))
    assert attn.get_M_matrices() == []


def test_get_M_matrices_per_layer_and_causal_final_prefix():
    model = zoo.models.Decoder(vocab_size=20, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8,)}).eval()
    tokens = torch.randint(0, 20, (3, 5))
    model(tokens)
    mats = model.get_M_matrices()
    assert [n for n, _ in mats] == ["stack.layers.0.attn.M", "stack.layers.1.attn.M"]
    assert mats[0][1].shape == (D, D)
    assert_close(mats[0][1], mats[1][1])  # pure sharing without layer bias: identical in every layer
    gen = model.stack.shared
    x0 = model.tok_emb(tokens) + model.pos_emb[:5]
    expected = gen.full_metric(gen.trunk(x0.mean(1)), None, None).mean(0).reshape(D, D)
    assert_close(mats[0][1], expected.detach())
    assert zoo.models.Decoder(20, D, 1, H).get_M_matrices() == []


def test_parameter_counts_compact_config():
    """variants.md §10 at D=128, H=8."""
    def gen(**kw):
        return StructuredMLPForM(128, 8, n_layers=4, config=MetricConfig(**kw)).analytic_params()

    assert gen() == 8_569_600
    assert gen(hidden_dims=()) == 2_113_536
    assert gen(hidden_dims=(), compact_rank=4) == 132_096
    assert gen(compact_rank=4) == 689_920
    assert gen(use_layer_bias=True) - gen() == 4_160
    assert gen(off_diag_mode="linear_comb") - gen() == 512
    assert gen(off_diag_mode="bayesian") - gen() == 1_024
    assert gen(off_diag_mode="separate_B") - gen() == 16_384
    real = StructuredMLPForM(128, 8, n_layers=4, config=MetricConfig(use_layer_bias=True))
    assert real.analytic_params() == sum(p.numel() for p in real.parameters())
    shared_layer = zoo.models.Decoder(10, 128, 4, 8, attention="damcha").stack.layers[0].attn
    assert shared_layer.analytic_params() == 33_024 == sum(p.numel() for p in shared_layer.parameters())
    static = zoo.create_attention("damcha", d_model=128, n_heads=8, use_mlp=False)
    assert static.analytic_params() == 49_408
    mha_stack = 4 * zoo.create_attention("mha", d_model=128, n_heads=8).analytic_params()
    assert mha_stack == 264_192
    assert 4 * 33_024 + 8_569_600 == 8_701_696  # shared DAMCHA stack (§10)


@pytest.mark.parametrize("cache", ["store", "recompute"])
def test_analytic_flops_shared_stack_counts_generator_once(cache):
    opts = {"hidden_dims": (8,), "metric_cache": cache}
    model = zoo.models.Decoder(10, D, 3, H, attention="damcha", attention_options=opts)
    model_c = zoo.models.Decoder(10, D, 3, H, attention="damcha", attention_options=opts, share_mlp=False)
    shared_total = model.stack.shared.analytic_flops(1, T) + sum(
        layer.attn.analytic_flops(1, T) for layer in model.stack.layers)
    unshared_total = sum(layer.attn.analytic_flops(1, T) for layer in model_c.stack.layers)
    gen = model.stack.shared
    trunk, head = gen.trunk_flops(1, T), gen.head_flops(1, T)
    # causal: trunk once instead of three times; stored metrics: the final layer once too
    assert unshared_total - shared_total == 2 * trunk + (2 * head if cache == "store" else 0)
