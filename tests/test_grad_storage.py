"""DAMCHA's large per-step gradients are written into storage that outlives the step (``damcha_ops.GradStorage``):
same parameters as without it, the same pages reused in a plain training loop, and never a live tensor overwritten."""

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo.variants.damcha_ops import GradStorage


def _decoder(causal_shared: bool):
    torch.manual_seed(0)
    return zoo.models.Decoder(vocab_size=17, d_model=32, n_layers=2, n_heads=4, attention="damcha",
                              attention_options={"hidden_dims": (16,)}, share_mlp=causal_shared).double()


def _vit():
    torch.manual_seed(0)
    return zoo.models.VisionTransformer(image_size=8, patch_size=4, num_classes=3, d_model=32, n_layers=2, n_heads=4,
                                        attention="damcha", attention_options={"hidden_dims": (16,)}).double()


def _plain_loop(model, batch, steps=3, set_to_none=True):
    """What a user writes: AdamW, zero_grad(set_to_none=...), backward, step. Returns the generator's W.grad
    data pointers per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ptrs = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        out = model(batch)
        logits = out.logits if hasattr(out, "logits") else out
        (logits.float().pow(2).mean() + getattr(out, "aux_loss", 0.0)).backward()
        gen = [m for m in model.modules() if hasattr(m, "grad_storage")][0]
        ptrs.append(gen.out.weight.grad.data_ptr())
        opt.step()
    return ptrs


@pytest.mark.parametrize("build", ["decoder", "vit"])
def test_same_parameters_after_three_steps_with_and_without_the_kept_storage(build, monkeypatch):
    batch = torch.randint(0, 17, (2, 6)) if build == "decoder" else torch.randn(2, 3, 8, 8, dtype=torch.float64)
    make = (lambda: _decoder(True)) if build == "decoder" else _vit
    kept, fresh = make(), make()
    ptrs = _plain_loop(kept, batch)
    monkeypatch.setattr(GradStorage, "enabled", False)
    _plain_loop(fresh, batch)
    for (name, a), b in zip(kept.named_parameters(), fresh.parameters()):
        assert_close(a, b, rtol=0, atol=0, msg=name)
    assert len(set(ptrs)) == 1  # the same storage every step after zero_grad(set_to_none=True)


def test_accumulation_without_zero_grad_adds_and_never_overwrites_a_live_gradient(monkeypatch):
    batch = torch.randint(0, 17, (2, 6))
    kept, fresh = _decoder(True), _decoder(True)
    for model in (kept, fresh):
        if model is fresh:
            monkeypatch.setattr(GradStorage, "enabled", False)
        for _ in range(2):  # two backward passes into the same .grad
            model(batch).logits.pow(2).mean().backward()
    for (name, a), b in zip(kept.named_parameters(), fresh.parameters()):
        assert_close(a.grad, b.grad, rtol=0, atol=0, msg=name)


def test_a_gradient_the_caller_keeps_is_not_overwritten():
    model, batch = _decoder(True), torch.randint(0, 17, (2, 6))
    gen = [m for m in model.modules() if hasattr(m, "grad_storage")][0]
    model(batch).logits.pow(2).mean().backward()
    kept = gen.out.weight.grad
    snapshot = kept.clone()
    gen.out.weight.grad = None  # the caller still holds the tensor
    model(batch).logits.sum().backward()
    assert_close(kept, snapshot, rtol=0, atol=0)
    assert gen.out.weight.grad.data_ptr() != kept.data_ptr()
