"""DAMCHA causal shared stack: metrics stored once per forward (``metric_cache="store"``) against per-layer
recomputation ("recompute", the chunked checkpointed path): same values and gradients, float64."""

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo

D, H, T, V = 16, 4, 9, 20


def decoder(cache, **opts):
    torch.manual_seed(0)
    options = {"hidden_dims": (8, 12), "metric_cache": cache, "query_chunk": 4, **opts}
    return zoo.models.Decoder(V, D, 3, H, attention="damcha", attention_options=options).double()


@pytest.mark.parametrize("opts", [{}, {"compact_rank": 2}, {"off_diag_mode": "linear_comb"},
                                  {"diag_scale": 0.7, "off_diag_scale": 0.2}])
def test_store_equals_recompute_values_and_gradients(opts):
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(2, T, dtype=torch.bool)
    pad[1, 6:] = False
    outs = []
    for cache in ("store", "recompute"):
        model = decoder(cache, **opts).eval()
        logits = model(ids, padding_mask=pad)
        logits = logits[0] if isinstance(logits, tuple) else logits
        grads = torch.autograd.grad(logits.square().sum(), list(model.parameters()))
        outs.append((logits, grads))
    (y_s, g_s), (y_r, g_r) = outs
    assert_close(y_s, y_r)
    for a, b in zip(g_s, g_r):
        assert_close(a, b)


def test_store_runs_the_final_layer_once_and_recompute_once_per_layer():
    positions = {}
    for cache in ("store", "recompute"):
        model = decoder(cache)
        gen, seen = model.stack.shared, []
        make_fn = gen.metric_fn

        def counting_metric_fn(alpha, layer_idx, make_fn=make_fn, seen=seen):
            fn = make_fn(alpha, layer_idx)
            return lambda z: (seen.append(z.shape[:-1].numel()), fn(z))[1]

        gen.metric_fn = counting_metric_fn
        with torch.no_grad():
            model(torch.randint(0, V, (2, T)))
        positions[cache] = sum(seen)
        assert gen.stores_metrics == (cache == "store")
    assert positions == {"store": 2 * T, "recompute": 3 * 2 * T}  # final layer: once per stack vs per layer


def test_recompute_keeps_per_position_metrics_out_of_the_graph_and_store_keeps_one_copy():
    sizes = {}
    for cache in ("store", "recompute"):
        model = decoder(cache)
        ids = torch.randint(0, V, (2, T))
        params = {p.data_ptr() for p in model.parameters()}
        seen = {}

        def pack(t, params=params, seen=seen):
            if t.data_ptr() not in params:
                seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids)
        sizes[cache] = sum(seen.values())
    per_position_metrics = 2 * T * D * (D // H)
    assert sizes["recompute"] < sizes["store"] <= sizes["recompute"] + 2 * per_position_metrics


def test_bad_metric_cache():
    with pytest.raises(ValueError, match="^metric_cache"):
        zoo.create_attention("damcha", d_model=D, n_heads=H, metric_cache="sometimes")


def test_stored_metrics_gradient_meets_in_one_buffer_with_plain_autograds_values(monkeypatch):
    """The stack's layers add their ∂L/∂m into one buffer (``SharedMetricGrad``) instead of each returning a
    per-position tensor for autograd to sum: same gradients as plain autograd through ``head_queries``."""
    from attention_zoo.variants import damcha_generator as dg

    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
    grads = {}
    for mode in ("buffer", "autograd"):
        if mode == "autograd":
            orig = dg.StructuredMLPForM.stack_context

            def plain(self, x, pm, orig=orig):
                ctx = orig(self, x, pm)
                assert ctx.metric_grad is not None  # the buffer path is the default in store mode
                ctx.metric_grad = None
                return ctx

            monkeypatch.setattr(dg.StructuredMLPForM, "stack_context", plain)
        model = decoder("store")
        logits = model(ids)
        logits = logits[0] if isinstance(logits, tuple) else logits
        grads[mode] = torch.autograd.grad(logits.square().sum(), list(model.parameters()))
    for a, b in zip(grads["buffer"], grads["autograd"]):
        assert_close(a, b)
