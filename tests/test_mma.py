"""MMA (mixed multi-head self-attention): the per-head group masks, the MHA reduction, dead rows, options."""

import pytest
import torch

import attention_zoo as zoo

D, H, B, T, W = 32, 8, 2, 10, 3
DH = D // H


def _x(seed=0, seq=T):
    return torch.randn(B, seq, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _mma(causal, **options):
    torch.manual_seed(0)
    return zoo.create_attention("mma", d_model=D, n_heads=H, causal=causal, **options).double()


def _expected_visibility(groups, flavor, causal, window, seq=T):
    """bool [H, T, S] written out entry by entry from the table in mma.py's docstring."""
    vis = torch.zeros(len(groups), seq, seq, dtype=torch.bool)
    for h, g in enumerate(groups):
        for i in range(seq):
            for j in range(seq):
                if g == "global":
                    ok = True
                elif g == "local":
                    ok = abs(i - j) <= window if flavor == "paper" else i - window < j <= i
                elif g == "forward":
                    ok = j <= i
                else:
                    ok = j >= i
                vis[h, i, j] = ok and (j <= i or not causal)
    return vis


def _measured_visibility(m, x):
    """bool [H, T, S]: perturbing token j changes head h's output at query i (one batched forward)."""
    captured = {}
    hook = m.out_proj.register_forward_pre_hook(lambda mod, args: captured.update(o=args[0]))
    xs = x[:1].repeat(T + 1, 1, 1)  # row j < T: token j perturbed; row T: unperturbed
    xs[torch.arange(T), torch.arange(T)] += _x(9)[0]
    with torch.no_grad():
        m(xs)
    hook.remove()
    heads = captured["o"].view(T + 1, T, H, DH)  # (perturbed j, query i, H, dh): merged head outputs
    changed = (heads[:T] - heads[T:]).abs().amax(dim=-1) > 1e-9  # (S, T, H)
    return changed.permute(2, 1, 0)  # (H, T, S)


PAPER_GROUPS = ("global",) * 2 + ("local",) * 2 + ("forward",) * 2 + ("backward",) * 2
REPO_GROUPS = ("global", "local", "forward", "backward") * 2


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "flavor, options, groups",
    [
        ("paper", {}, PAPER_GROUPS),
        ("damcha_repo", {}, REPO_GROUPS),
        (
            "paper",
            {"groups": "bgllffgb"},
            ("backward", "global", "local", "local", "forward", "forward", "global", "backward"),
        ),
        ("damcha_repo", {"groups": (1, 3, 0, 4)}, ("global",) + ("local",) * 3 + ("backward",) * 4),
    ],
)
def test_effective_head_masks(causal, flavor, options, groups):
    m = _mma(causal, flavor=flavor, window=W, **options)
    assert m.head_groups == groups
    expected = _expected_visibility(groups, flavor, causal, W)
    torch.testing.assert_close(_measured_visibility(m, _x()), expected)
    # the hook holds the group masks alone; the base class intersects them with causality
    torch.testing.assert_close(m.extra_keep(T, torch.device("cpu"))[0], _expected_visibility(groups, flavor, False, W))


def test_causal_groups_as_documented():
    """Under causality: forward = global = causal, local = causal window, backward = self only."""
    vis = _expected_visibility(PAPER_GROUPS, "paper", True, W)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(vis[0], causal) and torch.equal(vis[4], causal)
    assert torch.equal(vis[6], torch.eye(T, dtype=torch.bool))
    assert int(vis[2].sum(dim=-1).max()) == W + 1
    repo = _expected_visibility(REPO_GROUPS, "damcha_repo", True, 8, seq=20)
    assert int(repo[1].sum(dim=-1).max()) == 8  # j in [i-7, i]


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
def test_prefix_causality_every_group(flavor):
    m = _mma(True, flavor=flavor, window=W)
    x = _x(1)
    y = m(x)
    for k in (1, 4, 7):
        torch.testing.assert_close(m(x[:, :k]), y[:, :k])
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 6:] = False
    torch.testing.assert_close(m(x[:, :6], padding_mask=pad[:, :6]), m(x, padding_mask=pad)[:, :6])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", [{"all_global": True}, {"groups": (H, 0, 0, 0)}, {"groups": "g" * H}])
def test_all_global_equals_mha(causal, options):
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal).double()
    m = _mma(causal, **options)
    m.load_state_dict(mha.state_dict())  # same qkv/out_proj layout
    assert m.extra_keep(T, torch.device("cpu")) is None
    x = _x(2)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, -4:] = False
    torch.testing.assert_close(m(x), mha(x))
    torch.testing.assert_close(m(x, padding_mask=pad), mha(x, padding_mask=pad))


@pytest.mark.parametrize("flavor", ["paper", "damcha_repo"])
def test_fully_masked_rows_finite(flavor):
    """Padded queries of the self-only (causal backward) heads see no key: zero output, finite gradients."""
    m = _mma(True, flavor=flavor, window=W)
    x = _x(3).requires_grad_()
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, -4:] = False
    captured = {}
    m.out_proj.register_forward_pre_hook(lambda mod, args: captured.update(o=args[0]))
    y = m(x, padding_mask=pad)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    heads = captured["o"].view(B, T, H, DH)
    backward_heads = [h for h, g in enumerate(m.head_groups) if g == "backward"]
    assert torch.count_nonzero(heads[1, -4:, backward_heads]) == 0
    assert torch.count_nonzero(y[1, -4:]) == 0


def test_mask_cache_and_cost():
    m = _mma(False)
    cpu = torch.device("cpu")
    assert m.extra_keep(T, cpu) is m.extra_keep(T, cpu)
    assert m.extra_keep(T, cpu).shape == (1, H, T, T) and m.extra_keep(T, cpu).dtype == torch.bool
    mha = zoo.create_attention("mha", d_model=D, n_heads=H)
    assert m.analytic_params() == mha.analytic_params() == sum(p.numel() for p in m.parameters())
    assert m.analytic_flops(3, 17) == mha.analytic_flops(3, 17)
    assert zoo.create_attention("mma", d_model=128, n_heads=8).analytic_params() == 66_048


@pytest.mark.parametrize(
    "n_heads, options, arg",
    [
        (6, {}, "n_heads"),  # default paper split needs H % 4 == 0
        (8, {"groups": (2, 2, 2, 1)}, "groups"),
        (8, {"groups": (2, 2, 2)}, "groups"),
        (8, {"groups": (2, 2, 2, 2.0)}, "groups"),
        (8, {"groups": "glfbglf"}, "groups"),
        (8, {"groups": "glfbglfx"}, "groups"),
        (8, {"window": 0}, "window"),
        (8, {"all_global": 1}, "all_global"),
        (8, {"all_global": True, "groups": (8, 0, 0, 0)}, "all_global"),
    ],
)
def test_bad_options(n_heads, options, arg):
    with pytest.raises(ValueError, match=f"^{arg}"):
        zoo.create_attention("mma", d_model=48, n_heads=n_heads, **options)


def test_round_robin_needs_no_divisibility():
    m = zoo.create_attention("mma", d_model=48, n_heads=6, flavor="damcha_repo")
    assert m.head_groups == ("global", "local", "forward", "backward", "global", "local")
