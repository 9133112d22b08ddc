"""torch.compile: every variant compiles, gives the eager values and gradients, and breaks the graph only where
data-dependent routing needs it (MoA's top-k dispatch)."""

from __future__ import annotations

import logging

import pytest
import torch

import attention_zoo as zoo

ROUTING_BREAKS = {"moa"}  # data-dependent expert group sizes (bincount, per-expert loop): documented breaks


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import torch._dynamo as dynamo

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.mark.parametrize("name", zoo.list_attentions())
def test_variant_compiles_with_eager_values(name):
    """Causal with padding: the path with the most masking (each compile costs seconds, so one case per variant)."""
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    attn = zoo.create_attention(name, d_model=32, n_heads=4, causal=True)
    x = torch.randn(2, 12, 32)
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[1, 9:] = False
    breaks = dynamo.explain(attn)(x, padding_mask=pad).graph_break_count
    if name not in ROUTING_BREAKS:
        assert breaks == 0, f"{name}: {breaks} graph breaks"
    dynamo.reset()
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = attn(xe, padding_mask=pad)
    eager.square().sum().backward()
    grads = [p.grad.clone() for p in attn.parameters()]
    attn.zero_grad()
    compiled = torch.compile(attn)(xc, padding_mask=pad)
    compiled.square().sum().backward()
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-4, atol=1e-5)
    for g, p in zip(grads, attn.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
