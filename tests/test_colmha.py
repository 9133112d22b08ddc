"""ColMHA (collaborative multi-head attention): reductions to MHA, the score formula, params and FLOPs."""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import attention_zoo as zoo

D, H, B, T = 32, 4, 2, 9
DH = D // H


def _x(seed=0, batch=B, seq=T, d=D):
    return torch.randn(batch, seq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _padding():
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, -3:] = False
    return pad


def _copy_mha_into_paper(mha, col):
    """ColMHA(D̃ = D, concatenate) weights representing ``mha`` exactly (module docstring of colmha.py)."""
    wq, wk, wv = mha.qkv.weight.chunk(3)
    with torch.no_grad():
        col.q_proj.weight.copy_(wq)
        col.k_proj.weight.copy_(wk)
        col.v_proj.weight.copy_(wv)
        col.out_proj.weight.copy_(mha.out_proj.weight)
        if mha.bias:
            bq, _, bv = mha.qkv.bias.chunk(3)
            # MHA's key-dependent bias term b_q^i · (W_k^i x_s) is the content bias c_i = W_k^iᵀ b_q^i
            c = torch.einsum("hdi,hd->hi", wk.view(H, DH, D), bq.view(H, DH))  # (H, D)
            col.content_proj.weight.copy_(c)
            col.v_proj.bias.copy_(bv)
            col.out_proj.bias.copy_(mha.out_proj.bias)
        else:
            col.content_proj.weight.zero_()
            col.v_proj.bias.zero_()
            col.out_proj.bias.zero_()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_paper_concatenate_equals_mha(causal, bias):
    torch.manual_seed(0)
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal, bias=bias).double()
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, causal=causal, mixing_init="concatenate").double()
    expected_mixing = torch.repeat_interleave(torch.eye(H, dtype=torch.float64), DH, dim=1)  # block one-hot
    torch.testing.assert_close(col.mixing.data, expected_mixing)
    _copy_mha_into_paper(mha, col)
    x, pad = _x(), _padding()
    torch.testing.assert_close(col(x), mha(x))
    torch.testing.assert_close(col(x, padding_mask=pad), mha(x, padding_mask=pad))


def _reference_paper(col, x, keep):
    """The official formula written out: ((Q̃ ⊙ m_i)·K̃_s + x_s·c_i) / √(D̃/H), masked, softmax, ·V, W_O."""
    q, k = col.q_proj(x), col.k_proj(x)  # (B, T, D̃)
    scores = torch.einsum("btd,hd,bsd->bhts", q, col.mixing, k)
    if col.content_proj is not None:
        scores = scores + torch.einsum("bsd,hd->bhs", x, col.content_proj.weight)[:, :, None, :]
    scores = (scores / math.sqrt(col.shared_dim / H)).masked_fill(~keep, float("-inf"))
    v = col.v_proj(x).view(x.shape[0], x.shape[1], H, DH).transpose(1, 2)  # (B, H, T, dh)
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(x.shape)  # (B, T, D)
    return col.out_proj(out)


@pytest.mark.parametrize("shared_dim", [8, 20, D])  # 20: D̃/H = 2.5 is not an integer (as the official code)
@pytest.mark.parametrize("causal", [False, True])
def test_paper_matches_reference_formula(shared_dim, causal):
    torch.manual_seed(1)
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, causal=causal, shared_dim=shared_dim).double()
    x, pad = _x(2), _padding()
    keep = pad[:, None, None, :] & (torch.ones(T, T, dtype=torch.bool).tril() if causal else True)  # (B, 1, T, S)
    y = col(x, padding_mask=pad)
    expected = _reference_paper(col, x, keep).masked_fill(~pad[..., None], 0.0)
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("causal", [False, True])
def test_content_bias_acts_through_keys_only_and_respects_masks(causal):
    torch.manual_seed(2)
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, causal=causal).double()
    with torch.no_grad():
        col.mixing.zero_()  # leave the content bias as the only score term
        col.content_proj.weight.mul_(5.0)  # a strong bias, so a leak would be visible
    x, pad = _x(3), _padding()
    y = col(x, padding_mask=pad)
    # weights of query t: softmax over its visible keys s of x_s·c_i / √(D̃/H), identical for every query
    cb = torch.einsum("bsd,hd->bhs", x, col.content_proj.weight) / math.sqrt(D / H)  # (B, H, S)
    keep = pad[:, None, None, :] & (torch.ones(T, T, dtype=torch.bool).tril() if causal else True)
    w = torch.softmax(cb[:, :, None, :].masked_fill(~keep, float("-inf")), dim=-1).expand(B, H, T, T)  # (B, H, T, S)
    v = col.v_proj(x).view(B, T, H, DH).transpose(1, 2)  # (B, H, T, dh)
    expected = col.out_proj((w @ v).transpose(1, 2).reshape(B, T, D)).masked_fill(~pad[..., None], 0.0)
    torch.testing.assert_close(y, expected)
    if not causal:  # the bias does not depend on the query: every real query of a sequence gets the same output
        torch.testing.assert_close(y[0], y[0, :1].expand(T, D))
    else:  # no leak: future keys with a large content bias do not change earlier outputs
        torch.testing.assert_close(col(x[:, :4]), col(x)[:, :4])
    # padded keys contribute nothing, however large their bias
    x2 = x.clone()
    x2[1, -3:] = 100.0 * _x(4)[1, -3:]
    torch.testing.assert_close(col(x2, padding_mask=pad), y)


@pytest.mark.parametrize("causal", [False, True])
def test_damcha_repo_identity_mixing_equals_mha(causal):
    torch.manual_seed(3)
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=causal).double()
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, causal=causal, flavor="damcha_repo").double()
    wq, wk, wv = mha.qkv.weight.chunk(3)
    with torch.no_grad():
        mha.qkv.bias[: 2 * D].zero_()  # the repo's shared q/k projections carry no bias
        col.q_proj.weight.copy_(wq)
        col.k_proj.weight.copy_(wk)
        col.v_proj.weight.copy_(wv)
        col.v_proj.bias.copy_(mha.qkv.bias[2 * D :])
        col.out_proj.load_state_dict(mha.out_proj.state_dict())
        col.combine_q.copy_(torch.eye(H))
        col.combine_k.copy_(torch.eye(H))
    x, pad = _x(5), _padding()
    torch.testing.assert_close(col(x, padding_mask=pad), mha(x, padding_mask=pad))
    torch.testing.assert_close(col(x), mha(x))


def test_damcha_repo_mixing_init_and_effect():
    torch.manual_seed(4)
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, flavor="damcha_repo").double()
    for c in (col.combine_q, col.combine_k):
        off = c.data - torch.eye(H, dtype=torch.float64)
        assert off.abs().max() < 0.1 and off.abs().max() > 0  # I + 0.01·N(0,1)
    x = _x(6)
    y = col(x)
    with torch.no_grad():
        col.combine_q[0, 1] += 1.0  # output head 0 now reads input chunk 1 of the queries too
    assert not torch.allclose(col(x), y)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, 67_840),  # variants.md §10: D̃ = D, with V/O biases
        ({"flavor": "damcha_repo"}, 65_920),
    ],
)
def test_params_at_compact_config(options, expected):
    col = zoo.create_attention("colmha", d_model=128, n_heads=8, **options)
    assert col.analytic_params() == expected
    assert sum(p.numel() for p in col.parameters()) == expected


@pytest.mark.parametrize(
    "options",
    [
        {"shared_dim": 8},
        {"shared_dim": 20, "content_bias": False},
        {"mixing_init": "concatenate"},
        {"flavor": "damcha_repo"},
    ],
)
def test_params_analytic_equals_counted(options):
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, **options)
    assert col.analytic_params() == sum(p.numel() for p in col.parameters())


@pytest.mark.parametrize("options", [{}, {"shared_dim": 16}, {"content_bias": False}, {"flavor": "damcha_repo"}])
@pytest.mark.parametrize("causal", [False, True])
def test_flops_match_counter(options, causal):
    batch, seq, d, h = 2, 128, 64, 4
    col = zoo.create_attention("colmha", d_model=d, n_heads=h, causal=causal, **options)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter, torch.no_grad():
        col(torch.randn(batch, seq, d))
    counted = counter.get_total_flops()
    analytic = col.analytic_flops(batch, seq)
    # the counter sees matmuls only; the paper's mixing Q̃ ⊙ m_i is elementwise but counted as T·H·D̃ MACs
    mixing = 0 if col.flavor == "damcha_repo" else 2 * batch * seq * h * col.shared_dim
    assert analytic - mixing == counted
    assert abs(analytic - counted) / counted < 0.01


@pytest.mark.parametrize(
    "options, arg",
    [
        ({"shared_dim": 0}, "shared_dim"),
        ({"mixing_init": "ones"}, "mixing_init"),
        ({"content_bias": 1}, "content_bias"),
        ({"flavor": "damcha_repo", "shared_dim": 16}, "shared_dim"),
        ({"flavor": "damcha_repo", "content_bias": False}, "content_bias"),
        ({"flavor": "nope"}, "flavor"),
    ],
)
def test_bad_options(options, arg):
    with pytest.raises(ValueError, match=f"^{arg}"):
        zoo.create_attention("colmha", d_model=D, n_heads=H, **options)


def test_the_resolved_shared_width_is_reported():
    """Rows and reprs say which D̃ a ColMHA ran with: the default D, or the paper's headline D/4 when asked."""
    default = zoo.create_attention("colmha", d_model=D, n_heads=H)
    quarter = zoo.create_attention("colmha", d_model=D, n_heads=H, shared_dim=D // 4)
    repo = zoo.create_attention("colmha", d_model=D, n_heads=H, flavor="damcha_repo")
    assert (default.shared_dim, quarter.shared_dim, repo.shared_dim) == (D, D // 4, D)
    assert f"shared_dim={D}," in repr(default) and f"shared_dim={D // 4}," in repr(quarter)
    assert f"shared_dim={D}" in repr(repo)
