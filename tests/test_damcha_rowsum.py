"""DAMCHA under RowSum (variants.md §7.4, derived property): gradient identity and the collapsed generator."""

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.variants.damcha_generator import (
    MetricConfig,
    StructuredMLPForM,
    adam_param_groups,
    collapse_generator,
)

D, H, V = 16, 4, 30
dh = D // H


def decoder(collapsed, seed=0, **opts):
    """Built in float64 from the start, so the collapsed init is folded without float32 rounding."""
    torch.manual_seed(seed)
    options = {"hidden_dims": (8,), "gen_dropout": 0.0, "collapsed_generator": collapsed, **opts}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return zoo.models.Decoder(V, D, 2, H, attention="damcha", attention_options=options)
    finally:
        torch.set_default_dtype(default)


def lm_loss(model, tokens):
    out = model(tokens[:, :-1])
    return F.cross_entropy(out.logits.reshape(-1, V), tokens[:, 1:].reshape(-1)) + out.aux_loss


def train(model, steps, clip=None, eps=1e-8, scale_eps=True):
    groups = adam_param_groups(model, eps=eps) if scale_eps else [{"params": list(model.parameters()), "eps": eps}]
    opt = torch.optim.AdamW(groups, lr=3e-3, weight_decay=0.05)
    losses = []
    for step in range(steps):
        tokens = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(step))
        loss = lm_loss(model, tokens)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def head_metrics(model, probe):
    gen = model.stack.shared
    z = gen.trunk(probe)
    return gen.metric_fn(None, None)(z)


@pytest.mark.parametrize("causal_fused", [True, False])
def test_every_block_of_a_block_row_gets_the_same_gradient(causal_fused):
    torch.manual_seed(0)
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, causal=causal_fused, hidden_dims=(8,),
                                fused_rowsum=causal_fused).double()
    attn(torch.randn(3, 7, D, dtype=torch.float64)).square().sum().backward()
    g = attn.generator.out.weight.grad.unflatten(0, (H, dh, H, dh))  # (i, a, j, c, w)
    for j in range(1, H):
        assert_close(g[:, :, j], g[:, :, 0], msg=f"block column {j} differs")
    assert g.abs().sum() > 0


def test_gradient_identity_stops_outside_mlp_mode():
    torch.manual_seed(0)
    attn = zoo.create_attention("damcha", d_model=D, n_heads=H, hidden_dims=(8,), off_diag_mode="separate_B").double()
    attn(torch.randn(3, 7, D, dtype=torch.float64)).square().sum().backward()
    g = attn.generator.out.weight.grad.unflatten(0, (H, dh, H, dh))
    assert not torch.allclose(g[:, :, 1], g[:, :, 0])  # off-diagonal outputs unused there: zero gradient


def test_collapsed_generator_counts_and_initial_function():
    full, col = decoder(False), decoder(True)
    tokens = torch.randint(0, V, (2, 9))
    assert_close(col(tokens).logits, full(tokens).logits)
    g_full, g_col = full.stack.shared, col.stack.shared
    assert g_full.analytic_params() - g_col.analytic_params() == 8 * (D * D - D * dh) + (D * D - D * dh)
    assert g_col.analytic_params() == sum(p.numel() for p in g_col.parameters())
    converted = collapse_generator(g_full)
    probe = torch.randn(5, D, dtype=torch.float64)
    assert_close(head_metrics(col, probe), converted.metric_fn(None, None)(converted.trunk(probe)))


def test_collapsed_follows_the_full_trajectory_under_adamw_exactly():
    """Exact conditions: AdamW (decoupled decay), eps·H for the collapsed layer, no global-norm clipping."""
    full, col = decoder(False), decoder(True)
    lf, lc = train(full, 12), train(col, 12)
    assert_close(torch.tensor(lc), torch.tensor(lf), rtol=1e-10, atol=1e-10)
    probe = torch.randn(5, D, dtype=torch.float64)
    assert_close(head_metrics(col, probe), head_metrics(full, probe), rtol=1e-8, atol=1e-10)
    assert lf[0] != lf[-1]  # the models did train


def test_collapsed_equivalence_is_approximate_with_clipping_or_unscaled_eps():
    lf = train(decoder(False), 6, clip=0.05)
    lc = train(decoder(True), 6, clip=0.05)
    gap_clip = max(abs(a - b) for a, b in zip(lf, lc))
    assert gap_clip > 1e-9, "global-norm clipping sees H copies of the gradient in the full model"
    lf = train(decoder(False), 6, eps=1e-3, scale_eps=False)
    lc = train(decoder(True), 6, eps=1e-3, scale_eps=False)
    gap_eps = max(abs(a - b) for a, b in zip(lf, lc))
    assert 1e-9 < gap_eps < 0.1, gap_eps


def test_diagonal_only_equals_full_over_H_when_blocks_coincide():
    """Table 3's reading: if the H blocks of each block-row are equal (they only differ by their initial values,
    which training does not change), diagonal-only inference is the full metric scaled by 1/H."""
    gen = StructuredMLPForM(D, H, config=MetricConfig(hidden_dims=(8,)))
    with torch.no_grad():
        W = gen.out.weight.unflatten(0, (H, dh, H, dh))
        W.copy_(W[:, :, :1].expand_as(W))
        b = gen.out.bias.unflatten(0, (H, dh, H, dh))
        b.copy_(b[:, :, :1].expand_as(b))
    z = gen.trunk(torch.randn(3, D))
    full = gen.metric_fn(None, None)(z)
    gen.block_scales = (1.0, 0.0)
    assert_close(gen.metric_fn(None, None)(z), full / H)


def test_collapsed_option_validation_and_inspection():
    with pytest.raises(ValueError, match="^collapsed_generator:"):
        zoo.create_attention("damcha", d_model=D, n_heads=H, collapsed_generator=True, off_diag_mode="linear_comb")
    with pytest.raises(ValueError, match="^collapsed_generator:"):
        zoo.create_attention("damcha", d_model=D, n_heads=H, collapsed_generator=True, fused_rowsum=False)
    model = decoder(True).eval()
    model(torch.randint(0, V, (2, 6)))
    M = model.get_M_matrices()[0][1]
    blocks = M.reshape(H, dh, H, dh)
    assert (blocks[0, :, 1] == 0).all() and blocks[0, :, 0].abs().sum() > 0  # block-diagonal representative
    zoo.variants.damcha.set_block_scales(model, 1.0, 0.0)
    with pytest.raises(ValueError, match="^block_scales:"):
        model(torch.randint(0, V, (2, 6)))


@pytest.mark.parametrize("scaled", [False, True])
def test_rowsum_linear_function_matches_autograd_through_the_fold(scaled):
    # the non-causal fused final layer: a custom backward that writes ∂W block row by block row
    from attention_zoo.variants.damcha_generator import _RowSumLinear, block_scale_matrix, fold_rowsum

    torch.manual_seed(0)
    w = 5
    z = torch.randn(3, w, dtype=torch.float64, requires_grad=True)
    W = torch.randn(D * D, w, dtype=torch.float64, requires_grad=True)
    b = torch.randn(D * D, dtype=torch.float64, requires_grad=True)
    S = block_scale_matrix(H, 0.7, -0.3, W) if scaled else None
    g = torch.randn(3, H * dh * dh, dtype=torch.float64)
    got = _RowSumLinear.apply(z, W, b, H, S)
    grads = torch.autograd.grad(got, (z, W, b), g)
    want = F.linear(z, *fold_rowsum(W, b, H, S))
    want_grads = torch.autograd.grad(want, (z, W, b), g)
    assert_close(got, want, rtol=0, atol=0)
    for a, c in zip(grads, want_grads):
        assert_close(a, c)


def test_rowsum_report_keeps_the_final_diag_vs_full_rows_and_draws_every_curve(tmp_path, monkeypatch):
    from attention_zoo.experiments.efficiency import rowsum_analysis as ra

    monkeypatch.setitem(ra.PRESETS, "smoke", {**ra.PRESETS["smoke"], "diag_steps": 2, "probes": 2})
    assert ra.main(["--sections", "diag_vs_full", "--device", "cpu", "--out", str(tmp_path), "--quiet"]) == 0
    md = (tmp_path / "rowsum_analysis.md").read_text()
    assert "rel_dist_diag_vs_full_over_H" in md and "val_loss[full]" in md  # the curves' last point is in the table
    assert (tmp_path / "block_inference_losses.png").is_file() and (tmp_path / "diag_vs_full_over_H.png").is_file()
