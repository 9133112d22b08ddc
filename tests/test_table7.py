"""Table 7: complexity numbers, parameter counts under the readings of P, slope fits and the CLI end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attention_zoo.experiments.efficiency.table7_complexity import NAME, fit_slopes, slopes_wide
from attention_zoo.measure.complexity import complexity_numbers, generator_cost, params_frame

ROOT = Path(__file__).resolve().parents[1]


def test_complexity_worked_example():  # variants.md §8, GPT-2 scale
    g_c, _ = generator_cost(768, 12, (1536,) * 8)
    assert g_c / 1e6 == pytest.approx(93.2, abs=0.1)
    nc = complexity_numbers(1024, 768, 12, 12, (1536,) * 8, causal=False)
    assert nc["MHA"]["total MACs per layer"] / 1e9 == pytest.approx(4.03, abs=0.01)
    seq = nc["DAMCHA no sharing"]["total MACs per layer"] - nc["DAMCHA no sharing"]["metric generator"]
    assert seq / 1e9 == pytest.approx(2.87, abs=0.01)
    causal = complexity_numbers(1024, 768, 12, 12, (1536,) * 8, causal=True)
    assert causal["DAMCHA no sharing"]["metric generator"] / 1e9 == pytest.approx(95.4, abs=0.1)
    assert causal["DAMCHA shared"]["metric generator"] == pytest.approx(causal["DAMCHA no sharing"]
                                                                        ["metric generator"] / 12)


def test_params_under_the_readings_of_p():  # experiments.md §7
    p = params_frame()
    shared = p[p["sharing"] == "shared"].set_index(["N", "reading of P"])
    depth, mult, basis = [r for r in p["reading of P"].unique() if r.startswith("P =")]
    assert shared.loc[(12, depth), "G"] / 1e6 == pytest.approx(924, abs=1)
    assert shared.loc[(12, mult), "attention ratio"] == pytest.approx(0.9997, abs=1e-4)
    assert shared.loc[(12, basis), "G"] / 1e6 == pytest.approx(8.86, abs=0.01)
    assert shared.loc[(12, basis), "attention reduction %"] == pytest.approx(18.7, abs=0.05)
    assert shared.loc[(12, basis), "MHA whole model"] == 124_439_808  # GPT-2 small
    assert shared.loc[(12, basis), "DAMCHA whole model"] / 1e6 == pytest.approx(119.1, abs=0.05)
    assert shared.loc[(15, basis), "attention reduction %"] == pytest.approx(24.98, abs=0.01)
    assert shared.loc[(15, mult), "N for 25% fewer (shared)"] == pytest.approx(24, abs=0.05)


def test_fit_slopes_recovers_exponents():
    T = np.array([128, 256, 512, 1024])
    df = pd.DataFrame([{"variant": "v", "flavour": "paper", "causal": False, "seq_len": t, "metric": m,
                        "value": c * t**e, "status": "ok"}
                       for t in T for m, c, e in (("fwd_gflops_analytic", 3.0, 2.0), ("latency_fwd_median_ms",
                                                                                       0.1, 1.0))])
    slopes = fit_slopes(df, "seq_len").set_index("metric")["slope"]
    assert slopes["fwd_gflops_analytic"] == pytest.approx(2.0) and slopes["latency_fwd_median_ms"] == pytest.approx(1.0)


def test_constant_dominated_memory_exponents_are_flagged():
    T = np.array([128, 256, 512, 1024])
    rows = [{"variant": v, "flavour": "paper", "causal": False, "seq_len": t, "metric": "peak_fwd_bwd_rss_mib",
             "value": mib, "status": "ok"}
            for t in T for v, mib in (("flat", 40.0 + 1e-3 * t), ("grows", 1e-4 * t**2))]
    wide = slopes_wide(pd.DataFrame(rows), pd.DataFrame()).set_index("variant")
    assert "memory ~ T: max/min 1.02" in wide.loc["flat", "constant-dominated"]
    assert wide.loc["grows", "constant-dominated"] == "" and wide.loc["grows", "memory ~ T^"] == pytest.approx(2.0)


def _cli(out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "reproduce" / f"{NAME}.py"), "--preset", "smoke", "--device", "cpu",
           "--variants", "mha", "--causal", "false", "--seq-lens", "32", "64", "--d-models", "16", "32",
           "--repeats", "1", "--threads", "1", "--memory-workers", "1", "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_cli_end_to_end_and_rerun_skips(tmp_path):
    proc = _cli(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for suffix in ("_long.csv", ".env.json", "_wide.csv", ".md", ".jsonl", "_params.csv", "_formulas_numbers.csv"):
        assert (tmp_path / f"{NAME}{suffix}").stat().st_size > 0
    assert list(tmp_path.glob(f"{NAME}_*_vs_seq_len.png"))
    wide = pd.read_csv(tmp_path / f"{NAME}_wide.csv")
    assert wide.loc[0, "FLOPs (analytic) ~ T^"] > 1.0  # projections O(T) plus core O(T²)
    assert wide.loc[0, "attention core"] == "fused"  # MHA's capability flags, reported beside its exponents
    lines = (tmp_path / f"{NAME}.jsonl").read_text().splitlines()
    cells = [ln for ln in lines if json.loads(ln)["kind"] == "cell"]
    assert len(cells) == 4 and len(lines) == 5  # T sweep (32, 64 at D=64) + D sweep (16, 32 at T=256); 1 run record
    again = _cli(tmp_path)
    assert again.returncode == 0
    assert (tmp_path / f"{NAME}.jsonl").read_text().splitlines() == lines
