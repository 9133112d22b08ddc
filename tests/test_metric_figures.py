"""Appendix F/G/H figure functions on tiny models."""

import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.experiments.generation.metric_figures import (
    block_gradient_norms,
    gradient_grid_plot,
    metric_heatmaps,
)

D, H, V = 16, 4, 20


def tiny(share=True, **opts):
    torch.manual_seed(0)
    return zoo.models.Decoder(V, D, 2, H, attention="damcha", share_mlp=share,
                              attention_options={"hidden_dims": (8,), "gen_dropout": 0.0, **opts}).double()


def loss_fn(tokens):
    def f(model):
        out = model(tokens[:, :-1])
        return F.cross_entropy(out.logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
    return f


def test_gradient_grid_equals_direct_autograd():
    model = tiny()
    tokens = torch.randint(0, V, (3, 8))
    grids = block_gradient_norms(model, loss_fn(tokens))
    assert list(grids) == ["stack.shared"] and grids["stack.shared"].shape == (H, H)
    # direct: rebuild M explicitly from the shared generator and differentiate the same loss w.r.t. it
    gen = model.stack.shared
    x0 = model.tok_emb(tokens[:, :-1]) + model.pos_emb[: tokens.shape[1] - 1]
    ctx = x0.cumsum(1) / torch.arange(1, x0.shape[1] + 1, dtype=x0.dtype)[:, None]
    M = gen.out(gen.trunk(ctx)).detach().requires_grad_(True)  # (B, T, D²)
    dh = D // H
    m = M.unflatten(-1, (H, dh, H, dh)).sum(-2)  # RowSum
    h = x0
    for layer in model.stack.layers:
        attn = layer.attn
        xin = layer.ln1(h)
        xh = attn.split_heads(xin)
        q = torch.einsum("bhta,bthae->bhte", xh, m)
        v = attn.split_heads(attn.v_proj(xin))
        y = attn.out_proj(attn.merge_heads(F.scaled_dot_product_attention(q, xh, v, is_causal=True)))
        h = h + y
        h = h + layer.ffn(layer.ln2(h))
    logits = model.head(model.ln_f(h))
    loss = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
    (g,) = torch.autograd.grad(loss, M)
    direct = g.unflatten(-1, (H, dh, H, dh)).square().sum((0, 1, 3, 5)).sqrt()
    assert_close(grids["stack.shared"], direct)
    # RowSum: every block of a block row gets the same gradient, so each grid row is constant
    assert_close(grids["stack.shared"], grids["stack.shared"][:, :1].expand(H, H))


def test_unshared_grids_per_layer_and_plots(tmp_path):
    model = tiny(share=False)
    tokens = torch.randint(0, V, (2, 6))
    grids = block_gradient_norms(model, loss_fn(tokens))
    assert len(grids) == 2 and all(g.shape == (H, H) for g in grids.values())
    assert model.stack.layers[0].attn.generator.fused  # the explicit detour is undone
    model.eval()(tokens)
    p1 = metric_heatmaps(model.get_M_matrices(), tmp_path / "m.png", "metrics", n_heads=H)
    p2 = gradient_grid_plot(grids, tmp_path / "g.png", "grads")
    assert p1.stat().st_size > 1000 and p2.stat().st_size > 1000


def test_appendix_fgh_cli_writes_figures_and_skips_finished_cells(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "reproduce" / "appendix_fgh.py"
    cmd = [sys.executable, str(script), "--device", "cpu", "--out", str(tmp_path), "--steps", "4", "--seeds", "0",
           "1", "--quiet"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    for name in ("appendix_fgh_long.csv", "appendix_fgh.md", "appendix_fgh.env.json", "appF_adaptive_step4.png",
                 "appF_static_step0.png", "appG_grad_adaptive.png", "appG_grad_unshared.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    long = __import__("pandas").read_csv(tmp_path / "appendix_fgh_long.csv")
    assert {"block_norm_cv", "offdiag_to_diag", "metric_drift", "grad_grid_cv"} <= set(long["metric"])
    assert set(long["seed"]) == {0, 1}
    assert "F.structure" in first.stdout and "## Verdicts" in (tmp_path / "appendix_fgh.md").read_text()
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and second.stdout.count("(done)") == 6, second.stdout
