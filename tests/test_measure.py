"""Measurement library: FLOP counters vs analytic formulas over the whole registry, latency, memory, OOM rows."""

import pytest
import torch
from torch import nn

import attention_zoo as zoo
from attention_zoo.measure import (
    build_workload,
    count_flops,
    count_params,
    einsum_macs,
    fvcore_count,
    guarded,
    is_oom,
    measure_latency,
    measure_memory,
    measure_memory_many,
    measure_model_latency,
    memory_item,
    workload_spec,
)
from attention_zoo.measure.flops import analytic_parts

B, T, D, H = 2, 16, 32, 4

CASES = [(n, f, c) for n in zoo.list_attentions() for f in zoo.get_attention_spec(n).flavors
         for c in (False, True) if not c or zoo.get_attention_spec(n).causal_ok]


def elementwise_in_analytic(module, batch: int, seq_len: int) -> int:
    """FLOPs a variant's analytic formula counts that the counters (matrix products only) see differently: work done
    as elementwise products, or as another product. Documented in those variants' ``analytic_flops`` docstrings
    (DCMHA: docs/variants.md §3.5)."""
    name, flavor = module.registry_name, module.flavor
    if (name, flavor) == ("colmha", "paper"):  # mixing Q̃ ⊙ m_i, counted as T·H·D̃ MACs (variants.md §9)
        return 2 * batch * seq_len * module.n_heads * module.shared_dim
    if (name, flavor) == ("dcmha", "paper"):
        H, R, pairs = module.n_heads, module.rank, batch * seq_len * seq_len
        n_q = sum(c.endswith("_q") for c in module.splits)
        n_k = len(module.splits) - n_q
        # elementwise in the chunked core: the tanh gates (H per (t, s) and split) and the key-wise projection and
        # expansion (2RH per (t, s) and key-wise split)
        skipped = len(module.splits) * H + n_k * 2 * R * H
        # the query-side terms of a stage (low rank 2RH, static H²) run as one H x H matrix per query row: H² MACs
        # per (t, s), plus R H² per row to form it
        skipped += n_q * 2 * R * H + (len(module.stages) * H * H if module.use_static else 0) - n_q * H * H
        return 2 * pairs * skipped - 2 * batch * seq_len * n_q * R * H * H
    return 0


def expected_counter_flops(model, batch, seq_len) -> int:
    attn, _, _ = analytic_parts(model)
    return count_flops(model, (), batch, seq_len, counters=()).analytic - sum(
        elementwise_in_analytic(m, batch, seq_len) for m in attn)


@pytest.mark.parametrize("name,flavor,causal", CASES)
def test_layer_flops_formula_vs_fvcore_vs_flop_counter(name, flavor, causal):
    wl = build_workload(workload_spec(attention=name, options={"flavor": flavor}, causal=causal, d_model=D,
                                      n_heads=H, batch=B, seq_len=T))
    rep = count_flops(wl.model, wl.inputs, B, T)
    assert rep.unsupported == {}  # every op the variant runs has a handle (or is deliberately counted as 0)
    assert 2 * rep.fvcore_macs == rep.flop_counter  # fvcore counts MACs, FlopCounterMode 2 per MAC
    expected = expected_counter_flops(wl.model, B, T)
    assert rep.flop_counter == expected
    if expected == rep.analytic:
        assert rep.fvcore_agrees and rep.flop_counter_agrees and rep.message == ""


@pytest.mark.parametrize("name", zoo.list_attentions())
def test_decoder_flops_and_params_count_shared_modules_once(name):
    wl = build_workload(workload_spec(kind="decoder", attention=name, d_model=D, n_heads=H, n_layers=2, batch=1,
                                      seq_len=T))
    rep = count_flops(wl.model, wl.inputs, 1, T)
    assert rep.unsupported == {}
    assert rep.flop_counter == 2 * rep.fvcore_macs == expected_counter_flops(wl.model, 1, T)
    p = count_params(wl.model)
    assert p["attention_params"] == p["attention_params_analytic"] > 0
    assert p["total_params"] == sum(t.numel() for t in wl.model.parameters())  # tied and shared tensors once


def test_einsum_macs_exact():
    assert einsum_macs("bhld,bhmd->bhlm", [[2, 3, 5, 7], [2, 3, 11, 7]]) == 2 * 3 * 5 * 11 * 7
    assert einsum_macs("...d,de->...e", [[2, 3, 4], [4, 6]]) == 2 * 3 * 4 * 6
    assert einsum_macs("ij,jk,kl->il", [[2, 100], [100, 3], [3, 50]]) == 2 * 100 * 3 + 2 * 3 * 50  # optimal order
    assert einsum_macs("ij->ji", [[4, 5]]) == 0


def test_fvcore_matmul_broadcast_and_sdpa_are_exact():
    class Mix(nn.Module):
        def forward(self, x, w):
            q = torch.matmul(x, w)  # [T,D] @ [B,D,E]: fvcore's own handle undercounts this
            return torch.nn.functional.scaled_dot_product_attention(q[:, None], q[:, None], q[:, None])

    x, w = torch.randn(6, 4), torch.randn(3, 4, 5)
    fv = fvcore_count(Mix(), (x, w))
    assert fv.unsupported == {}
    assert fv.macs == 3 * 6 * 4 * 5 + 3 * 6 * 6 * (5 + 5)


def test_measure_latency_cpu_stats():
    res = measure_latency(lambda: torch.randn(64, 64) @ torch.randn(64, 64), "cpu", warmup=1, repeats=5)
    assert len(res.times_ms) == res.repeats == 5 and all(t > 0 for t in res.times_ms)
    assert res.q25_ms <= res.median_ms <= res.q75_ms and res.iqr_ms >= 0 and res.mean_ms > 0
    assert res.threads == torch.get_num_threads() and res.device == "cpu"
    with pytest.raises(ValueError, match="repeats"):
        measure_latency(lambda: None, "cpu", repeats=0)


def test_model_latency_forward_and_backward():
    wl = build_workload(workload_spec(attention="mha", batch=2, seq_len=8))
    fwd = measure_model_latency(wl, "forward", "cpu", warmup=1, repeats=2)
    assert fwd.median_ms > 0 and not wl.model.training
    bwd = measure_model_latency(wl, "fwd_bwd", "cpu", warmup=0, repeats=2)
    assert bwd.median_ms > 0 and all(p.grad is not None for p in wl.model.parameters())
    with pytest.raises(ValueError, match="mode"):
        measure_model_latency(wl, "sideways")


def test_cpu_peak_rss_fresh_subprocess():
    spec = workload_spec(kind="decoder", attention="mha", d_model=32, n_heads=4, n_layers=1, batch=2, seq_len=16)
    res = measure_memory(spec, "cpu", mode="train", isolation="subprocess")
    assert res["status"] == "ok", res
    assert res["peak_rss_mib"] >= 0 and res["baseline_rss_mib"] > 10  # torch alone is tens of MiB
    assert res["mode"] == "train" and res["optimizer_in_region"] is True


def test_cpu_peak_rss_grows_with_the_attention_matrix():
    def item(seq_len):  # THA keeps [B,H,T,T] logits and weights for the backward: O(T²) memory
        return memory_item(workload_spec(attention="tha", d_model=32, n_heads=4, batch=2, seq_len=seq_len), "fwd_bwd")

    small, big = measure_memory_many([item(64), item(512)], "cpu", workers=2)
    assert small["status"] == big["status"] == "ok", (small, big)
    assert 0 <= small["peak_rss_mib"] < big["peak_rss_mib"] < 2000
    assert big["peak_rss_mib"] > 8  # at least one [2,4,512,512] fp32 tensor (8 MiB)


def test_oom_becomes_a_status_row():
    def cuda_oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def cpu_oom():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1099511627776 bytes.")

    for fn in (cuda_oom, cpu_oom, lambda: (_ for _ in ()).throw(MemoryError())):
        res = guarded(fn, "cpu")
        assert res["status"] == "oom" and res["message"]
    assert is_oom(MemoryError()) and not is_oom(RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape"):
        guarded(lambda: (_ for _ in ()).throw(RuntimeError("shape mismatch")), "cpu")
    assert guarded(lambda: {"x": 1}, "cpu") == {"status": "ok", "message": "", "x": 1}


def test_oom_in_the_memory_child_is_a_row():
    huge = workload_spec(attention="mha", d_model=64, n_heads=4, batch=2**20, seq_len=2**20)  # 256 TiB input
    res = measure_memory(huge, "cpu", mode="forward", isolation="subprocess")
    assert res["status"] == "oom" and "allocate" in res["message"]


def test_workload_spec_validation():
    with pytest.raises(ValueError, match="spec"):
        workload_spec(colour="red")
    with pytest.raises(ValueError, match="kind"):
        workload_spec(kind="encoder")
    with pytest.raises(ValueError, match="mode"):
        memory_item(workload_spec(), mode="inference")
    with pytest.raises(ValueError, match="isolation"):
        measure_memory_many([memory_item(workload_spec())], "cpu", isolation="thread")
