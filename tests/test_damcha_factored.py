"""DAMCHA's causal compact-rank queries through the metrics' factors (variants/damcha_factored.py): the same
function as forming the per-position metrics (float64), and no [B,T,H,dh,dh] tensor is formed or saved."""

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.variants.damcha_generator import StructuredMLPForM

D, H, T, V = 16, 4, 9, 20


def _decoder(d_model=D, n_heads=H, share_mlp=True, **opts):
    torch.manual_seed(0)
    options = {"hidden_dims": (8, 12), "compact_rank": 2, **opts}
    return zoo.models.Decoder(V, d_model, 2, n_heads, attention="damcha", attention_options=options,
                              share_mlp=share_mlp).double()


@pytest.mark.parametrize("opts", [{}, {"diag_scale": 0.7, "off_diag_scale": 0.2}, {"metric_cache": "recompute"},
                                  {"share_mlp": False}])
def test_factored_queries_equal_formed_metrics(monkeypatch, opts):
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(2, T, dtype=torch.bool)
    pad[1, 6:] = False
    outs = []
    for factored in (True, False):
        model = _decoder(**opts)
        if not factored:
            monkeypatch.setattr(StructuredMLPForM, "factored", lambda self, layer_idx: False)
        gen = next(m for m in model.modules() if isinstance(m, StructuredMLPForM))
        assert gen.factored(None) == factored
        logits = model(ids, padding_mask=pad).logits
        outs.append((logits, torch.autograd.grad(logits.square().sum(), list(model.parameters()))))
    assert_close(outs[0][0], outs[1][0])
    for a, b in zip(outs[0][1], outs[1][1]):
        assert_close(a, b)


def test_factored_path_never_forms_per_position_metrics():
    model = _decoder(d_model=32, n_heads=2)
    B, H, dh = 3, 2, 16
    biggest = []

    def pack(t):
        biggest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(0, V, (B, T))).logits.sum().backward()
    assert max(biggest) < B * T * H * dh * dh  # the factors are 2·B·T·H·dh·r (r = 2 < dh / 2)
