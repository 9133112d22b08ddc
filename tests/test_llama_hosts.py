"""zoo.swap_attention on Llama-family hosts (HF Llama, Mistral, Qwen2 built from configs): the host's rotary positions
reach every variant, an mha swap reproduces the host in training and in cached generation, and what we cannot
express (grouped K/V heads for copying, sliding windows) is refused by name."""

import copy

import pytest
import torch

import attention_zoo as zoo
from attention_zoo.adapters import _Swapped

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

KINDS = ("llama", "mistral", "qwen2")
VARIANTS = zoo.list_attentions()
TOL = 1e-5
V = 64


def small_opts(name):
    return {"hidden_dims": (16,)} if "hidden_dims" in zoo.get_attention_spec(name).options else {}


def host(kind, **kw):
    """A 2-layer host, hidden 32, 4 heads, with random attention biases where the host has them (HF zeroes them)."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               attn_implementation="sdpa")
    cfg.update(kw)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**{"sliding_window": None, **cfg}))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0, 0.5)
    return model


def _ids():
    ids = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # left padding
    return ids, mask


@pytest.mark.parametrize("kind,extra", [("llama", {}), ("llama", {"attention_bias": True}), ("mistral", {}),
                                        ("qwen2", {})])
def test_mha_swap_reproduces_the_host_in_training(kind, extra):
    ref = host(kind, **extra).train()
    model = zoo.swap_attention(copy.deepcopy(ref), "mha")
    assert [type(m).__name__ for m in model.modules() if isinstance(m, _Swapped)] == ["LlamaAttentionAdapter"] * 2
    biased = model.model.layers[0].self_attn.attn.qkv.bias is not None
    assert biased == (kind == "qwen2" or bool(extra))
    ids, mask = _ids()
    for am in (None, mask):
        out, expected = model(ids, attention_mask=am, labels=ids), ref(ids, attention_mask=am, labels=ids)
        real = torch.ones_like(ids, dtype=torch.bool) if am is None else am.bool()
        assert (out.logits - expected.logits)[real].abs().max() <= TOL
    assert abs(model(ids, labels=ids).loss - ref(ids, labels=ids).loss) <= TOL


@pytest.mark.parametrize("kind", KINDS)
def test_mha_swap_reproduces_cached_generation(kind):
    ref = host(kind).eval()
    model = zoo.swap_attention(copy.deepcopy(ref), "mha")
    ids, mask = _ids()
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        expected = ref.generate(ids, use_cache=True, **kw)
        cached = model.generate(ids, use_cache=True, **kw)
        uncached = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(cached.sequences, expected.sequences) and torch.equal(cached.sequences, uncached.sequences)
    for got, want in zip(cached.logits, expected.logits):
        assert (got - want).abs().max() <= TOL


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_is_causal_with_the_hosts_rope_and_trains(kind, name):
    model = zoo.swap_attention(host(kind), name, **small_opts(name)).eval()
    ids, _ = _ids()
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % V
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
        assert (model(changed, use_cache=False).logits[:, :5] - logits[:, :5]).abs().max() <= TOL
        rope = model.model.rotary_emb
        inv_freq = rope.inv_freq.clone()
        rope.inv_freq.zero_()  # cos = 1, sin = 0: no rotation; the outputs must change, so the host's RoPE arrives
        try:
            assert (model(ids, use_cache=False).logits - logits).abs().max() > 1e-4
        finally:
            rope.inv_freq.copy_(inv_freq)
    model.train()
    out = model(ids, labels=ids, use_cache=False)
    aux = zoo.collect_aux_losses(model)
    (out.loss + (aux if aux is not None else 0)).backward()
    for adapter in (m for m in model.modules() if isinstance(m, _Swapped)):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in adapter.attn.parameters()), adapter.path


def test_grouped_kv_heads_are_refused_for_copying_only():
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.0\.self_attn: cannot copy.*num_key_value_heads=2"):
        zoo.swap_attention(host("llama", num_key_value_heads=2), "mha")
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.0\.self_attn: cannot copy.*'damcha' \(it takes "
                                         r"the host's v, out projections\).*num_key_value_heads=2"):
        zoo.swap_attention(host("llama", num_key_value_heads=2), "damcha", hidden_dims=(16,))
    ids, _ = _ids()
    for name in ("mha", "colmha", "moa"):  # moa has no place for any host projection: nothing copied, nothing refused
        fresh = zoo.swap_attention(host("llama", num_key_value_heads=2), name, copy_weights=name == "moa")
        assert fresh(ids, use_cache=False).logits.shape == (2, 7, V)


def test_host_features_we_cannot_express_are_refused_by_name():
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.0\.self_attn: sliding_window=4: sliding-window"):
        zoo.swap_attention(host("mistral", sliding_window=4), "mha")
    qwen = host("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)  # layer 1 slides
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.1\.self_attn: sliding_window=4"):
        zoo.swap_attention(qwen, "mha")
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.0\.self_attn: rotary: the host's rotary width 16"):
        zoo.swap_attention(host("llama", head_dim=16), "mha", copy_weights=False)  # heads 16 wide, ours 8
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.0\.self_attn: causal: .*causal=False"):
        zoo.swap_attention(host("llama"), "mha", causal=False)


def test_stack_shared_variant_on_a_llama_host():
    model = zoo.swap_attention(host("llama"), "damcha", hidden_dims=(16,))
    owner = model.attention_zoo_shared
    gens = {id(m.attn.metric_generator) for m in model.modules() if isinstance(m, _Swapped)}
    assert gens == {id(owner.shared)}
    ids, _ = _ids()
    kw = dict(max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(ValueError, match=r"^model\.model\.layers\.0\.self_attn: use_cache: .*use_cache=False"):
        model.generate(ids, use_cache=True, **kw)
    assert model.generate(ids, use_cache=False, **kw).shape == (2, 9)
