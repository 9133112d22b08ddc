"""DAMCHA against the authors' semantics: generator dropout, free_M, compact rank, static M0, head_metrics."""

import math

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.variants.damcha import set_block_scales
from attention_zoo.variants.damcha_generator import MetricConfig, StructuredMLPForM

D, H, B, T = 16, 4, 2, 6
dh = D // H


def x_and_pad():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, 4:] = False
    return x, pad


def dropouts(module):
    return [m.p for m in module.modules() if isinstance(m, torch.nn.Dropout)]


def generator(**cfg):
    torch.manual_seed(0)
    cfg.setdefault("hidden_dims", (8,))
    return StructuredMLPForM(D, H, config=MetricConfig(**cfg)).double().eval()


# ---- 1. generator dropout follows the layer's ------------------------------------------------------------------
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_generator_dropout_follows_layer_dropout(dropout):
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, dropout=dropout, hidden_dims=(8, 8))
    assert dropouts(attn.generator) == [dropout, dropout]
    assert attn.generator.cfg.gen_dropout == dropout


def test_explicit_gen_dropout_wins():
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, dropout=0.0, hidden_dims=(8,), gen_dropout=0.3)
    assert dropouts(attn.generator) == [0.3]


@pytest.mark.parametrize("attn_dropout", [0.0, 0.15])
def test_stack_shared_generator_takes_the_attention_dropout(attn_dropout):
    model = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attn_dropout=attn_dropout, attention_options={"hidden_dims": (8,)})
    assert dropouts(model.stack.shared) == [attn_dropout]


def test_train_mode_without_dropout_is_deterministic():
    x, pad = x_and_pad()
    torch.manual_seed(0)
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, causal=True, hidden_dims=(8,)).double().train()
    assert_close(attn(x, padding_mask=pad), attn(x, padding_mask=pad), rtol=0, atol=0)
    torch.manual_seed(0)
    model = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8, 8)}).train()
    tokens = torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(1))
    assert_close(model(tokens).logits, model(tokens).logits, rtol=0, atol=0)
    # ... and with generator dropout the two forwards differ, so the check above can fail
    noisy = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8, 8), "gen_dropout": 0.5}).train()
    assert not torch.equal(noisy(tokens).logits, noisy(tokens).logits)


# ---- 2. free_M: the raw generator output is the metric, whatever off_diag_mode ------------------------------
@pytest.mark.parametrize("mode", ["linear_comb", "bayesian", "separate_B"])
@pytest.mark.parametrize("fused", [True, False])
def test_free_M_uses_the_raw_output(mode, fused):
    gen = generator(off_diag_mode=mode, free_M=True, fused_rowsum=fused, diag_scale=0.5, off_diag_scale=2.0)
    x, pad = x_and_pad()
    with torch.no_grad():
        ctx = (x * pad[..., None]).sum(1) / pad.sum(1, keepdim=True)
        raw = gen.out(gen.trunk(ctx)).reshape(B, H, dh, H, dh)  # M = reshape(f(c)), row-major
        S = torch.full((H, H), 2.0, dtype=x.dtype).fill_diagonal_(0.5)
        expected = (raw * S[:, None, :, None]).sum(3)  # RowSum of the block-scaled raw M
        assert_close(gen.head_metrics(x, False, pad), expected)
        assert gen.fused == fused
    # without free_M the mode does shape the metric, so the test above distinguishes the two
    ref = generator(off_diag_mode=mode, fused_rowsum=fused, diag_scale=0.5, off_diag_scale=2.0)
    assert not torch.allclose(ref.head_metrics(x, False, pad).detach(), expected)


# ---- 3. compact rank: M = U Vᵀ / √r, off_diag_mode skipped ---------------------------------------------------
@pytest.mark.parametrize("mode", ["mlp", "linear_comb", "separate_B"])
@pytest.mark.parametrize("fused", [True, False])
def test_compact_rank_skips_off_diag_mode(mode, fused):
    r = 3
    gen = generator(off_diag_mode=mode, compact_rank=r, fused_rowsum=fused)
    x, _ = x_and_pad()
    with torch.no_grad():
        out = gen.out(gen.trunk(x.mean(1)))  # (B, 2·D·r)
        U, V = out.reshape(B, 2, D, r).unbind(1)
        M = U @ V.transpose(1, 2) / math.sqrt(r)
        expected = M.reshape(B, H, dh, H, dh).sum(3)
        assert_close(gen.head_metrics(x, causal=False), expected)
        assert_close(gen.full_metric(gen.trunk(x.mean(1)), gen.sample_alpha(), None).reshape(B, D, D), M)


# ---- 4. static M0 takes no block scales (as the authors) -----------------------------------------------------
def test_static_metric_has_no_block_scales():
    with pytest.raises(ValueError, match="^off_diag_scale:"):
        zoo.create_attention("damcha", d_model=D, n_heads=H, use_mlp=False, off_diag_scale=0.0)
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, use_mlp=False).double()
    with torch.no_grad():
        attn.M0.copy_(torch.randn(D, D, dtype=torch.float64))
    assert_close(attn.static_metrics(), attn.M0.reshape(H, dh, H, dh).sum(2))
    assert_close(attn.get_M_matrices()[0][1], attn.M0.detach())
    with pytest.raises(ValueError, match="^model:"):
        set_block_scales(attn, 1.0, 0.0)
    with pytest.raises(ValueError, match="^diag_scale:"):
        set_block_scales(zoo.create_attention("damcha", d_model=D, n_heads=H), float("nan"), 0.0)


# ---- 5. public head_metrics / forward -------------------------------------------------------------------------
def test_head_metrics_shapes_and_values():
    gen = generator()
    x, pad = x_and_pad()
    with torch.no_grad():
        m = gen.head_metrics(x, False, pad)
        assert m.shape == (B, H, dh, dh)
        ctx = (x * pad[..., None]).sum(1) / pad.sum(1, keepdim=True)
        assert_close(m, gen.out(gen.trunk(ctx)).reshape(B, H, dh, H, dh).sum(3))
        mc = gen(x, True, pad)  # forward == head_metrics
        assert mc.shape == (B, T, H, dh, dh)
        for t in range(T):  # position t uses the mean of the real tokens up to t
            p = pad[:, : t + 1]
            c = (x[:, : t + 1] * p[..., None]).sum(1) / p.sum(1, keepdim=True).clamp(min=1)
            assert_close(mc[:, t], gen.out(gen.trunk(c)).reshape(B, H, dh, H, dh).sum(3))
        poisoned = x.clone()
        poisoned[~pad] = float("nan")
        assert_close(gen.head_metrics(poisoned, False, pad), m)
    with pytest.raises(ValueError, match="^x:"):
        gen.head_metrics(x[0])
    with pytest.raises(ValueError, match="^layer_idx:"):
        gen.head_metrics(x, layer_idx=3)


@pytest.mark.parametrize("causal", [False, True])
def test_layer_output_matches_head_metrics_by_hand(causal):
    torch.manual_seed(0)
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, causal=causal, hidden_dims=(8,)).double().eval()
    x, pad = x_and_pad()
    with torch.no_grad():
        m = attn.generator.head_metrics(x, causal, pad)
        xh = x.view(B, T, H, dh).transpose(1, 2)  # (B, H, T, dh): raw slices X_i
        q = xh @ m if not causal else torch.einsum("bhta,bthac->bhtc", xh, m)
        s = q @ xh.transpose(-1, -2) / math.sqrt(dh)
        keep = pad[:, None, None, :].expand(B, H, T, T)
        if causal:
            keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
        a = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
        v = attn.v_proj(x).view(B, T, H, dh).transpose(1, 2)
        y = attn.out_proj((a @ v).transpose(1, 2).reshape(B, T, D)) * pad[..., None]
        assert_close(attn(x, padding_mask=pad), y)
