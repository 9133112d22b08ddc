"""The knobs the baselines' own claims need (issue 55): THA pre-only / post-only and separate logit/softmax/value head
counts, MHA's decoupled query/key width and QK-norm, MoA's expert-load statistics. Off by default, where each variant
computes what it did before the knob existed; on, each does what its docstring says; a bad value is a ValueError
naming the option."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import attention_zoo as zoo
from attention_zoo.measure.expert_load import ExpertLoadLog, balance_stats
from attention_zoo.models import Decoder
from attention_zoo.registry import resolved_options_json
from attention_zoo.variants.masks import resolve_masks

D, H = 32, 4


def _x(T=11, dtype=torch.float64):
    return torch.randn(2, T, D, generator=torch.Generator().manual_seed(1), dtype=dtype)


def _digest(name, **kw):
    """(Σ|params|, Σ|y|) of a seeded causal module on a fixed input: the values main computed before the knobs."""
    torch.manual_seed(0)
    m = zoo.create_attention(name, d_model=D, n_heads=H, causal=True, **kw)
    x = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return sum(float(t.double().abs().sum()) for t in m.parameters()), float(m(x).double().abs().sum())


# Computed by the code before the knobs were added (main at 995a0d4); the defaults must reproduce them.
BEFORE = {("mha", ()): (370.001280257, 96.670063), ("tha", ()): (381.432135509, 88.466442),
          ("tha", (("flavor", "damcha_repo"),)): (378.001280257, 96.670063), ("moa", ()): (856.134433696, 36.060653)}


@pytest.mark.parametrize("key", list(BEFORE))
def test_defaults_compute_what_they_did_before(key):
    name, kw = key
    params, out = _digest(name, **dict(kw))
    assert params == pytest.approx(BEFORE[key][0], abs=1e-6)
    assert out == pytest.approx(BEFORE[key][1], rel=1e-6)


def test_knobs_off_keep_the_stored_cell_keys():
    assert resolved_options_json("mha", {"flavor": "paper"}) == \
        '{"bias": true, "flavor": "paper", "fused": true, "max_seq_len": null}'
    assert "pre_mix" not in resolved_options_json("tha", {"pre_mix": True})
    assert json.loads(resolved_options_json("tha", {"pre_mix": False}))["pre_mix"] is False
    assert json.loads(resolved_options_json("mha", {"qk_norm": True}))["qk_norm"] is True


# ---- THA ----------------------------------------------------------------------------------------------------------
def _tha_reference(m, x, causal):
    """Talking heads written out with einsums over h_k, h, h_v (docs/variants.md §2.1)."""
    B, T, _ = x.shape
    q, k, v = m.qkv(x).split(D, -1)
    q = q.view(B, T, m.h_k, -1).transpose(1, 2)
    k = k.view(B, T, m.h_k, -1).transpose(1, 2)
    v = v.view(B, T, m.h_v, -1).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D / m.h_k)
    if m.pre_proj is not None:
        logits = torch.einsum("oi,bits->bots", m.pre_proj.weight, logits)
    if causal:
        logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    w = logits.softmax(-1)
    if m.post_proj is not None:
        w = torch.einsum("oi,bits->bots", m.post_proj.weight, w)
    return m.out_proj((w @ v).transpose(1, 2).reshape(B, T, D))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kw", [{}, {"pre_mix": False}, {"post_mix": False}, {"logit_heads": 8},
                                {"value_heads": 2}, {"logit_heads": 8, "value_heads": 2, "mix_init": "identity"}])
def test_tha_knobs_compute_talking_heads(kw, causal):
    torch.manual_seed(0)
    m = zoo.create_attention("tha", d_model=D, n_heads=H, causal=causal, **kw).double()
    x = _x(70)  # more than one 64-row block of the blocked core
    torch.testing.assert_close(m(x), _tha_reference(m, x, causal), rtol=1e-9, atol=1e-10)
    assert sum(p.numel() for p in m.parameters()) == m.analytic_params()


def test_tha_ablations_drop_their_mix():
    pre_only = zoo.create_attention("tha", d_model=D, n_heads=H, post_mix=False)
    post_only = zoo.create_attention("tha", d_model=D, n_heads=H, pre_mix=False)
    assert pre_only.post_proj is None and pre_only.pre_proj is not None
    assert post_only.pre_proj is None and post_only.post_proj is not None
    full = zoo.create_attention("tha", d_model=D, n_heads=H)
    assert full.analytic_params() - pre_only.analytic_params() == H * H
    assert full.analytic_flops(1, 16) - post_only.analytic_flops(1, 16) == 2 * 16 * 16 * H * H


def test_tha_unequal_heads_shapes_costs_and_padding():
    m = zoo.create_attention("tha", d_model=D, n_heads=H, causal=True, logit_heads=8, value_heads=2).double()
    assert (m.pre_proj.weight.shape, m.post_proj.weight.shape) == ((H, 8), (2, H))
    assert m.rotary_widths() == (D // 8,) and m.compute_path("cpu", torch.float32).startswith("explicit")
    pad = torch.ones(2, 11, dtype=torch.bool)
    pad[1, 7:] = False
    y = m(_x(), padding_mask=pad)
    assert y[1, 7:].abs().max() == 0 and torch.isfinite(y).all()
    y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    # the general core on equal head counts is the blocked core
    sq = zoo.create_attention("tha", d_model=D, n_heads=H, causal=True).double()
    masks = resolve_masks(2, 11, H, True, None, None, torch.device("cpu"), None)
    torch.testing.assert_close(sq.out_proj(sq._general_core(_x(), masks, None)), sq(_x()))


@pytest.mark.parametrize("kw, option", [({"pre_mix": False, "post_mix": False}, "pre_mix"),
                                        ({"logit_heads": 3}, "logit_heads"), ({"value_heads": 0}, "value_heads"),
                                        ({"logit_heads": 8, "pre_mix": False}, "logit_heads"),
                                        ({"value_heads": 2, "post_mix": False}, "value_heads"),
                                        ({"pre_mix": "no"}, "pre_mix"), ({"logit_heads": 2.0}, "logit_heads")])
def test_tha_bad_knob_values(kw, option):
    with pytest.raises(ValueError, match=f"^{option}:"):
        zoo.create_attention("tha", d_model=D, n_heads=H, **kw)


# ---- MHA ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qk_dim", [8, 16, 32, 64])
def test_mha_qk_dim_decouples_the_key_size(qk_dim, causal):
    torch.manual_seed(0)
    m = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal, qk_dim=qk_dim).double()
    unfused = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal, qk_dim=qk_dim, fused=False).double()
    unfused.load_state_dict(m.state_dict())
    x = _x()
    q, k, v = m.qkv(x).split((qk_dim, qk_dim, D), -1)
    q, k, v = (t.view(2, 11, H, -1).transpose(1, 2) for t in (q, k, v))
    ref = m.out_proj(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=(qk_dim / H) ** -0.5)
                     .transpose(1, 2).reshape(2, 11, D))
    torch.testing.assert_close(m(x), ref)
    torch.testing.assert_close(unfused(x), ref)
    assert m.qkv.weight.shape == (2 * qk_dim + D, D)
    assert sum(p.numel() for p in m.parameters()) == m.analytic_params()
    assert m.analytic_flops(1, 11) == 4 * 11 * D * qk_dim + 4 * 11 * D * D + 2 * 121 * qk_dim + 2 * 121 * D


def test_mha_qk_dim_equal_to_width_is_the_default():
    torch.manual_seed(0)
    a = zoo.create_attention("mha", d_model=D, n_heads=H)
    torch.manual_seed(0)
    b = zoo.create_attention("mha", d_model=D, n_heads=H, qk_dim=D)
    assert all(torch.equal(a.state_dict()[n], b.state_dict()[n]) for n in a.state_dict())
    assert torch.equal(a(_x(dtype=torch.float32)), b(_x(dtype=torch.float32)))


@pytest.mark.parametrize("causal", [False, True])
def test_mha_qk_norm_normalises_queries_and_keys(causal):
    torch.manual_seed(0)
    m = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal, qk_norm=True).double()
    with torch.no_grad():
        for ln in (m.q_norm, m.k_norm):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.1, 0.1)
    x = _x()
    q, k, v = (t.view(2, 11, H, -1).transpose(1, 2) for t in m.qkv(x).split(D, -1))
    q, k = m.q_norm(q), m.k_norm(k)
    ref = m.out_proj(F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2).reshape(2, 11, D))
    torch.testing.assert_close(m(x), ref)
    assert sum(p.numel() for p in m.parameters()) == m.analytic_params() == 4 * D * D + 4 * D + 4 * (D // H)
    dec = Decoder(40, D, 2, H, attention="mha", attention_options={"qk_norm": True, "qk_dim": 16}, positions="rope")
    assert torch.isfinite(dec(torch.randint(40, (2, 12))).logits).all()


@pytest.mark.parametrize("kw, option", [({"qk_dim": 6}, "qk_dim"), ({"qk_dim": 0}, "qk_dim"),
                                        ({"qk_dim": "16"}, "qk_dim"), ({"qk_norm": 1}, "qk_norm")])
def test_mha_bad_knob_values(kw, option):
    with pytest.raises(ValueError, match=f"^{option}:"):
        zoo.create_attention("mha", d_model=D, n_heads=H, **kw)


def test_swap_with_qk_norm_copies_no_query_key_weights():
    host = torch.nn.TransformerEncoderLayer(D, H, batch_first=True)
    with pytest.warns(UserWarning, match="q, k"):
        zoo.swap_attention(host, "mha", qk_norm=True)


# ---- MoA expert load -------------------------------------------------------------------------------------------------
def test_balance_statistics():
    even = balance_stats([5, 5, 5, 5])
    assert even["expert_load_cv"] == 0 and even["expert_load_entropy"] == pytest.approx(1.0)
    assert even["expert_load_max_share"] == 0.25 and even["expert_load_unused"] == 0
    one = balance_stats([0, 12, 0, 0])
    assert one["expert_load_entropy"] == 0 and one["expert_load_cv"] == pytest.approx(math.sqrt(3))
    assert one["expert_load_max_share"] == 1 and one["expert_load_unused"] == 0.75
    assert math.isnan(balance_stats([0, 0])["expert_load_cv"])
    for bad in ([], [[1, 2]], [-1, 2], [float("nan")]):
        with pytest.raises(ValueError, match="^load:"):
            balance_stats(bad)


def test_expert_load_log_sums_the_routing_of_every_layer():
    torch.manual_seed(0)
    dec = Decoder(40, D, 2, H, attention="moa", attention_options={"n_experts": 4, "top_k": 2})
    tokens = torch.randint(40, (3, 10))
    pad = torch.ones(3, 10, dtype=torch.bool)
    pad[2, 6:] = False
    with ExpertLoadLog(dec) as log:
        dec(tokens, pad)
        dec(tokens, pad)
    rows = log.rows()
    assert {r["layer_index"] for r in rows} == {0, 1}
    for r in rows:
        counts = json.loads(r["expert_load"])
        assert sum(counts) == 2 * 2 * int(pad.sum())  # two forwards × k slots × real tokens
    assert len(ExpertLoadLog(Decoder(40, D, 1, H)).modules) == 0  # no routing attention, nothing logged


# ---- seed ensembles (engine.ensemble) ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant, options", [
    ("tha", {"pre_mix": False}), ("tha", {"post_mix": False}), ("tha", {"logit_heads": 8, "value_heads": 2}),
    ("mha", {"qk_dim": 8}), ("mha", {"qk_norm": True}), ("mha", {"qk_dim": 16, "qk_norm": True})])
def test_knobs_group_into_seed_ensembles(variant, options):
    from attention_zoo.engine.ensemble import group_models

    models = []
    for s in range(3):
        torch.manual_seed(s)
        m = Decoder(11, 16, 2, 4, attention=variant, attention_options=options, max_seq_len=8).double()
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + s), dtype=p.dtype))
        models.append(m)
    grouped = group_models(models)
    x = torch.randint(11, (3, 2, 8))
    got = grouped(x.flatten(0, 1)).logits
    torch.testing.assert_close(got, torch.cat([m(x[i]).logits for i, m in enumerate(models)]), rtol=1e-10,
                               atol=1e-12)
