"""README's "Add your own attention" example works as written: one file, one registration, the stack protocol."""

import re
import sys
import types
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attention_zoo as zoo
from attention_zoo import registry

README = Path(__file__).resolve().parents[1] / "README.md"
D, H, B, T, V = 16, 4, 2, 6, 11


def readme_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Add your own attention", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture
def plugin():
    """Runs the README's file as module ``my_attention``; the registry and sys.modules are restored afterwards, so
    the registry-wide tests elsewhere see the seven built-in variants only."""
    before = dict(registry._REGISTRY)
    module = types.ModuleType("my_attention")
    sys.modules["my_attention"] = module
    try:
        exec(compile(readme_blocks()[0], str(README), "exec"), module.__dict__)
        yield module
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)
        sys.modules.pop("my_attention", None)


def test_readme_has_the_file_and_the_usage():
    blocks = readme_blocks()
    assert len(blocks) == 2 and '@register_attention("mine")' in blocks[0] and "build_stack_shared" in blocks[0]


def test_registered_with_flags_and_options(plugin):
    spec = zoo.get_attention_spec("mine")
    assert spec.cls is plugin.TemperedAttention and "mine" in zoo.list_attentions()
    assert spec.fused_kernel and spec.stack_shared and not spec.has_aux_loss and spec.core == "fused"
    assert "share_temperature" in spec.options and "stack" not in spec.options
    with pytest.raises(ValueError, match="^share_temperature: expected a bool"):
        zoo.create_attention("mine", d_model=D, n_heads=H, share_temperature="no")


def test_layer_on_its_own(plugin):
    torch.manual_seed(0)
    attn = zoo.create_attention("mine", d_model=D, n_heads=H, causal=True).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    pad = torch.ones(B, T, dtype=torch.bool)
    pad[1, 4:] = False
    y = attn(x, padding_mask=pad)
    assert y.shape == (B, T, D) and torch.isfinite(y).all() and (y[1, 4:] == 0).all()
    assert_close(attn(x[:, :3]), attn(x)[:, :3])  # causal prefix
    assert attn.analytic_params() == sum(p.numel() for p in attn.parameters())


def test_usage_block_runs_in_a_decoder_with_and_without_sharing(plugin):
    namespace = {}
    exec(compile(readme_blocks()[1], str(README), "exec"), namespace)  # imports my_attention: the fixture's module
    assert namespace["model"].stack.shared is not None
    for share in (True, False):
        torch.manual_seed(0)
        model = zoo.models.Decoder(V, D, 2, H, attention="mine", share_across_layers=share)
        tokens = torch.randint(0, V, (B, T))
        out = model(tokens)
        out.logits.square().mean().backward()
        assert out.logits.shape == (B, T, V) and float(out.aux_loss) == 0.0
        assert all(p.grad is not None for p in model.parameters())
        temps = [m for m in model.modules() if isinstance(m, plugin.Temperatures)]
        assert len(temps) == (1 if share else 2)
        assert (model.stack.shared is not None) == share
        assert all((layer.attn.temps is None) == share for layer in model.stack.layers)
    # the option reaches the hook: no shared module when the variant's own option says no
    model = zoo.models.Decoder(V, D, 2, H, attention="mine", attention_options={"share_temperature": False})
    assert model.stack.shared is None and all(layer.attn.temps is not None for layer in model.stack.layers)
