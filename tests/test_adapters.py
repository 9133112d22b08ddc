"""zoo.swap_attention: faithful (mha swap == host), causal hosts stay causal, gradients flow, stack sharing,
refusals that name the module path, GPT-2's cache."""

import copy

import pytest
import torch
from torch import nn

import attention_zoo as zoo
from attention_zoo.adapters import SharedStackContext, _Swapped

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

VARIANTS = zoo.list_attentions()
TOL = 1e-5


def small_opts(name):
    """Keep the DAMCHA generator tiny so every test stays fast."""
    return {"hidden_dims": (16,)} if "hidden_dims" in zoo.get_attention_spec(name).options else {}


def vit(**kw):
    torch.manual_seed(0)
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=5,
                             **kw).eval()


def gpt2(impl="sdpa", **kw):
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, bos_token_id=0, eos_token_id=0,
                     attn_implementation=impl, **kw)
    return GPT2LMHeadModel(cfg).eval()


def encoder(batch_first=True, norm_first=False, n=2):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    return nn.TransformerEncoder(layer, n, enable_nested_tensor=False).eval()


def swapped(model):
    return [m for m in model.modules() if isinstance(m, _Swapped)]


# ---- faithfulness: mha with the host's weights reproduces the host -------------------------------------------
@pytest.mark.parametrize("qkv_bias", [True, False])
def test_timm_vit_mha_swap_reproduces_the_host(qkv_bias):
    host = vit(qkv_bias=qkv_bias)
    img = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        ref = host(img)
        model = zoo.swap_attention(copy.deepcopy(host), "mha")
        out = model(img)
    assert len(swapped(model)) == 2 and all(type(b.attn).__name__ == "TimmAttentionAdapter" for b in model.blocks)
    assert (out - ref).abs().max() <= TOL


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_gpt2_mha_swap_reproduces_the_host_with_padding(impl):
    host = gpt2(impl)
    ids = torch.randint(1, 50, (2, 7))
    am = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # left padding
    right = torch.tensor([[1] * 7, [1, 1, 1, 1, 1, 0, 0]])
    model = zoo.swap_attention(copy.deepcopy(host), "mha")
    assert len(swapped(model)) == 2
    with torch.no_grad():
        assert (model(ids).logits - host(ids).logits).abs().max() <= TOL
        for mask in (am, right):
            diff = model(ids, attention_mask=mask).logits - host(ids, attention_mask=mask).logits
            assert diff[mask.bool()].abs().max() <= TOL  # real tokens; padded positions follow our contract
        loss_ref = host(ids, labels=ids, use_cache=False).loss
        assert abs(model(ids, labels=ids, use_cache=False).loss - loss_ref) <= TOL


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_encoder_mha_swap_reproduces_the_host(batch_first, norm_first):
    host = encoder(batch_first, norm_first)
    x = torch.randn(2, 6, 32)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # True = padded (torch convention)
    causal = nn.Transformer.generate_square_subsequent_mask(6)

    def run(m, **kw):
        xi = x if batch_first else x.transpose(0, 1)
        with torch.no_grad():
            y = m(xi, **kw)
        return y if batch_first else y.transpose(0, 1)

    plain = zoo.swap_attention(copy.deepcopy(host), "mha")
    assert (run(plain) - run(host)).abs().max() <= TOL
    assert (run(plain, src_key_padding_mask=kpm) - run(host, src_key_padding_mask=kpm))[~kpm].abs().max() <= TOL
    causal_model = zoo.swap_attention(copy.deepcopy(host), "mha", causal=True)
    for kw in ({"mask": causal, "is_causal": True}, {"mask": causal}, {"mask": causal.isinf()}):
        ref = run(host, **kw)
        assert (run(causal_model, **kw) - ref).abs().max() <= TOL
    kw = {"mask": causal.isinf(), "is_causal": True, "src_key_padding_mask": kpm}
    assert (run(causal_model, **kw) - run(host, **kw))[~kpm].abs().max() <= TOL


@pytest.mark.parametrize("batch_first", [True, False])
def test_bare_multihead_attention_mha_swap_reproduces_the_host(batch_first):
    torch.manual_seed(0)
    host = nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    x = torch.randn(2, 5, 32) if batch_first else torch.randn(5, 2, 32)
    kpm = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    model = zoo.swap_attention(copy.deepcopy(host), "mha")
    assert isinstance(model, _Swapped)
    with torch.no_grad():
        ref, _ = host(x, x, x, key_padding_mask=kpm, need_weights=False)
        out, weights = model(x, x, x, key_padding_mask=kpm)
        real = ~kpm if batch_first else ~kpm.T
        assert weights is None and (out - ref)[real].abs().max() <= TOL
        unbatched = x[0] if batch_first else x[:, 0]
        assert (model(unbatched, unbatched, unbatched)[0] - host(unbatched, unbatched, unbatched)[0]).abs().max() \
            <= TOL
        mask = torch.rand(5, 5) < 0.3  # torch: True = not allowed
        mask.fill_diagonal_(False)
        assert (model(x, x, x, attn_mask=mask)[0] - host(x, x, x, attn_mask=mask)[0]).abs().max() <= TOL


# ---- causality carried over ---------------------------------------------------------------------------------
def _future_change(model, call):
    a = torch.randint(1, 50, (2, 8))
    b = a.clone()
    b[:, 5:] = (b[:, 5:] + 7) % 50
    with torch.no_grad():
        return (call(model, a)[:, :5] - call(model, b)[:, :5]).abs().max().item()


@pytest.mark.parametrize("name", VARIANTS)
def test_gpt2_stays_causal_after_swapping_each_variant(name):
    model = zoo.swap_attention(gpt2(), name, **small_opts(name))
    assert _future_change(model, lambda m, ids: m(ids).logits) <= TOL


@pytest.mark.parametrize("name", VARIANTS)
def test_torch_encoder_stays_causal_after_swapping_each_variant(name):
    model = zoo.swap_attention(encoder(), name, causal=True, **small_opts(name))
    emb = nn.Embedding(50, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(8)
    assert _future_change(model, lambda m, ids: m(emb(ids), mask=mask, is_causal=True)) <= TOL


# ---- gradients ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_reach_the_new_attention_in_every_host(name):
    opts = small_opts(name)
    hosts = [
        (zoo.swap_attention(vit(), name, **opts), lambda m: m(torch.randn(2, 3, 16, 16)).sum()),
        (zoo.swap_attention(gpt2(), name, **opts),
         lambda m: m(torch.randint(0, 50, (2, 6)), labels=torch.randint(0, 50, (2, 6)), use_cache=False).loss),
        (zoo.swap_attention(encoder(), name, **opts), lambda m: m(torch.randn(2, 6, 32)).sum()),
    ]
    for model, loss_fn in hosts:
        model.train()
        loss = loss_fn(model)
        aux = zoo.collect_aux_losses(model)
        (loss + (aux if aux is not None else 0)).backward()
        adapters = swapped(model)
        assert adapters
        for adapter in adapters:
            grads = [p.grad for p in adapter.attn.parameters() if p.requires_grad]
            assert any(g is not None and g.abs().sum() > 0 for g in grads), (type(model).__name__, adapter.path)


# ---- stack sharing ------------------------------------------------------------------------------------------
def _generators(model):
    return {id(a.attn.metric_generator) for a in swapped(model)}


@pytest.mark.parametrize("host", ["vit", "gpt2", "encoder"])
def test_stack_shared_variant_gets_one_shared_module(host):
    build = {"vit": vit, "gpt2": gpt2, "encoder": lambda: encoder(n=3)}[host]
    shared_spec = [n for n in VARIANTS if zoo.get_attention_spec(n).stack_shared]
    assert shared_spec
    name = shared_spec[0]
    base = sum(p.numel() for p in build().parameters())
    shared = zoo.swap_attention(build(), name, share_mlp=True, hidden_dims=(16,))
    own = zoo.swap_attention(build(), name, share_mlp=False, hidden_dims=(16,))
    owner = shared.attention_zoo_shared
    assert isinstance(owner, SharedStackContext)
    assert _generators(shared) == {id(owner.shared)} and len(_generators(own)) == len(swapped(own)) > 1
    n_layers = len(swapped(shared))
    gen_params = sum(p.numel() for p in owner.shared.parameters())
    added_shared = sum(p.numel() for p in shared.parameters()) - base
    added_own = sum(p.numel() for p in own.parameters()) - base
    assert added_own - added_shared == (n_layers - 1) * gen_params  # the generator counted once
    saved = [k for k in shared.state_dict() if k.startswith("attention_zoo_shared.")]
    assert len(saved) == len(owner.shared.state_dict())  # saved once, under the owner


def test_stack_context_is_computed_once_per_forward_on_the_block_input():
    model = zoo.swap_attention(gpt2(), "damcha", hidden_dims=(16,))
    owner = model.attention_zoo_shared
    calls = []
    original = owner.begin
    owner.begin = lambda x, pad: (calls.append(x.shape), original(x, pad))[1]
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        model(ids, use_cache=False)
        model(ids, attention_mask=torch.tensor([[1] * 6, [0, 1, 1, 1, 1, 1]]), use_cache=False)
    assert calls == [torch.Size([2, 6, 32])] * 2
    assert owner._ctx is None  # released after the last layer


# ---- refusals -----------------------------------------------------------------------------------------------
def test_unsupported_layouts_name_the_module_path():
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(32, 4, 64, batch_first=True), 2)
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.multihead_attn: cross-attention"):
        zoo.swap_attention(decoder, "mha")
    with pytest.raises(ValueError, match=r"^model\.transformer\.h\.0\.crossattention: cross-attention"):
        zoo.swap_attention(gpt2(add_cross_attention=True), "mha")
    with pytest.raises(ValueError, match=r"^model\.blocks\.0\.attn: cannot copy.*qk_norm"):
        zoo.swap_attention(vit(qk_norm=True), "mha")
    zoo.swap_attention(vit(qk_norm=True), "mha", copy_weights=False)  # a fresh attention is fine
    with pytest.raises(ValueError, match=r"^model\.h\.0\.attn: n_heads"):
        zoo.swap_attention(_odd_heads_host(), "mha")
    with pytest.raises(ValueError, match=r"^model\.self_attn: kdim/vdim"):
        zoo.swap_attention(_Holder(nn.MultiheadAttention(32, 4, kdim=16, vdim=16)), "mha")
    with pytest.raises(ValueError, match=r"^model\.enc\.attn: BertLikeAttention is not a supported"):
        zoo.swap_attention(nn.ModuleDict({"enc": nn.ModuleDict({"attn": BertLikeAttention()})}), "mha")
    with pytest.raises(ValueError, match=r"^model: no supported self-attention"):
        zoo.swap_attention(nn.Linear(4, 4), "mha")
    with pytest.raises(ValueError, match=r"^model\.blocks\.0\.attn: cannot copy.*add_bias_kv"):
        zoo.swap_attention(_blocks(nn.MultiheadAttention(32, 4, add_bias_kv=True)), "mha")


class BertLikeAttention(nn.Module):
    def forward(self, x):
        return x


class _Holder(nn.Module):
    def __init__(self, attn, attr="self_attn"):
        super().__init__()
        setattr(self, attr, attn)


def _blocks(attn, container="blocks"):
    return nn.ModuleDict({container: nn.ModuleList([_Holder(attn, "attn")])})


def _odd_heads_host():
    """A head layout the new attention cannot take: timm's attn_head_dim allows dim=30 with 4 heads."""
    from timm.layers import Attention

    return _blocks(Attention(30, 4, attn_head_dim=8), "h")


def test_causality_mismatch_is_refused_with_the_path_and_the_fix():
    model = zoo.swap_attention(encoder(), "mha")  # built non-causal
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.self_attn: called causally.*causal=True"):
        model(torch.randn(2, 5, 32), mask=mask, is_causal=True)
    causal_model = zoo.swap_attention(encoder(), "damcha", causal=True, hidden_dims=(16,))
    with pytest.raises(ValueError, match=r"^model\.layers\.0\.self_attn: called without a causal mask"):
        causal_model(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match=r"causal=False is not supported"):
        zoo.swap_attention(gpt2(), "mha", causal=False)
    mha = zoo.swap_attention(nn.MultiheadAttention(32, 4, batch_first=True), "mha")
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match=r"^model: cross-attention"):
        mha(x, torch.randn(2, 5, 32), x)


# ---- GPT-2 cache ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mha", "dcmha"])
def test_gpt2_cached_generation_matches_uncached(name):
    host = gpt2()
    ids = torch.randint(1, 50, (2, 5))
    am = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    model = zoo.swap_attention(copy.deepcopy(host), name)
    kw = dict(attention_mask=am, max_new_tokens=4, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, use_cache=True, **kw)
    assert torch.equal(cached, model.generate(ids, use_cache=False, **kw))
    if name == "mha":
        assert torch.equal(cached, host.generate(ids, use_cache=True, **kw))


def test_gpt2_cache_refusals_name_use_cache():
    model = zoo.swap_attention(gpt2(), "damcha", hidden_dims=(16,))
    ids = torch.randint(1, 50, (1, 4))
    kw = dict(max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(ValueError, match=r"^model\.transformer\.h\.0\.attn: use_cache: .*use_cache=False"):
        model.generate(ids, use_cache=True, **kw)
    assert model.generate(ids, use_cache=False, **kw).shape == (1, 6)
    from transformers import StaticCache

    plain = zoo.swap_attention(gpt2(), "mha")
    cache = StaticCache(config=plain.config, max_cache_len=8)
    with pytest.raises(ValueError, match=r"use_cache: only a DynamicCache"):
        plain(ids, cache=cache, use_cache=True)
