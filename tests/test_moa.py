"""MoA (variants.md §6): sparse dispatch vs a per-token/per-expert loop, gates, aux losses, load, costs."""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing import assert_close
from torch.utils.flop_counter import FlopCounterMode

import attention_zoo as zoo

D, H, B, T = 16, 4, 2, 6  # E = 8 experts, k = 4, d_h = 4


def make(flavor, causal=False, **kw):
    torch.manual_seed(0)
    m = zoo.create_attention("moa", d_model=D, n_heads=H, causal=causal, flavor=flavor, **kw).double().eval()
    if flavor == "paper":  # the zero-init router ties; random weights make the routing non-trivial
        with torch.no_grad():
            m.router.weight.normal_(0, 1.0)
    return m


def padding():
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, 4:] = False
    return pad


def loop_reference(m, x, pad, renormalise):
    """Explicit per-token, per-expert MoA with a hand-written softmax (no batching, no SDPA)."""
    E, k, dh = m.n_experts, m.top_k, m.head_dim
    paper = m.flavor == "paper"
    y = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if not pad[b, t]:
                continue
            keys = [s for s in range(x.shape[1]) if pad[b, s] and (s <= t or not m.causal)]
            logits = m.router(x[b, t])
            order = sorted(range(E), key=lambda e: (-float(logits[e].detach()), e))[:k]
            probs = logits.softmax(-1)[order]  # full-softmax probabilities of the selected experts
            gates = probs / probs.sum() if renormalise else probs  # renormalised = softmax over the k logits
            slots = []
            for e in order:
                if paper:
                    q = x[b, t] @ m.w_q[e]
                    K, V = x[b, keys] @ m.kv.weight[:dh].T, x[b, keys] @ m.kv.weight[dh:].T
                else:
                    q, K, V = x[b, t] @ m.w_q[e], x[b, keys] @ m.w_k[e], x[b, keys] @ m.w_v[e]
                a = torch.exp(K @ q / math.sqrt(dh) - (K @ q / math.sqrt(dh)).max())
                slots.append((a / a.sum()) @ V)
            if paper:
                y[b, t] = sum(g * o @ m.w_o[e] for g, o, e in zip(gates, slots, order))
            else:
                y[b, t] = m.out_proj(torch.cat([g * o for g, o in zip(gates, slots)]))
    return y


def values_and_grads(m, fn, x):
    x = x.clone().requires_grad_(True)
    m.zero_grad()
    y = fn(x)
    (y * torch.linspace(-1, 2, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    return [y.detach(), x.grad] + [torch.zeros_like(p) if p.grad is None else p.grad for p in m.parameters()]


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_loop_reference_values_and_grads(flavor, causal):
    m, pad = make(flavor, causal), padding()
    x = torch.randn(B, T, D, dtype=torch.float64)
    renorm = flavor == "damcha_repo"
    got = values_and_grads(m, lambda x: m(x, padding_mask=pad), x)
    want = values_and_grads(m, lambda x: loop_reference(m, x, pad, renorm), x)
    for a, b in zip(got, want):
        assert_close(a, b)
    # the other gate normalisation is a different function: paper gates are NOT renormalised (sum < 1)
    other = loop_reference(m, x, pad, not renorm)
    assert not torch.allclose(other, got[0]), "gate normalisation is not what the flavour specifies"


def test_paper_gates_sum_below_one_and_zero_init_ties_to_lowest_experts():
    torch.manual_seed(0)
    m = zoo.create_attention("moa", d_model=D, n_heads=H).double()
    m(torch.randn(B, T, D, dtype=torch.float64), padding_mask=padding())
    E, k, n_real = m.n_experts, m.top_k, int(padding().sum())
    expected = torch.tensor([n_real] * k + [0] * (E - k))
    assert torch.equal(m.last_expert_load, expected)  # uniform probabilities: experts 0..k-1 by tie-break
    m(torch.randn(B, T, D, dtype=torch.float64)).square().sum().backward()
    assert (m.w_q.grad[k:] == 0).all() and (m.w_o.grad[k:] == 0).all()  # experts with no rows: zero grad
    assert m.w_q.grad[:k].abs().sum() > 0
    # at init every selected gate is 1/E, so a token's gates sum to k/E = 1/2 (not renormalised to 1)
    with torch.no_grad():
        m.w_o.copy_(torch.eye(m.head_dim, D).expand_as(m.w_o))
        m.w_q.zero_()  # uniform attention: o = mean of the visible values
        m.kv.weight[m.head_dim :].copy_(torch.eye(m.head_dim, D))  # v_s = x_s[:dh]
    x = torch.randn(1, T, D, dtype=torch.float64)
    y = m(x)
    assert_close(y[0, :, : m.head_dim], (k / E) * x[0, :, : m.head_dim].mean(0).expand(T, -1))


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
def test_expert_load_counts_real_tokens(flavor):
    m, pad = make(flavor, True), padding()
    m(torch.randn(B, T, D, dtype=torch.float64), padding_mask=pad)
    load = m.last_expert_load
    assert load.shape == (m.n_experts,) and not load.requires_grad
    assert int(load.sum()) == m.top_k * int(pad.sum())


def test_aux_losses_on_a_hand_example_ignore_padding():
    # D = 2, H = 1: E = 2 experts, k = 1; router = identity, so the logits are the token vectors
    x = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [50.0, -50.0]]], dtype=torch.float64)
    pad = torch.tensor([[True, True, True, False]])
    e = math.e
    p0 = [e**2 / (e**2 + 1), 1 / (1 + e), 0.5]  # probability of expert 0 per real token
    imp = torch.tensor([sum(p0), sum(1 - p for p in p0)]) / 3  # normalised importance
    load = torch.tensor([2.0, 1.0]) / 3  # tokens 0, 2 (tie -> lower index) on expert 0; token 1 on expert 1
    switch = 2 * float((imp * load).sum())
    z = (math.log(e**2 + 1) ** 2 + math.log(1 + e) ** 2 + math.log(2 * e) ** 2) / 3
    g = torch.tensor([p0[0] + p0[2], 1 - p0[1]])  # summed (unnormalised) gates per expert
    cv = float(g.var() / g.mean() ** 2)
    cases = [((1, 0, 0), switch), ((0, 1, 0), z), ((0, 0, 1), cv), ((0.01, 0.001, 0), 0.01 * switch + 0.001 * z)]
    for weights, want in cases:
        m = zoo.create_attention(
            "moa", d_model=2, n_heads=1, switch_weight=weights[0], z_weight=weights[1], cv_weight=weights[2]
        ).double()
        with torch.no_grad():
            m.router.weight.copy_(torch.eye(2))
        m(x, padding_mask=pad)
        assert m.aux_loss.dim() == 0
        assert_close(m.aux_loss, torch.tensor(want, dtype=torch.float64))
        assert m.last_expert_load.tolist() == [2, 1]
        x2 = x.clone()
        x2[0, 3] = torch.tensor([-7.0, 3.0])  # padded content must not move the statistics
        m(x2, padding_mask=pad)
        assert_close(m.aux_loss, torch.tensor(want, dtype=torch.float64))


def test_aux_loss_has_gradient_into_router_at_zero_init():
    torch.manual_seed(0)
    m = zoo.create_attention("moa", d_model=D, n_heads=H, cv_weight=0.1).double()
    m(torch.randn(B, T, D, dtype=torch.float64))
    m.aux_loss.backward()
    assert m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0
    d = make("damcha_repo")
    d(torch.randn(B, T, D, dtype=torch.float64))
    assert d.aux_loss.dim() == 0 and float(d.aux_loss) == 0.0


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
def test_causal_future_perturbation_leaves_past_unchanged(flavor):
    m, pad = make(flavor, True), padding()
    x = torch.randn(B, T, D, dtype=torch.float64)
    y = m(x, padding_mask=pad)
    x2 = x.clone()
    x2[:, 3:] += 5 * torch.randn_like(x2[:, 3:])
    assert_close(m(x2, padding_mask=pad)[:, :3], y[:, :3])


def test_damcha_repo_output_depends_on_rank_order():
    # experts 0 and 1 tie (equal gates); a 1e-9 nudge swaps their ranks. With per-expert outputs that moves y by
    # O(1e-9); in damcha_repo the output projection belongs to the rank slot, so y jumps.
    m = make("damcha_repo")
    x = torch.randn(1, T, D, dtype=torch.float64)
    with torch.no_grad():
        m.router.weight.zero_()
        m.router.bias.copy_(torch.tensor([3.0, 3.0, 0, 0, 0, 0, 0, 0]))
        y1 = m(x)
        m.router.bias[1] += 1e-9
        y2 = m(x)
    assert (y1 - y2).abs().max() > 1e-3


def test_param_counts():
    kw = dict(d_model=128, n_heads=8)
    paper = zoo.create_attention("moa", **kw)
    repo = zoo.create_attention("moa", flavor="damcha_repo", **kw)
    assert sum(p.numel() for p in paper.parameters()) == paper.analytic_params() == 71_680
    assert sum(p.numel() for p in repo.parameters()) == repo.analytic_params() == 116_880
    for flavor in ("paper", "damcha_repo"):
        for d, h, opts in [(16, 4, {}), (24, 3, {"n_experts": 5, "top_k": 2}), (32, 2, {"top_k": 4})]:
            if flavor == "paper":
                opts = {**opts, "noisy_gating": d == 24}
            m = zoo.create_attention("moa", d_model=d, n_heads=h, flavor=flavor, **opts)
            assert m.analytic_params() == sum(p.numel() for p in m.parameters()), (flavor, d, h, opts)


def test_head_dim_option_sets_every_expert_width():
    """The MoA authors' configurations use a head width other than D/H (128 or 256 with 8-12 experts)."""
    dh = 2 * D // H  # 8, not D/H = 4
    m = make("paper", causal=True, n_experts=3, top_k=2, head_dim=dh)
    assert m.head_dim == dh and m.w_q.shape == (3, D, dh) and m.kv.weight.shape == (2 * dh, D)
    assert m.analytic_params() == sum(p.numel() for p in m.parameters()) == 2 * 3 * D * dh + 2 * D * dh + D * 3
    x, pad = torch.randn(B, T, D, dtype=torch.float64), padding()
    for a, b in zip(values_and_grads(m, lambda x: m(x, padding_mask=pad), x),
                    values_and_grads(m, lambda x: loop_reference(m, x, pad, False), x)):
        assert_close(a, b)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(x)
    assert counter.get_total_flops() == m.analytic_flops(B, T) == B * (T * (2 * D * 3 + 4 * 2 * D * dh + 4 * D * dh)
                                                                       + 4 * 2 * dh * T * T)
    authors = zoo.create_attention("moa", d_model=64, n_heads=4, n_experts=8, top_k=4, head_dim=128)
    assert authors.analytic_params() == sum(p.numel() for p in authors.parameters())
    assert "head_dim=128" in repr(authors)


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
def test_analytic_flops_match_counter_on_math_path(flavor):
    m = make(flavor, causal=True, n_experts=6, top_k=3)
    x = torch.randn(B, T, D, dtype=torch.float64)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(x)
    assert counter.get_total_flops() == m.analytic_flops(B, T)


def test_noisy_gating_only_in_training():
    torch.manual_seed(0)
    m = zoo.create_attention("moa", d_model=D, n_heads=H, noisy_gating=True).double()
    with torch.no_grad():
        m.noise.weight.normal_()
    x = torch.randn(B, T, D, dtype=torch.float64)
    assert_close(m.eval()(x), m(x))
    m.train()
    y = m(x)
    (y.square().sum() + m.aux_loss).backward()
    assert m.noise.weight.grad is not None and m.noise.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs,arg",
    [
        ({"top_k": 9}, "top_k"),
        ({"n_experts": 0}, "n_experts"),
        ({"switch_weight": -1.0}, "switch_weight"),
        ({"z_weight": float("nan")}, "z_weight"),
        ({"noisy_gating": 1}, "noisy_gating"),
        ({"noisy_gating": True, "flavor": "damcha_repo"}, "noisy_gating"),
        ({"head_dim": 0}, "head_dim"),
        ({"head_dim": 8, "flavor": "damcha_repo"}, "head_dim"),
    ],
)
def test_bad_options(kwargs, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        zoo.create_attention("moa", d_model=D, n_heads=H, **kwargs)


def test_per_head_mask_must_agree_across_heads():
    m = make("paper")
    x = torch.randn(B, T, D, dtype=torch.float64)
    keep = torch.rand(B, 1, T, T) > 0.3
    keep |= torch.eye(T, dtype=torch.bool)
    assert_close(m(x, attn_mask=keep.expand(B, H, T, T)), m(x, attn_mask=keep))
    differ = keep.expand(B, H, T, T).clone()
    differ[:, 1] = True
    with pytest.raises(ValueError, match="^attn_mask:"):
        m(x, attn_mask=differ)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_expert_stream_matches_grouped_gemm_and_per_expert_loop(monkeypatch, causal):
    # The CPU streams one expert at a time; off the CPU float32/bf16 run torch's grouped GEMM (offsets on the device,
    # no host sync) and the rest the per-expert loop. All three on the CPU here: same values and gradients, up to
    # float32 rounding, and the float64 stream is the reference.
    from attention_zoo.variants import moa_experts as moa

    m, pad = make("paper", causal), padding()
    x = torch.randn(B, T, D, dtype=torch.float64)
    want = [t.clone() for t in values_and_grads(m, lambda x: m(x, padding_mask=pad), x)]  # .float() casts grads
    m.float()
    stream = values_and_grads(m, lambda x: m(x, padding_mask=pad), x.float())
    monkeypatch.setattr(moa, "_streams", lambda inp: False)
    assert moa._grouped_kernel_ok(x.float(), (D, m.head_dim)) == hasattr(torch.nn.functional, "grouped_mm")
    grouped = values_and_grads(m, lambda x: m(x, padding_mask=pad), x.float())
    monkeypatch.setattr(moa, "_grouped_kernel_ok", lambda a, widths: False)
    loop = values_and_grads(m, lambda x: m(x, padding_mask=pad), x.float())
    for a, b, c, d in zip(stream, grouped, loop, want):
        assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert_close(a, c, rtol=1e-6, atol=1e-6)
        assert_close(a.double(), d, rtol=1e-4, atol=1e-5)
