"""Rotary positions (RoPE) through every registered attention and through Decoder(positions="rope")."""

import pytest
import torch

import attention_zoo as zoo
from attention_zoo import AttentionBase, Rotary

D, H, T = 32, 4, 7
VARIANTS = zoo.list_attentions()
BUILT_IN = ("colmha", "damcha", "dcmha", "mha", "mma", "moa", "tha")


def small_opts(name):
    return {"hidden_dims": (16,)} if "hidden_dims" in zoo.get_attention_spec(name).options else {}


def rope_from(attn, offset=0, base=10000.0, seq=T):
    """RoPE at positions offset..offset+seq-1, float64 angles."""
    full = Rotary.standard(seq + offset, attn.rotary_dim, base=base, dtype=torch.float64)
    return Rotary(full.cos[:, offset:], full.sin[:, offset:])


def test_every_built_in_attention_applies_rotary_positions():
    assert all(zoo.get_attention_spec(n).rotary_ok for n in BUILT_IN)


@pytest.mark.parametrize("name", [n for n in VARIANTS if zoo.get_attention_spec(n).rotary_ok])
@pytest.mark.parametrize("causal", [False, True])
def test_rotary_rotates_queries_and_keys_alike(name, causal):
    """RoPE on both sides makes each logit a function of s - t: shifting every position leaves the output unchanged
    (it would not if only queries or only keys were rotated), while other frequencies change it."""
    for flavor in zoo.get_attention_spec(name).flavors:
        torch.manual_seed(0)
        attn = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, flavor=flavor,
                                    **small_opts(name)).double().eval()
        x = torch.randn(2, T, D, dtype=torch.float64)
        pad = torch.tensor([[True] * T, [True] * (T - 2) + [False] * 2])
        with torch.no_grad():
            y = attn(x, padding_mask=pad, rotary=rope_from(attn))
            shifted = attn(x, padding_mask=pad, rotary=rope_from(attn, offset=5))
            plain = attn(x, padding_mask=pad)
            other = attn(x, padding_mask=pad, rotary=(rope_from(attn, base=10.0).cos, rope_from(attn, base=10.0).sin))
        torch.testing.assert_close(shifted, y, atol=1e-10, rtol=0)
        assert (y - plain).abs().max() > 1e-3 and (y - other).abs().max() > 1e-3, (name, flavor)


def test_colmha_rotates_its_shared_space_in_head_wide_blocks():
    """ColMHA with D̃ = D and the concatenate init, holding MHA's bias-free weights, equals MHA under RoPE."""
    torch.manual_seed(0)
    mha = zoo.create_attention("mha", d_model=D, n_heads=H, causal=True, bias=False).double()
    col = zoo.create_attention("colmha", d_model=D, n_heads=H, causal=True, mixing_init="concatenate").double()
    wq, wk, wv = mha.qkv.weight.chunk(3)
    with torch.no_grad():
        for lin, w in ((col.q_proj, wq), (col.k_proj, wk), (col.v_proj, wv), (col.out_proj, mha.out_proj.weight)):
            lin.weight.copy_(w)
        col.content_proj.weight.zero_()
        col.v_proj.bias.zero_()
        col.out_proj.bias.zero_()
    assert col.rotary_dim == mha.rotary_dim == D // H and col.rotary_widths() == (D,)
    x = torch.randn(2, T, D, dtype=torch.float64)
    torch.testing.assert_close(col(x, rotary=rope_from(mha)), mha(x, rotary=rope_from(mha)))


class _NoPositions(AttentionBase):
    """An attention that does not declare ``rotary_ok`` (not registered)."""

    def _attend(self, x, masks, stack_context):
        return x

    def analytic_params(self):
        return 0

    def analytic_flops(self, batch, seq_len):
        return 0


def test_bad_rotary_is_refused_by_name():
    x = torch.randn(2, T, D)
    rot = Rotary.standard(T, D // H)
    with pytest.raises(ValueError, match=r"^rotary: _NoPositions does not apply rotary positions"):
        _NoPositions(D, H)(x, rotary=rot)
    mha = zoo.create_attention("mha", d_model=D, n_heads=H)
    assert _NoPositions(D, H)(x) is not None and mha(x, rotary=(rot.cos[0], rot.sin[0])).shape == x.shape
    bad = [
        (rot.cos, None),  # not a pair of tensors
        (rot.cos[:, :-1], rot.sin[:, :-1]),  # wrong length
        (rot.cos.expand(3, -1, -1), rot.sin.expand(3, -1, -1)),  # wrong batch
        Rotary.standard(T, 6),  # 6 does not divide the head width 8
        (rot.cos[..., :7], rot.sin[..., :7]),  # odd width
        (rot.cos, rot.sin.double()[..., :4]),  # shapes differ
        "positions",
    ]
    for r in bad:
        with pytest.raises(ValueError, match=r"^rotary: "):
            mha(x, rotary=r)


# ---- Decoder(positions="rope") ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in VARIANTS if zoo.get_attention_spec(n).rotary_ok])
def test_decoder_with_rope_is_causal_and_trains(name):
    torch.manual_seed(0)
    model = zoo.models.Decoder(64, D, 2, H, attention=name, attention_options=small_opts(name), positions="rope",
                               max_seq_len=16)
    assert model.pos_emb is None
    tokens = torch.randint(0, 64, (2, 9))
    model.eval()
    with torch.no_grad():
        full = model(tokens).logits
        prefix = model(tokens[:, :5]).logits
        changed = tokens.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % 64
        torch.testing.assert_close(prefix, full[:, :5], atol=1e-5, rtol=0)
        torch.testing.assert_close(model(changed).logits[:, :6], full[:, :6], atol=1e-5, rtol=0)
        swapped = tokens[:, [1, 0, *range(2, 9)]]  # an order change reaches the logits through positions only
        assert (model(swapped).logits[:, 2] - full[:, 2]).abs().max() > 1e-4
    model.train()
    out = model(tokens)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), tokens.flatten()) + out.aux_loss
    loss.backward()
    for i, attn in enumerate(model.stack.attentions()):
        grads = [p.grad for p in attn.parameters()]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), (name, i)
        assert any(g.abs().sum() > 0 for g in grads), (name, i)


def test_decoder_rope_needs_the_capability():
    from attention_zoo import registry

    before = dict(registry._REGISTRY)
    try:
        zoo.register_attention("nopos")(_NoPositions)
        zoo.models.Decoder(64, D, 2, H, attention="nopos")  # fine with additive positions
        with pytest.raises(ValueError, match=r"^positions: 'rope' needs an attention .*'nopos' does not"):
            zoo.models.Decoder(64, D, 2, H, attention="nopos", positions="rope")
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)
