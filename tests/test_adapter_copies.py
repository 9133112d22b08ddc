"""zoo.swap_attention (issue 22): copies of a swapped model, two swapped stacks in one model, options the host fixes,
gradient checkpointing over a stack-shared swap, and one-position calls."""

import copy
import io

import pytest
import torch
from torch import nn

import attention_zoo as zoo

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

TOL = 1e-6
SHARED = {"hidden_dims": (16,), "share_mlp": True}  # DAMCHA with one generator per stack


def gpt2(seed=0, n_layer=2):
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=n_layer, n_embd=32, n_head=4, vocab_size=50, bos_token_id=0, eos_token_id=0,
                     attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg).eval()


def vit(seed=0):
    torch.manual_seed(seed)
    return VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=5).eval()


def ids(seed):
    return torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(seed))


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens, use_cache=False).logits


def _shift_generator(model, by=0.3):
    with torch.no_grad():
        for p in model.attention_zoo_shared.parameters():
            p.add_(by)


# ---- copies -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["deepcopy", "pickle", "state_dict"])
def test_a_copy_of_a_stack_shared_swap_is_the_original_and_independent(how):
    model = zoo.swap_attention(gpt2(), "damcha", **SHARED)
    x = ids(0)
    model.train()
    model(x, use_cache=False).logits.sum()  # a forward with autograd: its context (with graph) is on the model
    model.eval()
    ref = logits(model, x)
    if how == "deepcopy":
        twin = copy.deepcopy(model)
    elif how == "pickle":
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        twin = torch.load(buf, weights_only=False)
    else:
        twin = zoo.swap_attention(gpt2(seed=5), "damcha", **SHARED)
        twin.load_state_dict(model.state_dict())
    assert (logits(twin, x) - ref).abs().max() <= TOL
    _shift_generator(twin)  # the copy's hooks drive the copy's own generator, not the original's
    assert (logits(twin, x) - ref).abs().max() > 1e-3
    assert (logits(model, x) - ref).abs().max() <= TOL


# ---- two stacks in one model ----------------------------------------------------------------------------------
class TwoGPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = gpt2(0), gpt2(1)

    def forward(self, x_a, x_b):
        return self.a(x_a, use_cache=False).logits, self.b(x_b, use_cache=False).logits


class VitToGPT2(nn.Module):
    """A non-causal image tower beside a causal text tower."""

    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = vit(0), gpt2(1)

    def forward(self, images, tokens):
        return self.encoder(images), self.decoder(tokens, use_cache=False).logits


def test_two_towers_have_a_stack_context_each():
    model = zoo.swap_attention(TwoGPT2(), "damcha", **SHARED)
    with torch.no_grad():
        a1, b1 = model(ids(0), ids(1))
        a2, b2 = model(ids(2), ids(1))  # only tower a's input changes
    assert (b1 - b2).abs().max() == 0 and (a1 - a2).abs().max() > 1e-3
    assert model.attention_zoo_shared is not model.attention_zoo_shared_1
    alone = zoo.swap_attention(gpt2(1), "damcha", **SHARED)
    alone.load_state_dict({k[2:]: v for k, v in model.state_dict().items() if k.startswith("b.")}
                          | {k.replace("attention_zoo_shared_1.", "attention_zoo_shared."): v
                             for k, v in model.state_dict().items() if k.startswith("attention_zoo_shared_1.")})
    assert (b1 - logits(alone, ids(1))).abs().max() <= TOL  # tower b is a swapped GPT-2 on its own
    mixed = zoo.swap_attention(VitToGPT2(), "damcha", **SHARED)  # one causal and one non-causal stack
    assert {mixed.attention_zoo_shared.shared.causal, mixed.attention_zoo_shared_1.shared.causal} == {False, True}
    with torch.no_grad():
        _, t1 = mixed(torch.randn(2, 3, 16, 16), ids(1))
        _, t2 = mixed(torch.randn(2, 3, 16, 16), ids(1))
    assert (t1 - t2).abs().max() == 0


# ---- options the host fixes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["dropout", "n_heads", "d_model", "stack", "n_layers"])
def test_options_the_host_fixes_are_refused_by_name(option):
    with pytest.raises(ValueError, match=rf"^model: {option}: fixed by the host"):
        zoo.swap_attention(gpt2(), "mha", **{option: 2})


# ---- gradient checkpointing -----------------------------------------------------------------------------------
def _grads(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _gpt2_loss(model):
    x = ids(3)
    pad = torch.tensor([[1] * 6, [0, 1, 1, 1, 1, 1]])
    return model(x, attention_mask=pad, labels=x, use_cache=False).loss


def _vit_loss(model):
    return model(torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))).square().mean()


@pytest.mark.parametrize("host", ["gpt2", "vit"])
def test_gradient_checkpointing_over_a_stack_shared_swap_gives_the_same_gradients(host):
    build, loss_fn = (lambda: gpt2(n_layer=3), _gpt2_loss) if host == "gpt2" else (vit, _vit_loss)
    model = zoo.swap_attention(build(), "damcha", **SHARED).train()
    checkpointed = copy.deepcopy(model)
    if host == "gpt2":
        checkpointed.gradient_checkpointing_enable()
    else:
        checkpointed.set_grad_checkpointing(True)
    want, got = _grads(model, loss_fn), _grads(checkpointed, loss_fn)
    assert want.keys() == got.keys() and any(k.startswith("attention_zoo_shared.") for k in got)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-5)


def test_reentrant_gradient_checkpointing_is_refused_with_the_module():
    model = zoo.swap_attention(gpt2(), "damcha", **SHARED).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    with pytest.raises(ValueError, match=r"^model\.transformer\.h\.0\.attn: .*use_reentrant=False"):
        _grads(model, _gpt2_loss)
    from timm.layers import config as timm_config

    image_model = zoo.swap_attention(vit(), "damcha", **SHARED).train()
    image_model.set_grad_checkpointing(True)
    timm_config.set_reentrant_ckpt(True)
    try:
        with pytest.raises(ValueError, match=r"^model\.blocks\.1\.attn: .*use_reentrant=False"):
            _grads(image_model, _vit_loss)
    finally:
        timm_config.set_reentrant_ckpt(False)


# ---- one-position calls ---------------------------------------------------------------------------------------
def test_one_position_calls_are_valid_whatever_their_mask_says_about_causality():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    host = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 1, 32)
    plain = zoo.swap_attention(copy.deepcopy(host), "mha")
    causal = zoo.swap_attention(copy.deepcopy(host), "mha", causal=True)
    with torch.no_grad():
        for kw in ({"mask": torch.zeros(1, 1)}, {"mask": torch.zeros(1, 1, dtype=torch.bool)},
                   {"mask": torch.zeros(1, 1), "is_causal": True}, {}):
            ref = host(x, **kw)
            assert (plain(x, **kw) - ref).abs().max() <= 1e-5, kw
            assert (causal(x, **kw) - ref).abs().max() <= 1e-5, kw
        with pytest.raises(ValueError, match=r"^model\.layers\.0\.self_attn: called causally"):
            plain(torch.randn(2, 3, 32), mask=nn.Transformer.generate_square_subsequent_mask(3))  # T > 1 still checked
