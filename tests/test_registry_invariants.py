"""Invariants every registered attention (every flavour) must satisfy. New variants are covered automatically."""

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.registry import get_attention_spec

D, H, B, T = 16, 4, 3, 7
# Option sets beyond the defaults that must satisfy the same invariants.
EXTRA_OPTIONS = {
    "damcha": [
        {"collapsed_generator": True},
        {"use_mlp": False},
        {"use_M": False},
        {"off_diag_mode": "bayesian", "fused_rowsum": False},
        {"compact_rank": 2, "use_layer_bias": True, "layer_bias_rank": 2},
    ],
}
CASES = [(n, f, {}) for n in zoo.list_attentions(include_controls=True) for f in get_attention_spec(n).flavors]
CASES += [(n, "paper", opts) for n, extra in EXTRA_OPTIONS.items() for opts in extra]
PAIRS = [(n, (f, opts)) for n, f, opts in CASES]
IDS = [f"{n}-{f}" + "".join(f"-{k}={v}" for k, v in opts.items()) for n, f, opts in CASES]


def make(name, flavor, causal, dtype=torch.float64, **kw):
    flavor, opts = flavor if isinstance(flavor, tuple) else (flavor, {})
    torch.manual_seed(0)
    attn = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, flavor=flavor, **opts, **kw)
    return attn.to(dtype).eval()


def inputs(dtype=torch.float64, b=B, t=T):
    g = torch.Generator().manual_seed(1)
    return torch.randn(b, t, D, generator=g, dtype=dtype)


def causal_options(name):
    return [c for c in (False, True) if c is False or get_attention_spec(name).causal_ok]


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shape_dtype_finite(name, flavor, dtype):
    for causal in causal_options(name):
        attn = make(name, flavor, causal, dtype)
        y = attn(inputs(dtype))
        assert y.shape == (B, T, D) and y.dtype == dtype, (name, causal, y.shape, y.dtype)
        assert torch.isfinite(y).all(), (name, causal)


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_causal_prefix_and_no_leak(name, flavor):
    if not get_attention_spec(name).causal_ok:
        pytest.skip(f"{name} does not support causal masking")
    attn, x = make(name, flavor, True), inputs()
    y = attn(x)
    for k in (1, 4):
        assert_close(attn(x[:, :k]), y[:, :k], msg=f"{name}: prefix {k} differs")
        x2 = x.clone()
        x2[:, k:] += 10 * torch.randn_like(x2[:, k:])
        assert_close(attn(x2)[:, :k], y[:, :k], msg=f"{name}: future tokens leak into position < {k}")


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_padding_invariance(name, flavor):
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[0, 5:] = False  # right padding
    pad[2, 3:] = False
    for causal in causal_options(name):
        attn, x = make(name, flavor, causal), inputs()
        y = attn(x, padding_mask=pad)
        x2 = x.clone()
        x2[~pad] = 100 * torch.randn_like(x2[~pad])
        y2 = attn(x2, padding_mask=pad)
        assert_close(y2[pad], y[pad], msg=f"{name} causal={causal}: padded content changes real outputs")
        assert (y[~pad] == 0).all(), f"{name}: padded query rows must be zero"
        # int padding mask means the same as bool
        assert_close(attn(x, padding_mask=pad.long()), y)


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_batch_independence(name, flavor):
    for causal in causal_options(name):
        attn, x = make(name, flavor, causal), inputs()
        y = attn(x)
        for i in range(B):
            assert_close(attn(x[i : i + 1]), y[i : i + 1], msg=f"{name} causal={causal}: sample {i} depends on batch")


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_fully_masked_rows_finite(name, flavor):
    for causal in causal_options(name):
        attn = make(name, flavor, causal)
        x = inputs().requires_grad_(True)
        mask = torch.ones(T, T, dtype=torch.bool)
        mask[2] = False  # query 2 sees nothing
        y = attn(x, attn_mask=mask)
        assert torch.isfinite(y).all(), name
        y.square().sum().backward()
        assert torch.isfinite(x.grad).all(), name
        for n, p in attn.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), (name, n)
        # left padding under causality: the first real query of row 0 is preceded by dead padded queries
        pad = torch.ones(B, T, dtype=torch.bool)
        pad[0, :2] = False
        y = attn(inputs(), padding_mask=pad)
        assert torch.isfinite(y).all(), name


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_mask_dtypes_agree(name, flavor):
    for causal in causal_options(name):
        attn, x = make(name, flavor, causal), inputs()
        keep = torch.rand(B, T, T, generator=torch.Generator().manual_seed(3)) > 0.3
        keep |= torch.eye(T, dtype=torch.bool)
        ref = attn(x, attn_mask=keep)
        assert_close(attn(x, attn_mask=keep.int()), ref, msg=f"{name}: int mask differs from bool")
        additive = torch.zeros(B, T, T, dtype=torch.float64).masked_fill(~keep, float("-inf"))
        assert_close(attn(x, attn_mask=additive), ref, msg=f"{name}: float -inf mask differs from bool")
        assert_close(attn(x, attn_mask=keep[:, None].expand(B, H, T, T)), ref, msg=f"{name}: [B,H,T,S] mask")
        bias = torch.randn(T, T, dtype=torch.float64)
        assert not torch.allclose(attn(x, attn_mask=bias), attn(x)), f"{name}: a float mask must shift the logits"


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_parameters_get_gradients(name, flavor):
    for causal in causal_options(name):
        attn = make(name, flavor, causal).train()
        x = inputs().requires_grad_(True)
        loss = attn(x).square().mean()
        if attn.aux_loss is not None:
            loss = loss + attn.aux_loss
        loss.backward()
        missing = [n for n, p in attn.named_parameters() if p.grad is None]
        if get_attention_spec(name).data_dependent_compute:
            # routed variants: unselected experts legitimately get no gradient in one step
            assert len(missing) < len(list(attn.parameters())), (name, missing)
        else:
            assert not missing, f"{name} causal={causal}: no gradient for {missing}"
        for n, p in attn.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), (name, n)


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_analytic_params_match(name, flavor):
    for causal in causal_options(name):
        attn = make(name, flavor, causal)
        counted = sum(p.numel() for p in attn.parameters())
        assert attn.analytic_params() == counted, (name, flavor, attn.analytic_params(), counted)
        assert attn.analytic_flops(2, T) > 0


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_decoder_prefix_causality(name, flavor):
    if not get_attention_spec(name).causal_ok:
        pytest.skip(f"{name} does not support causal masking")
    for share in (True, False):
        torch.manual_seed(0)
        flavor_name, opts = flavor
        model = zoo.models.Decoder(vocab_size=31, d_model=D, n_layers=2, n_heads=H, attention=name,
                                   attention_options={"flavor": flavor_name, **opts}, share_mlp=share, max_seq_len=16)
        model = model.double().eval()
        tokens = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(4))
        out = model(tokens)
        assert out.logits.shape == (2, 9, 31) and out.aux_loss.dim() == 0
        assert_close(model(tokens[:, :5]).logits, out.logits[:, :5], msg=f"{name} share={share}")


def bad_input_cases():
    good = dict(d_model=D, n_heads=H)
    x = inputs(torch.float32)
    return [
        ("name", lambda: zoo.create_attention("nope", **good)),
        ("n_heads", lambda: zoo.create_attention("mha", d_model=10, n_heads=4)),
        ("d_model", lambda: zoo.create_attention("mha", d_model=-4, n_heads=2)),
        ("n_heads", lambda: zoo.create_attention("mha", d_model=16, n_heads=0)),
        ("options", lambda: zoo.create_attention("mha", **good, not_an_option=1)),
        ("dropout", lambda: zoo.create_attention("mha", **good, dropout=1.5)),
        ("flavor", lambda: zoo.create_attention("mha", **good, flavor="bogus")),
        ("causal", lambda: zoo.create_attention("mha", **good, causal="yes")),
        ("x", lambda: zoo.create_attention("mha", **good)(x[0])),
        ("x", lambda: zoo.create_attention("mha", **good)(x[..., :8])),
        ("x", lambda: zoo.create_attention("mha", **good)(x.long())),
        ("x", lambda: zoo.create_attention("mha", **good, max_seq_len=4)(x)),
        ("padding_mask", lambda: zoo.create_attention("mha", **good)(x, padding_mask=torch.ones(B, T + 1).bool())),
        ("padding_mask", lambda: zoo.create_attention("mha", **good)(x, padding_mask=torch.ones(B, T))),
        ("attn_mask", lambda: zoo.create_attention("mha", **good)(x, attn_mask=torch.ones(T, T + 2).bool())),
        ("attn_mask", lambda: zoo.create_attention("mha", **good)(x, attn_mask=torch.ones(B + 1, T, T).bool())),
        ("attn_mask", lambda: zoo.create_attention("mha", **good)(x, attn_mask=torch.ones(B, H + 1, T, T).bool())),
        ("attn_mask", lambda: zoo.create_attention("mha", **good)(x, attn_mask=torch.ones(T, T, dtype=torch.cfloat))),
        ("attn_mask", lambda: zoo.create_attention("mha", **good)(x, attn_mask=[[1]])),
        ("stack_context", lambda: zoo.create_attention("mha", **good)(x, stack_context=object())),
        ("off_diag_mode", lambda: zoo.create_attention("damcha", **good, off_diag_mode="diagonal")),
        ("hidden_dims", lambda: zoo.create_attention("damcha", **good, hidden_dims=(8, -1))),
        ("compact_rank", lambda: zoo.create_attention("damcha", **good, compact_rank=-2)),
        ("vocab_size", lambda: zoo.models.Decoder(vocab_size=0, d_model=D, n_layers=1, n_heads=H)),
        ("tokens", lambda: zoo.models.Decoder(vocab_size=5, d_model=D, n_layers=1, n_heads=H)(torch.full((1, 3), 7))),
        ("norm", lambda: zoo.models.Decoder(vocab_size=5, d_model=D, n_layers=1, n_heads=H, norm="mid")),
        ("patch_size", lambda: zoo.models.VisionTransformer(10, 3, 2, D, 1, H)),
    ]


@pytest.mark.parametrize("case", range(len(bad_input_cases())))
def test_bad_inputs_raise_value_error_naming_the_argument(case):
    arg, fn = bad_input_cases()[case]
    with pytest.raises(ValueError) as err:
        fn()
    assert str(err.value).startswith(f"{arg}:") or f"{arg}:" in str(err.value), str(err.value)


@pytest.mark.parametrize("name", zoo.list_attentions(include_controls=True))
def test_bad_inputs_every_variant(name):
    attn = zoo.create_attention(name, d_model=D, n_heads=H)
    with pytest.raises(ValueError, match="^x:"):
        attn(inputs(torch.float32)[..., :-1])
    with pytest.raises(ValueError, match="^attn_mask:"):
        attn(inputs(torch.float32), attn_mask=torch.ones(T + 1, T).bool())
    with pytest.raises(ValueError, match="^options:"):
        zoo.create_attention(name, d_model=D, n_heads=H, definitely_unknown=True)


def test_registry_listing_and_duplicates():
    names = zoo.list_attentions()
    assert names == sorted(names) and "mha" in names and "damcha" in names
    assert zoo.list_attentions("d*") == [n for n in names if n.startswith("d")]
    assert zoo.list_attentions(["mha", "dam*"]) == ["damcha", "mha"]
    assert "mha" not in zoo.list_attentions(exclude="mha")
    with pytest.raises(ValueError, match="already registered"):
        zoo.register_attention("mha")(type("Dup", (), {}))
    with pytest.raises(ValueError, match="available: .*mha"):
        zoo.get_attention_spec("nope")
    spec = zoo.get_attention_spec("mha")
    assert spec.fused_kernel and not spec.stack_shared and zoo.get_attention_spec("damcha").stack_shared


def test_create_attention_drops_none_options():
    a = zoo.create_attention("mha", d_model=D, n_heads=H, bias=None)
    assert a.bias is True


@pytest.mark.parametrize("name,flavor", PAIRS, ids=IDS)
def test_capability_flags_are_honest(name, flavor):
    """The flags the backbones and benchmarks read: a fused core keeps no full logits; only ``has_aux_loss``
    variants set an auxiliary loss (the stack skips collection otherwise); only ``stack_shared`` ones take ``stack``."""
    spec = get_attention_spec(name)
    assert not (spec.fused_kernel and spec.needs_full_logits)
    assert spec.core in ("fused", "full logits", "explicit")
    attn = make(name, flavor, False).train()
    attn(inputs())
    set_aux = [m for m in attn.modules() if torch.is_tensor(getattr(m, "aux_loss", None))]
    assert not set_aux or spec.has_aux_loss, f"{name} sets aux_loss without declaring has_aux_loss"
    if not spec.stack_shared:
        with pytest.raises(ValueError, match="^stack:"):
            zoo.create_attention(name, d_model=D, n_heads=H, stack=zoo.StackShare())
        assert "stack" not in spec.options
