"""Synthetic tasks of Figures 12–13 (attention_zoo/data/synthetic.py) and their sweep (experiments/synthetic.py)."""

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from attention_zoo.data import synthetic as syn
from attention_zoo.experiments.synthetic import report as stats
from attention_zoo.experiments.synthetic import sweep as exp

ROOT = Path(__file__).resolve().parent.parent


def _mixed_differences(lam: float, d_e: int = 3, seq_len: int = 5) -> torch.Tensor:
    """y(a_i,a_j) − y(a_i,b_j) − y(b_i,a_j) + y(b_i,b_j) for every subspace pair i≠j, other subspaces from a."""
    data = syn.make_regression(8, 1, d_e, seq_len, lam, seed=3, dtype=torch.float64)
    a, b = syn.subspaces(data.x_train[:4]), syn.subspaces(data.x_train[4:8])  # (4, T, 4, d_e) each

    def y(i, j, src_i, src_j):
        x = a.clone()
        x[:, :, i], x[:, :, j] = src_i[:, :, i], src_j[:, :, j]
        return syn.regression_target(x.flatten(2), data.constants, lam)

    return torch.stack([y(i, j, a, a) - y(i, j, a, b) - y(i, j, b, a) + y(i, j, b, b)
                        for i, j in itertools.permutations(range(4), 2)])


def test_lambda_zero_target_is_a_sum_of_per_subspace_functions():
    torch.testing.assert_close(_mixed_differences(0.0), torch.zeros(12, 4, dtype=torch.float64), atol=1e-12,
                               rtol=0)


def test_lambda_positive_target_has_cross_subspace_interactions():
    d = _mixed_differences(0.5)
    assert d.abs().amax(dim=1).min() > 1e-3  # every pair (i, j) interacts


def test_regression_target_is_normalised_and_lambda_only_changes_the_mixing():
    d0 = syn.make_regression(6000, 10, d_e=4, lam=0.0, seed=1)
    d1 = syn.make_regression(6000, 10, d_e=4, lam=1.0, seed=1)
    torch.testing.assert_close(d0.x_train, d1.x_train)
    for d in (d0, d1):
        clean = syn.regression_target(d.x_train, d.constants, d.info["lam"])
        assert abs(clean.mean().item()) < 0.05 and abs(clean.std().item() - 1) < 0.05
        noise = d.y_train.double() - clean
        assert abs(noise.std().item() - 0.1) < 0.01
    torch.testing.assert_close(d0.y_train.double() - syn.regression_target(d0.x_train, d0.constants, 0.0),
                               d1.y_train.double() - syn.regression_target(d1.x_train, d1.constants, 1.0),
                               atol=1e-6, rtol=0)  # same noise draw


@pytest.mark.parametrize("d_e", [4, 8, 12, 16, 20])
def test_shapes_and_width(d_e):
    r = syn.make_regression(10, 6, d_e=d_e, seq_len=7, seed=0)
    c = syn.make_classification(12, 6, d_e=d_e, seq_len=7, seed=0)
    assert r.x_train.shape == (10, 7, 4 * d_e) and r.x_test.shape == (6, 7, 4 * d_e)
    assert r.y_train.shape == (10,) and r.y_test_clean.shape == (6,) and r.y_train.dtype == torch.float32
    assert c.x_train.shape == (12, 7, 4 * d_e) and c.y_train.dtype == torch.int64 and c.n_classes == 6
    assert c.constants["R"].shape == (6, d_e, d_e)


def test_seeding_is_reproducible():
    for make in (syn.make_regression, syn.make_classification):
        a, b, c = make(32, 8, seed=7), make(32, 8, seed=7), make(32, 8, seed=8)
        torch.testing.assert_close(a.x_train, b.x_train)
        torch.testing.assert_close(a.y_test, b.y_test)
        assert not torch.equal(a.x_train, c.x_train)


def test_classification_labels_balanced_and_set_by_the_aligned_pair():
    c = syn.make_classification(600, 300, d_e=8, seed=2)
    assert torch.bincount(c.y_train, minlength=6).tolist() == [100] * 6
    assert torch.bincount(c.y_test, minlength=6).tolist() == [50] * 6
    oracle = (syn.oracle_scores(c.x_test, c.constants).argmax(1) == c.y_test).float().mean()
    assert oracle > 0.5  # chance is 1/6
    # Without token noise the class pair (i, j) satisfies x̄_j = R_c x̄_i exactly and the others do not.
    q = syn.make_classification(60, 1, d_e=4, token_noise=0.0, seed=2, dtype=torch.float64)
    m = syn.subspaces(q.x_train).mean(1)  # (N, 4, d_e)
    for n in range(60):
        for k, (i, j) in enumerate(syn.PAIRS):
            err = (m[n, j] - q.constants["R"][k] @ m[n, i]).abs().max()
            assert (err < 1e-12) == (k == q.y_train[n].item())


@pytest.mark.parametrize("kwargs, arg", [({"d_e": 0}, "d_e"), ({"seq_len": 1}, "seq_len"), ({"n_train": 0}, "n_train"),
                                         ({"seed": -1}, "seed"), ({"seed": 2**32}, "seed"),
                                         ({"noise": -0.1}, "noise")])
def test_bad_arguments_name_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        syn.make_regression(**{"n_train": 4, "n_test": 2, **kwargs})


def test_t_interval_hand_example():
    mean, lo, hi = stats.t_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446305284263 * math.sqrt(5 / 3) / 2  # t_{0.975, 3} · s / √n, s² = 5/3
    assert mean == pytest.approx(2.5)
    assert (lo, hi) == (pytest.approx(2.5 - half), pytest.approx(2.5 + half))
    assert math.isnan(stats.t_interval([1.0])[1])


def test_paired_gains_by_seed():
    rows = []
    for seed, (m, d) in enumerate([(1.0, 0.9), (2.0, 2.2)]):
        for variant, v in (("mha", m), ("damcha", d)):
            rows.append({"task": "regression", "lam": 1.0, "d_e": 8, "seed": seed, "variant": variant,
                         "flavor": "paper", "metric": "test_mse", "value": v, "status": "ok"})
    rows.append({**rows[0], "task": "classification", "lam": None, "metric": "test_acc", "value": 0.5})
    rows.append({**rows[1], "task": "classification", "lam": None, "metric": "test_acc", "value": 0.6})
    g = stats.paired_gains(pd.DataFrame(rows)).sort_values(["task", "seed"])
    assert g["gain"].tolist() == pytest.approx([10.0, 10.0, -10.0])  # cls: +10 points; reg: +10 %, −10 %


def test_task_selection_follows_the_named_sweeps():
    p = exp.build_parser()
    assert exp._tasks(p.parse_args(["--lambda", "0.2"])) == ("regression",)
    assert exp._tasks(p.parse_args(["--de", "4"])) == ("classification",)
    assert exp._tasks(p.parse_args([])) == exp.TASKS
    assert exp._tasks(p.parse_args(["--lambda", "0", "--task", "both"])) == exp.TASKS


def test_cli_tiny_sweep_writes_outputs_and_skips_finished_cells(tmp_path, capsys):
    argv = ["--variants", "mha,tha", "--seeds", "0", "1", "--lambda", "0", "1", "--de", "4", "--steps", "5",
            "--workers", "1", "--threads", "1", "--quiet", "--out", str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.run([sys.executable, str(ROOT / "reproduce" / "synthetic.py"), *argv], capture_output=True,
                           text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "12 cells (12 run now" in first.stdout
    for name in ("synthetic_long.csv", "synthetic_wide.csv", "synthetic.md", "synthetic_gains.csv",
                 "synthetic.env.json", "figure12_r2.png", "figure12_gain.png", "figure13_accuracy.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    long = pd.read_csv(tmp_path / "synthetic_long.csv")
    assert set(long["variant"]) == {"mha", "tha"} and set(long["seed"]) == {0, 1}
    assert long.loc[long["metric"] == "test_mse", "value"].notna().all()
    lines = (tmp_path / "synthetic.jsonl").read_text().splitlines()
    cells = [json.loads(x) for x in lines if json.loads(x)["kind"] == "cell"]
    assert len(cells) == 12 and len(lines) == 13 and all(c["rows"] for c in cells)  # + this run's record
    threads = torch.get_num_threads()
    try:
        assert exp.main(argv) == 0  # the rerun, in-process: nothing left to train
    finally:
        torch.set_num_threads(threads)
    assert "12 cells (0 run now" in capsys.readouterr().out
    assert (tmp_path / "synthetic.jsonl").read_text().splitlines() == lines
