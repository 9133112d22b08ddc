"""Table 2: the authors' GFLOPs model, the wide table (ratios, OOM cells) and the CLI end to end."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from attention_zoo.experiments.efficiency.paper_flops import (
    PAPER_METHODS,
    PAPER_QUOTED_GFLOPS,
    paper_gflops,
    paper_macs,
)
from attention_zoo.experiments.efficiency.table2_efficiency import NAME, paper_comparison, wide_frame

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("key", list(PAPER_QUOTED_GFLOPS))
def test_paper_model_reproduces_quoted_gflops(key):
    method, _, seq_len = key
    assert round(paper_gflops(method, seq_len), 4) == PAPER_QUOTED_GFLOPS[key]


def test_paper_model_structure():
    assert paper_macs("mha", 64) == paper_macs("mma", 64)  # MMA's masks do not change dense work
    assert paper_gflops("damcha", 256) < min(paper_gflops(m, 256) for m in PAPER_METHODS if m not in
                                             ("damcha", "damcha_compact"))  # the WMT claim, under this model
    with pytest.raises(ValueError, match="method"):
        paper_macs("gqa", 64)
    with pytest.raises(ValueError, match="seq_len"):
        paper_macs("mha", 0)


def _rows(variant, flavour, metric, value, status="ok"):
    return {"setting": "CIFAR-10/100", "seq_len": 64, "batch": 2, "variant": variant, "flavour": flavour,
            "metric": metric, "value": value, "unit": "x", "status": status, "message": ""}


def test_wide_frame_ratios_and_oom_cells():
    df = pd.DataFrame([
        _rows("mha", "paper", "latency_fwd_median_ms", 2.0), _rows("mha", "paper", "peak_train_rss_mib", 10.0),
        _rows("tha", "paper", "latency_fwd_median_ms", 3.0), _rows("tha", "paper", "peak_train_rss_mib", 12.5),
        _rows("moa", "damcha_repo", "latency_fwd_median_ms", 4.0),
        _rows("moa", "damcha_repo", "peak_train_rss_mib", math.nan, status="oom"),
        _rows("damcha", "paper", "peak_train_rss_mib", 5.0),
    ])
    wide = wide_frame(df).set_index("variant")
    assert wide.loc["tha", "fwd latency / MHA"] == pytest.approx(1.5)
    assert wide.loc["tha", "train memory / MHA"] == pytest.approx(1.25)
    assert wide.loc["moa", "train MiB (RSS)"] == "skipped (OOM)"
    comp = paper_comparison(df, "paper").set_index("what")
    assert comp.loc["THA/DAMCHA train memory, CIFAR (paper)", "ours"] == pytest.approx(2.5)
    assert comp.loc["DAMCHA CIFAR-10 GFLOPs (authors' model)", "ours"] == pytest.approx(0.0786, abs=5e-5)


def _cli(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "reproduce" / f"{NAME}.py"), "--preset", "smoke", "--device", "cpu",
           "--variants", "mha", "--settings", "cifar", "--batch", "1", "--warmup", "0", "--repeats", "2",
           "--threads", "1", "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_cli_end_to_end_and_rerun_skips(tmp_path):
    proc = _cli(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for suffix in ("_long.csv", ".env.json", "_wide.csv", ".md", ".jsonl"):
        assert (tmp_path / f"{NAME}{suffix}").stat().st_size > 0
    assert list(tmp_path.glob(f"{NAME}_*.png"))
    assert "0.0786" in proc.stdout and "paper" in proc.stdout  # paper | ours | delta printed
    long = pd.read_csv(tmp_path / f"{NAME}_long.csv")
    got = set(long["metric"])
    assert {"peak_fwd_rss_mib", "peak_train_rss_mib", "latency_fwd_median_ms", "latency_fwd_bwd_median_ms",
            "fwd_gflops_analytic", "fvcore_gmacs", "flop_counter_gflops", "paper_model_gflops",
            "attention_params", "total_params"} <= got
    assert (long["status"] == "ok").all()
    assert json.loads((tmp_path / f"{NAME}.env.json").read_text())["device"] == "cpu"
    lines = (tmp_path / f"{NAME}.jsonl").read_text().splitlines()
    again = _cli(tmp_path)
    assert again.returncode == 0 and "1 already measured here" in again.stdout
    assert (tmp_path / f"{NAME}.jsonl").read_text().splitlines() == lines  # nothing recomputed
    before = long[long["metric"] == "total_params"]["value"].tolist()
    other = _cli(tmp_path, "--vocab-size", "300", "--warmup", "1")  # other settings: a new cell, never the old one
    assert other.returncode == 0 and "0 already measured here" in other.stdout
    long = pd.read_csv(tmp_path / f"{NAME}_long.csv")
    after = long[long["metric"] == "total_params"]["value"].tolist()
    assert len(before) == len(after) == 1 and after[0] == before[0] + 44 * 128  # only the new cell is shown


def _saved_mib(name: str, dropout: float, T: int = 256) -> float:
    """MiB autograd keeps for backward of one causal training forward (B=1, D=128, H=8)."""
    import attention_zoo as zoo

    torch.manual_seed(0)
    attn = zoo.create_attention(name, d_model=128, n_heads=8, causal=True, dropout=dropout).train()
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attn(torch.randn(1, T, 128, requires_grad=True))
    return sum(sizes) / 2**20


def test_tha_memory_note_holds_mha_with_dropout_keeps_more_than_tha():
    """THA's declared memory_note (Table 2 prints it where THA trains in less memory than MHA): on CPU, MHA with
    attention dropout keeps several T x T tensors per layer, THA's chunked causal core fewer."""
    from attention_zoo.variants.tha import TalkingHeadsAttention

    assert "dropout" in TalkingHeadsAttention.memory_note
    mha_drop, mha_plain, tha_drop = _saved_mib("mha", 0.1), _saved_mib("mha", 0.0), _saved_mib("tha", 0.1)
    assert mha_drop > 3 * mha_plain  # the dropout path materialises the weights
    assert tha_drop < 0.5 * mha_drop
