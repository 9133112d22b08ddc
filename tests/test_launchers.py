"""--launcher submitit through submitit's LocalExecutor (real submitit code, real subprocesses): the same store as the
local pool; a job killed mid-cell is resubmitted; a killed driver loses and duplicates nothing."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import submitit  # noqa: F401  (the dev extra installs it: a missing submitit fails here instead of skipping)
import torch

from attention_zoo.experiments.protocol import EXPERIMENTS, execute
from attention_zoo.experiments.synthetic import sweep as exp

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--variants", "mha,damcha", "--seeds", "0", "1", "--lambda", "1", "--task", "regression", "--workers", "1",
        "--threads", "1", "--quiet"]
SUBMITIT = ["--launcher", "submitit", "--submitit-cluster", "local", "--slurm-retries", "2"]


def _cells(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "synthetic.jsonl").read_text().splitlines()
            if json.loads(x)["kind"] == "cell"]


def _values(out: Path) -> dict:
    df = pd.read_csv(out / "synthetic_long.csv")
    keep = df[df["metric"].isin(["test_mse", "test_mse_clean", "best_val_loss", "steps_run"])]
    return {(r.variant, r.seed, r.metric): r.value for r in keep.itertuples()}


@pytest.fixture
def threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_submitit_sweep_gives_the_local_store(tmp_path, threads):
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    assert exp.main([*TINY, "--steps", "6", "--out", str(local)]) == 0
    assert exp.main([*TINY, "--steps", "6", "--out", str(cluster), *SUBMITIT]) == 0
    a, b = _cells(local), _cells(cluster)
    assert sorted(c["cell_id"] for c in a) == sorted(c["cell_id"] for c in b)  # the launcher is not provenance
    va, vb = _values(local), _values(cluster)
    assert va.keys() == vb.keys() and all(va[k] == pytest.approx(vb[k], rel=1e-6) for k in va)
    results = list((cluster / "_cache" / "submitit" / "results").glob("*.json"))
    assert len(results) == 2  # one job per group of seeds (mha, damcha)


def test_a_job_killed_mid_cell_is_resubmitted(tmp_path, threads):
    out = tmp_path / "o"
    args = exp.build_parser().parse_args([*TINY, "--steps", "150", "--out", str(out), *SUBMITIT])
    jobs = out / "_cache" / "submitit" / "jobs"
    killed = []

    def kill_first_job():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            for f in sorted(jobs.glob("*_submitted.pkl")) if jobs.is_dir() else []:
                pid = int(f.name.split("_")[0])
                time.sleep(1.0)  # mid-job: started, far from the end
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
                return
            time.sleep(0.1)

    t = threading.Thread(target=kill_first_job)
    t.start()
    code = execute(exp.plan(args), args, "synthetic")
    t.join()
    assert code == 0 and killed
    cells = _cells(out)
    assert len(cells) == 4 and len({c["cell_id"] for c in cells}) == 4
    assert all(r.get("status", "ok") == "ok" for c in cells for r in c["rows"])
    assert len(list(jobs.glob("*_submitted.pkl"))) >= 3  # two jobs and at least one resubmission


def test_a_killed_driver_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "o"
    cmd = [sys.executable, str(ROOT / "reproduce" / "synthetic.py"), *TINY, "--seeds", "0", "--steps", "50",
           "--variants", "mha,damcha,mha_ctx", "--out", str(out), *SUBMITIT]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = out / "_cache" / "submitit" / "results"
    deadline = time.time() + 180
    while time.time() < deadline and not (results.is_dir() and list(results.glob("*.json"))):
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)  # the driver dies with jobs done, running or queued
    driver.wait()
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    cells = _cells(out)
    assert len(cells) == 3 and len({c["cell_id"] for c in cells}) == 3  # every cell once
    assert set(pd.read_csv(out / "synthetic_long.csv")["variant"]) == {"mha", "damcha", "mha_ctx"}


def test_every_experiment_is_registered_with_its_script():
    for name, e in EXPERIMENTS.items():
        assert (ROOT / "reproduce" / f"{name}.py").is_file(), name
        module = e.load()
        assert callable(getattr(module, "build_parser", None)) and callable(getattr(module, "main", None)), name
        opts = {a.dest for a in module.build_parser()._actions}
        assert "launcher" in opts, f"{name} takes no --launcher"
