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


@pytest.mark.parametrize("name", ["dcmha", "tha"])
def test_chunked_core_is_one_op_in_the_graph(name):
    """The head-mixed core (headmix.py) enters the compiled graph as one custom op for forward and one for backward:
    no graph break, no recompilation as T changes, and a graph whose size does not grow with the number of query
    blocks (the block loop is not unrolled into it)."""
    import torch._dynamo as dynamo
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.testing import CompileCounterWithBackend

    nodes, cores = [], set()

    def count(gm, _inputs):
        nodes.append(sum(n.op == "call_function" for n in gm.graph.nodes))
        cores.update(str(n.target) for n in gm.graph.nodes if "attention_zoo" in str(n.target))
        return make_boxed_func(gm)

    options = {"query_chunk": 4} if name == "dcmha" else {}
    sizes = {}
    for T in (8, 16, 32):  # 2, 4 and 8 query blocks
        dynamo.reset()
        nodes.clear()
        torch.manual_seed(0)
        attn = zoo.create_attention(name, d_model=16, n_heads=4, causal=True, **options)
        if name == "tha":
            attn.query_chunk = 4
        x = torch.randn(2, T, 16, requires_grad=True)
        assert dynamo.explain(attn)(x).graph_break_count == 0
        dynamo.reset()
        backend = aot_autograd(fw_compiler=count, bw_compiler=count)
        torch.compile(attn, backend=backend, dynamic=False)(x).sum().backward()
        sizes[T] = tuple(nodes)
        assert cores == {"attention_zoo.mixed_attention_core.default",
                         "attention_zoo.mixed_attention_core_backward.default"}, cores
    assert len(set(sizes.values())) == 1, f"graph size grows with the number of blocks: {sizes}"

    dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    torch.manual_seed(0)
    attn = zoo.create_attention(name, d_model=16, n_heads=4, causal=True, **options)
    compiled = torch.compile(attn, backend=counter)
    for T in (8, 12, 16, 20, 8):
        compiled(torch.randn(2, T, 16)).sum()
    assert counter.frame_count <= 2, f"{counter.frame_count} compilations for 4 sequence lengths"


def test_compiled_core_matches_eager_values_and_gradients_non_causal():
    """Non-causal DCMHA with every term on (static included), weights far from their near-identity init and several
    query blocks: the custom-op core gives the eager values and gradients (float64, so only the op order differs)."""
    torch.manual_seed(0)
    attn = zoo.create_attention("dcmha", d_model=32, n_heads=4, use_static=True, query_chunk=4).double()
    with torch.no_grad():
        for n, p in attn.named_parameters():
            if not n.startswith(("qkv", "out_proj")):
                p.normal_(0.0, 0.3)
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager = attn(xe)
    eager.square().sum().backward()
    grads = [p.grad.clone() for p in attn.parameters()]
    attn.zero_grad()
    compiled = torch.compile(attn, backend="aot_eager")(xc)
    compiled.square().sum().backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(xc.grad, xe.grad)
    for g, p in zip(grads, attn.parameters()):
        torch.testing.assert_close(p.grad, g)
