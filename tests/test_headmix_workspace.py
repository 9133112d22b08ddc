"""The head-mixed cores' workspace (THA, DCMHA on the CPU): memory kept between steps, values unchanged, never
shared between two live calls or two live graphs, and not part of the module's state."""

import copy
import pickle

import pytest
import torch

from attention_zoo import create_attention
from attention_zoo.variants.headmix_workspace import Workspace, release_workspaces

B, T, D, H = 2, 40, 16, 4


def _layer(name, causal=False, dropout=0.0, **kw):
    torch.manual_seed(0)
    m = create_attention(name, d_model=D, n_heads=H, causal=causal, dropout=dropout, **kw).double()
    m.query_chunk = 16  # several blocks, the last one short
    return m


def _values_and_grads(m, x):
    x = x.clone().requires_grad_(True)
    y = m(x)
    grads = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum(),
                                [x, *m.parameters()])
    return [y.detach(), *grads]


@pytest.mark.parametrize("name", ["tha", "dcmha"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_workspace_leaves_values_and_gradients_unchanged(name, causal):
    m = _layer(name, causal)
    x = torch.randn(B, T, D, dtype=torch.float64)
    kept = [_values_and_grads(m, x) for _ in range(3)]  # the later steps run in kept memory
    m.workspace = None  # the core's own allocations
    fresh = _values_and_grads(m, x)
    for step in kept:
        for a, b in zip(step, fresh):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_steps_reuse_the_kept_buffers():
    m = _layer("tha").float()
    x = torch.randn(B, T, D)
    saved, scratch = set(), set()
    for _ in range(6):  # a user's loop: the previous step's graph dies when its output is replaced
        y = m(x)
        y.square().mean().backward()
        del y  # the graph is freed: its saved buffer returns to the pool
        saved |= {b.data_ptr() for b in m.workspace._pool}
        scratch |= {b.data_ptr() for b in m.workspace._scratch.values()}
    assert 1 <= len(saved) <= 2 and len(scratch) == 3  # no new memory after the first steps


def test_a_retained_graph_keeps_its_saved_blocks():
    m = _layer("tha")
    x1, x2 = (torch.randn(B, T, D, dtype=torch.float64, requires_grad=True) for _ in range(2))
    y1 = m(x1)
    (g1,) = torch.autograd.grad(y1.sum(), x1, retain_graph=True)
    y2 = m(x2)  # while graph 1 lives its buffer is leased: this forward gets another
    y2.sum().backward()
    (again,) = torch.autograd.grad(y1.sum(), x1)
    torch.testing.assert_close(again, g1, rtol=0, atol=0)


def test_a_call_while_the_scratch_is_taken_computes_in_fresh_memory():
    m = _layer("dcmha")
    x = torch.randn(B, T, D, dtype=torch.float64)
    want = _values_and_grads(m, x)
    with m.workspace.scratch() as held:  # as another thread's call would hold it
        assert held is not None
        got = _values_and_grads(m, x)
        with m.workspace.scratch() as second:
            assert second is None
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_the_workspace_is_not_state():
    m = _layer("tha").float()
    m(torch.randn(B, T, D)).sum().backward()
    assert m.workspace._scratch
    assert not any("workspace" in k for k in m.state_dict())
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert isinstance(clone.workspace, Workspace) and not clone.workspace._scratch
        assert clone.workspace is not m.workspace
    assert release_workspaces(torch.nn.Sequential(m, _layer("dcmha"))) == 2 and not m.workspace._scratch


def test_dropout_keep_masks_use_the_workspace_too():
    m = _layer("tha", dropout=0.3).float().train()
    x = torch.randn(B, T, D)
    torch.manual_seed(1)
    a = _values_and_grads(m, x)
    ws, m.workspace = m.workspace, None
    torch.manual_seed(1)
    b = _values_and_grads(m, x)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-6)
    assert any(buf.dtype == torch.bool for buf in ws._pool)


def test_inference_mode_then_training():
    m = _layer("tha").float()
    x = torch.randn(B, T, D)
    with torch.inference_mode():  # an evaluation first: its scratch is made of inference tensors
        want = m(x)
    got = m(x)  # then training: the scratch is made anew, not written in place
    got.sum().backward()
    torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-6)
    with torch.inference_mode():
        m(x)
