"""Two-process DDP (gloo, CPU) through torchrun: the Table 5 script finishes, rank 0 alone writes, the replicas stay
in sync, and the per-step losses match a single-process run of the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from attention_zoo.experiments.lm import table5_gpt2 as table5_gpt2
from attention_zoo.io import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--preset", "smoke", "--variants", "mha", "--max-steps", "4", "--eval-batches", "1", "--quiet",
        "--threads", "1", "--train", "log_every=1", "eval_every=2", "eval_max_batches=1"]


@pytest.fixture
def keep_threads():
    """The in-process run sets torch's (process-wide) thread count; give the rest of the session its own back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _train_losses(out: Path) -> list[float]:
    (log,) = out.glob("runs/*/metrics.jsonl")
    return [r["loss"] for r in read_jsonl(log) if r["event"] == "train"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_process_gloo_run(tmp_path, keep_threads):
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "reproduce" / "table5_gpt2.py"), *ARGS, "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "table5_gpt2.md").is_file() and (out / "table5_gpt2_long.csv").is_file()
    assert [r["kind"] for r in read_jsonl(out / "table5_gpt2.jsonl")] == ["run", "cell"]  # written once (rank 0 only)
    (log,) = out.glob("runs/*/metrics.jsonl")
    rows = read_jsonl(log)
    sync = [r for r in rows if r["event"] == "ddp_sync"]
    assert sync and sync[0]["world_size"] == 2 and sync[0]["max_abs_diff"] == 0.0  # replicas identical
    assert [r["step"] for r in rows if r["event"] == "train"] == [1, 2, 3, 4]  # no duplicate rows from rank 1
    df = pd.read_csv(out / "table5_gpt2_long.csv")
    assert set(df.world_size) == {2} and set(df.status) == {"ok"}

    single = tmp_path / "single"
    assert table5_gpt2.main([*ARGS, "--out", str(single), "--device", "cpu"]) == 0
    # Each rank takes half of the same global batch, so the averaged gradient is the full batch's.
    torch.testing.assert_close(torch.tensor(_train_losses(out)), torch.tensor(_train_losses(single)),
                               rtol=1e-5, atol=1e-6)
