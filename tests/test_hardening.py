"""Bad module inputs give a ValueError that names the argument: never a raw torch error, never silence."""

import pytest
import torch

import attention_zoo as zoo
from attention_zoo.registry import get_attention_spec
from attention_zoo.variants.damcha_generator import MetricConfig

D, H, B, T = 16, 4, 2, 6
CASES = [(n, f) for n in zoo.list_attentions() for f in get_attention_spec(n).flavors]
# Every bool option per variant (the checks must cover at least these; the list is written out by hand so a
# variant whose option stops being checked fails here).
BOOL_OPTIONS = {
    "mha": ["bias", "fused"],
    "tha": ["bias"],
    "dcmha": ["bias", "use_static", "pre_compose", "post_compose", "query_wise", "key_wise"],
    "colmha": ["content_bias"],
    "mma": ["all_global"],
    "moa": ["noisy_gating"],
    "damcha": ["use_M", "use_mlp", "share_mlp", "use_multihead_M", "use_layer_bias", "free_M", "fused_rowsum",
               "collapsed_generator"],
}
BOOL_CASES = [(n, o) for n, opts in BOOL_OPTIONS.items() for o in opts + ["causal"]]


def test_bool_option_list_is_complete():
    assert sorted(BOOL_OPTIONS) == zoo.list_attentions()
    for name, opts in BOOL_OPTIONS.items():
        assert set(opts) <= set(get_attention_spec(name).options), name
    assert {f.name for f in MetricConfig.__dataclass_fields__.values() if f.type == "bool"} <= set(
        BOOL_OPTIONS["damcha"])


@pytest.mark.parametrize("name,option", BOOL_CASES)
@pytest.mark.parametrize("value", ["no", "false", "True", 1, 0, 1.0])
def test_bool_options_reject_non_bools(name, option, value):
    with pytest.raises(ValueError, match=f"^{option}: expected a bool"):
        zoo.create_attention(name, d_model=D, n_heads=H, **{option: value})


@pytest.mark.parametrize("name,option", BOOL_CASES)
def test_bool_options_reject_non_bools_when_built_directly(name, option):
    cls = get_attention_spec(name).cls
    with pytest.raises(ValueError, match=f"^{option}:"):
        cls(D, H, **{option: "no"})


@pytest.mark.parametrize("name,option", [(n, o) for n, o in BOOL_CASES if o != "causal"])
def test_bool_options_still_accept_bools(name, option):
    for value in (False, True):
        try:
            attn = zoo.create_attention(name, d_model=D, n_heads=H, **{option: value})
        except ValueError as exc:  # a legal bool clashing with a default (e.g. all heads switched off)
            assert not str(exc).startswith(f"{option}: expected a bool"), exc
            continue
        assert attn(torch.randn(B, T, D)).shape == (B, T, D)


@pytest.mark.parametrize("value,arg", [(32, "mlp_hidden"), ("32", "mlp_hidden"), ({"a": 1}, "mlp_hidden")])
def test_damcha_wrong_typed_hidden(value, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        zoo.create_attention("damcha", d_model=D, n_heads=H, mlp_hidden=value)


@pytest.mark.parametrize("opts,arg", [({"stack": "x"}, "stack"), ({"hidden_dims": 8}, "hidden_dims"),
                                      ({"hidden_dims": (8, True)}, "hidden_dims"),
                                      ({"off_diag_mode": ["mlp"]}, "off_diag_mode"),
                                      ({"gen_dropout": "0.1"}, "gen_dropout"), ({"compact_rank": 1.5}, "compact_rank")])
def test_damcha_wrong_typed_options(opts, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        zoo.create_attention("damcha", d_model=D, n_heads=H, **opts)


@pytest.mark.parametrize("name,flavor", CASES)
def test_dtype_mismatch_is_rejected(name, flavor):
    attn = zoo.create_attention(name, d_model=D, n_heads=H, flavor=flavor)
    with pytest.raises(ValueError, match=r"^x: dtype torch.float64 does not match"):
        attn(torch.randn(B, T, D, dtype=torch.float64))
    assert attn.double()(torch.randn(B, T, D, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("name,flavor", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_padded_inputs_do_not_reach_real_tokens(name, flavor, causal, poison):
    if causal and not get_attention_spec(name).causal_ok:
        pytest.skip(f"{name} has no causal mode")
    torch.manual_seed(0)
    attn = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, flavor=flavor).double().train()
    x = torch.randn(B, T, D, dtype=torch.float64)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 4:] = False
    pad[1, 0] = False  # a padded position before real ones (prefix means, routing)
    clean = x.clone().requires_grad_(True)
    y_clean = attn(clean, padding_mask=pad)
    poisoned = x.masked_fill(~pad[..., None], poison).requires_grad_(True)
    y = attn(poisoned, padding_mask=pad)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, y_clean)
    loss = y.sum() + (attn.aux_loss if torch.is_tensor(attn.aux_loss) else 0.0)
    loss.backward()
    assert torch.isfinite(poisoned.grad).all()


def test_non_finite_padded_inputs_in_a_shared_stack():
    torch.manual_seed(0)
    model = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=2, n_heads=H, attention="damcha",
                               attention_options={"hidden_dims": (8,)})
    tokens = torch.randint(0, 11, (B, T))
    pad = torch.ones(B, T, dtype=torch.int64)
    pad[0, 3:] = 0
    x = model.tok_emb(tokens) + model.pos_emb[:T]
    h_clean, _ = model.stack(x, pad)
    h, _ = model.stack(x.masked_fill(pad[..., None] == 0, float("nan")), pad)
    real = pad.bool()
    torch.testing.assert_close(h[real], h_clean[real])


@pytest.mark.parametrize("name,flavor", CASES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_float_attn_mask_with_nan_or_posinf_is_rejected(name, flavor, bad):
    attn = zoo.create_attention(name, d_model=D, n_heads=H, flavor=flavor)
    mask = torch.zeros(T, T)
    mask[2, 3] = bad
    with pytest.raises(ValueError, match="^attn_mask:"):
        attn(torch.randn(B, T, D), attn_mask=mask)
    mask[2, 3] = float("-inf")  # -inf is the masked value and stays legal
    assert torch.isfinite(attn(torch.randn(B, T, D), attn_mask=mask)).all()


@pytest.mark.parametrize("tokens", [
    torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.complex64),
    torch.full((2, 3), 11), torch.full((2, 3), -1), torch.zeros(2, 0, dtype=torch.long),
    torch.zeros(3, dtype=torch.long), [[1, 2]]],
    ids=["bool", "float", "complex", "too_large", "negative", "empty", "1d", "list"])
def test_decoder_rejects_bad_tokens(tokens):
    model = zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=1, n_heads=H)
    with pytest.raises(ValueError, match="^tokens:"):
        model(tokens)
    assert model(torch.full((2, 3), 10, dtype=torch.int32)).logits.shape == (2, 3, 11)


def test_backbone_bool_options():
    with pytest.raises(ValueError, match="^share_mlp:"):
        zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=1, n_heads=H, share_mlp="no")
    with pytest.raises(ValueError, match="^tie_weights:"):
        zoo.models.Decoder(vocab_size=11, d_model=D, n_layers=1, n_heads=H, tie_weights=0)
