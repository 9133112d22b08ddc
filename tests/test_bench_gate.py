"""The quick benchmark checks a variant before timing it, and times every case twice: in its own timing setting
and as a user's plain AdamW loop in a fresh process (attention_zoo/measure/gate.py, plain_loop.py)."""

import pandas as pd
import pytest
import torch

import attention_zoo as zoo
from attention_zoo import registry
from attention_zoo.measure.gate import check_variant
from attention_zoo.measure.plain_loop import plain_env, plain_loop_times
from attention_zoo.measure.workload import workload_spec
from attention_zoo.variants.mha import MultiHeadAttention

TINY = ["--batch", "1", "--seq-len", "8", "--d-model", "8", "--heads", "2", "--layers", "1", "--vocab", "8",
        "--warmup", "0", "--repeats", "2", "--threads", "1", "--no-breakdown"]


@pytest.fixture
def broken():
    """A variant whose float32 path is wrong (its float64 path is MHA's): registered, then removed."""
    before = dict(registry._REGISTRY)

    @zoo.register_attention("broken_fp32")
    class Broken(MultiHeadAttention):
        def forward(self, x, *args, **kwargs):
            y = super().forward(x, *args, **kwargs)
            return y + 0.1 if y.dtype == torch.float32 else y

    try:
        yield "broken_fp32"
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)


def test_the_gate_passes_every_registered_variant_and_refuses_a_broken_one(broken):
    for name in zoo.list_attentions(include_controls=True, exclude=broken):
        assert check_variant(name) is None, name
    why = check_variant(broken)
    assert why is not None and "output in float32 differs from float64" in why


def test_the_quick_benchmark_reports_no_speed_for_a_variant_that_fails_the_gate(broken, tmp_path, capsys):
    from attention_zoo.measure.quick import main

    csv = tmp_path / "q.csv"
    assert main(["--variants", f"mha,{broken}", *TINY, "--no-plain-loop", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv).set_index("case")
    bad = df.loc[[c for c in df.index if c.startswith(broken)]]
    assert (bad["status"] == "incorrect").all() and bad["fwd_bwd_ms"].isna().all()
    assert bad["message"].str.contains("correctness gate").all()
    assert (df.loc["mha layer non-causal", "status"] == "ok")
    assert "skipped (INCORRECT)" in capsys.readouterr().out


def test_the_plain_loop_runs_in_a_clean_child_and_the_benchmark_reports_both(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_ZOO_MALLOC_RETAIN", "1")
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    env = plain_env()
    assert not any(k.startswith(("ATTENTION_ZOO_", "THP_MEM")) for k in env)
    spec = workload_spec(attention="mha", batch=1, seq_len=8, d_model=8, n_heads=2)
    got = plain_loop_times({"a": spec, "b": {**spec, "attention": "nope"}}, "cpu", warmup=0, rounds=3, threads=1)
    assert got["a"]["status"] == "ok" and got["a"]["q25_ms"] <= got["a"]["median_ms"] <= got["a"]["q75_ms"]
    assert got["a"]["step_median_ms"] > got["a"]["median_ms"]  # the whole step includes AdamW's
    assert got["b"]["status"] == "error" and "nope" in got["b"]["message"]

    from attention_zoo.measure.quick import main

    csv = tmp_path / "q.csv"
    assert main(["--variants", "mha,damcha", *TINY, "--csv", str(csv)]) == 0
    df = pd.read_csv(csv).set_index("case")
    assert df.loc["damcha decoder 1L causal", "plain_ms"] > 0
    assert df.loc["mha layer causal", "plain_vs_mha"] == 1.0


def _run_csv(path, scale: float = 1.0, spread: float = 0.02):
    rows = [{"variant": v, "flavor": "paper", "batch": 4, "seq_len": 512, "d_model": 256, "n_heads": 8,
             "causal": False, "mode": "fwd_bwd", "dtype": "fp32", "compiled": False, "status": "ok",
             "cpu_model": "Test CPU", "latency_median_ms": m * scale, "latency_q25_ms": m * scale * (1 - spread),
             "latency_q75_ms": m * scale * (1 + spread)} for v, m in (("mha", 10.0), ("damcha", 20.0))]
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def test_compare_exits_non_zero_on_a_planted_regression_and_zero_on_identical_runs(tmp_path, capsys):
    from attention_zoo.bench import main

    base = _run_csv(tmp_path / "base.csv")
    assert main(["compare", base, _run_csv(tmp_path / "same.csv")]) == 0
    assert main(["compare", base, _run_csv(tmp_path / "slow.csv", 1.2)]) == 1
    out = capsys.readouterr().out
    assert "machine Test CPU" in out and "2 regression(s)" in out
    # a 20 % change inside a wide spread is noise, not a regression
    assert main(["compare", _run_csv(tmp_path / "b2.csv", spread=0.3), _run_csv(tmp_path / "n2.csv", 1.2, 0.3)]) == 0
    assert main(["compare", base, str(tmp_path / "missing.csv")]) == 2


def test_decode_benchmark_times_cached_generation_and_names_what_it_cannot_decode():
    from attention_zoo.measure.decode import decode_benchmark

    df = decode_benchmark("mha,damcha", contexts=(16, 8), new_tokens=2, d_model=16, layers=1, heads=2, threads=1)
    mha = df[df["variant"] == "mha"].set_index("context")
    assert list(mha.index) == [8, 16] and (mha["status"] == "ok").all()
    assert (mha["per_token_ms"] > 0).all() and (mha["peak_mib"] >= 0).all()
    dam = df[df["variant"] == "damcha"]
    assert len(dam) == 1 and dam["status"].item() == "not supported" and "use_cache" in dam["message"].item()


def test_gpu_contention_and_throttling_mark_a_timing_unstable():
    from attention_zoo.measure.latency import LatencyResult

    quiet = {"load_before": 0.0, "load_after": 0.0, "cores": 16, "gpu_util_pct_before": 0.0,
             "gpu_clock_mhz_after": 1980.0, "gpu_max_clock_mhz_after": 1980.0, "gpu_throttle_after": 0}
    assert not LatencyResult.from_times([1.0, 1.0, 1.01], "cuda:0", 0, quiet).unstable
    busy = LatencyResult.from_times([1.0, 1.0, 1.01], "cuda:0", 0, {**quiet, "gpu_util_pct_before": 60.0})
    assert busy.unstable and "GPU 60 % busy" in busy.unstable_reason
    hot = LatencyResult.from_times([1.0, 1.0, 1.01], "cuda:0", 0, {**quiet, "gpu_clock_mhz_after": 1100.0,
                                                                    "gpu_throttle_after": 0x20})
    assert "throttled" in hot.unstable_reason and "0x20" in hot.unstable_reason
    assert hot.guard_fields()["gpu_clock_mhz_after"] == 1100.0


def test_the_gemm_reference_on_cuda_is_bf16_with_tf32_stated():
    from attention_zoo.measure.gemm import gemm_description, gemm_dtype

    assert gemm_dtype(torch.device("cuda")) == torch.bfloat16 and gemm_dtype(torch.device("cpu")) == torch.float32
    assert gemm_description(torch.device("cuda")).startswith("bf16 GEMM 2048x2048 (TF32 matmul ")
    assert gemm_description(torch.device("cpu")) == "fp32 GEMM 2048x2048"


def test_bench_rows_carry_dtype_and_parameters_and_no_speed_for_a_failing_variant(broken, tmp_path):
    df = zoo.benchmark(["tha", broken], shapes=[(1, 16, 16, 2)], device="cpu", dtype=["fp32", "bf16"],
                       modes=("fwd_bwd",), memory=False, min_time_s=0.0, min_repeats=2)
    ok = df[df["status"] == "ok"]
    assert set(ok["dtype"]) == {"fp32", "bf16"} and {"mha", "tha"} <= set(ok["variant"])
    assert (ok["params"] >= ok["attention_params"]).all() and (ok["attention_params"] > 0).all()
    bad = df[(df["variant"] == broken) & (df["dtype"] == "fp32")]  # wrong only in float32: refused there
    assert set(bad["status"]) == {"incorrect"} and bad["latency_median_ms"].isna().all()
    from attention_zoo.bench import plot

    out = plot(df, tmp_path / "one_shape.png")  # one shape: a bar chart
    assert out.stat().st_size > 0


def test_bench_cli_takes_the_apis_option_names(tmp_path):
    from attention_zoo.bench import main

    csv = tmp_path / "b.csv"
    assert main(["--variants", "mha", "--flavors", "paper", "--batch", "1", "--seq-len", "8", "--d-model", "8",
                 "--heads", "2", "--dtype", "fp32", "bf16", "--modes", "fwd", "--no-memory", "--min-time", "0.01",
                 "--min-repeats", "2", "--threads", "1", "--quiet", "--results-file", str(csv)]) == 0
    assert set(pd.read_csv(csv)["dtype"]) == {"fp32", "bf16"}
