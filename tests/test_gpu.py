"""CUDA paths (``gpu`` marker): skipped where no GPU is visible; ``tox -e gpu`` runs them on a CUDA machine."""

from __future__ import annotations

import pytest
import torch

import attention_zoo as zoo
from attention_zoo.measure import build_workload, measure_latency, measure_memory, workload_spec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEV = "cuda"


def test_cuda_event_timing():
    a = torch.randn(1024, 1024, device=DEV)
    small = measure_latency(lambda: a @ a, DEV, warmup=3, min_time_s=0.05, min_repeats=10)
    big_a = torch.randn(4096, 4096, device=DEV)
    big = measure_latency(lambda: big_a @ big_a, DEV, warmup=3, min_time_s=0.05, min_repeats=10)
    assert small.device.startswith("cuda") and small.repeats >= 10 and small.median_ms > 0
    assert big.median_ms > small.median_ms  # events time the kernels, not their launches


def test_max_memory_allocated_accounting():
    spec = workload_spec(attention="mha", batch=2, seq_len=256, d_model=256, n_heads=8)
    one = measure_memory(spec, DEV, mode="fwd_bwd")
    two = measure_memory({**spec, "batch": 8}, DEV, mode="fwd_bwd")
    assert one["status"] == "ok" and one["peak_alloc_mib"] > 0 and one["peak_reserved_mib"] >= one["peak_alloc_mib"]
    assert two["peak_alloc_mib"] > 2 * one["peak_alloc_mib"]  # activations scale with the batch


@pytest.mark.parametrize("name", zoo.list_attentions())
def test_bf16_autocast_matches_fp32(name):
    spec = workload_spec(attention=name, batch=2, seq_len=64, d_model=64, n_heads=4)
    ref = build_workload(spec, DEV)
    amp = build_workload({**spec, "amp": "bfloat16"}, DEV)
    amp.model.load_state_dict(ref.model.state_dict())
    ref.model.eval()
    amp.model.eval()
    with torch.no_grad():
        y32, y16 = ref.forward().float(), amp.forward().float()
    assert torch.isfinite(y16).all()
    assert (y16 - y32).norm() / y32.norm() < 3e-2  # bf16 keeps ~3 significant digits


@pytest.mark.parametrize("name", ["mha", "damcha"])
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
def test_sdpa_fused_backends_run_and_match_math(name, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    attn = zoo.create_attention(name, d_model=128, n_heads=4, causal=True).to(DEV, torch.bfloat16).eval()
    x = torch.randn(2, 128, 128, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        with sdpa_kernel([getattr(SDPBackend, backend)]):  # raises if the fused kernel cannot take these inputs
            fused = attn(x).float()
        with sdpa_kernel([SDPBackend.MATH]):
            math = attn(x).float()
    assert (fused - math).norm() / math.norm() < 2e-2


@pytest.mark.parametrize("name", zoo.list_attentions(include_controls=True))
def test_bf16_autocast_fwd_bwd_matches_fp32_gradients(name):
    """The backward too: a custom Function whose backward runs outside autocast is where low precision breaks."""
    spec = workload_spec(attention=name, batch=2, seq_len=64, d_model=64, n_heads=4, causal=True)
    ref = build_workload(spec, DEV)
    amp = build_workload({**spec, "amp": "bfloat16"}, DEV)
    amp.model.load_state_dict(ref.model.state_dict())
    for wl in (ref, amp):
        wl.model.eval()
        wl.loss(wl.forward()).backward()
    for (pname, p32), p16 in zip(ref.model.named_parameters(), amp.model.parameters()):
        if p32.grad is None:
            continue
        assert p16.grad is not None and torch.isfinite(p16.grad).all(), pname
        assert (p16.grad.float() - p32.grad).norm() <= 0.1 * p32.grad.norm() + 1e-6, pname


def test_sdpa_default_backend_runs_and_is_recorded(record_property):
    """No backend forced: whichever SDPA kernel this GPU picks for bf16 (flash, efficient, cuDNN) runs, matches the
    math backend, and its kernel names are recorded with the test."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    attn = zoo.create_attention("mha", d_model=128, n_heads=4, causal=True).to(DEV, torch.bfloat16).eval()
    x = torch.randn(2, 256, 128, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        default = attn(x).float()
        torch.cuda.synchronize()
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        math = attn(x).float()
    kernels = sorted({e.name for e in prof.events() if any(k in e.name.lower() for k in
                                                            ("flash", "fmha", "attention", "cudnn", "sdpa"))})
    record_property("sdpa_kernels", "; ".join(kernels))
    print("SDPA kernels:", kernels)
    assert kernels, "no attention kernel seen in the profile"
    assert (default - math).norm() / math.norm() < 2e-2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_interleaved_timing_on_the_second_device_times_its_own_stream():
    from attention_zoo.measure.latency import measure_interleaved

    a = torch.randn(2048, 2048, device="cuda:1")
    b = torch.randn(256, 256, device="cuda:1")
    res, failures = measure_interleaved({"big": lambda: a @ a, "small": lambda: b @ b}, "cuda:1", warmup=2,
                                        repeats=10)
    assert not failures and res["big"].device == "cuda:1"
    assert res["big"].median_ms > res["small"].median_ms  # events on cuda:1's stream see cuda:1's kernels
