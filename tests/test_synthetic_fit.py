"""The synthetic cells' training (experiments/synthetic_fit.py): the grouped ensemble equals the per-seed path,
early stopping keeps the best checkpoint, an interrupted group resumes with the same results; the decide preset."""

import dataclasses

import pandas as pd
import pytest
import torch

from attention_zoo.experiments.synthetic import sweep as exp
from attention_zoo.experiments.synthetic.fit import Fit, Group, Task, ensemble_parts
from attention_zoo.measure.flops import analytic_flops

CPU = torch.device("cpu")
TASK = Task("regression", 1.0, n_train=256, n_val=64, n_test=64, reg_d_e=4, seq_len=6, noise=0.1, kappa=2.0)
CLS = dataclasses.replace(TASK, task="classification", setting=4.0)
FIT = Fit(max_steps=24, batch_size=16, lr=3e-3, warmup=4, eval_every=6, patience=2, budget_fracs=(0.5, 1.0),
          ckpt_every=8)
OPTS = {"hidden_dims": (8, 8)}
SUPPORTED = ["mha", "damcha", "mha_pm", "mha_ctx", "damcha_static", "damcha_bm", "mma"]


def _values(rows: list[dict]) -> dict:
    return {(r["metric"], r.get("budget"), r.get("step")): r["value"] for r in rows}


def _train(arm: str, ensemble: bool, task: Task = TASK, fit: Fit = FIT, **kw):
    g = Group(task, arm, "paper", [0, 1, 2], 1, OPTS, fit, CPU, ensemble)
    return g, g.train(**kw)


@pytest.mark.parametrize("arm", SUPPORTED)
def test_ensemble_equals_the_per_seed_path(arm):
    g, fast = _train(arm, True)
    assert g.path == "ensemble of 3", g.reason
    _, slow = _train(arm, False)
    for a, b in zip(fast, slow):
        va, vb = _values(a), _values(b)
        assert va.keys() == vb.keys()
        for k in va:
            if k[0] in ("train_cpu_s", "train_time_s"):
                continue
            assert va[k] == pytest.approx(vb[k], rel=1e-5, abs=1e-7), (arm, k)
        assert any(r["path"] == "ensemble of 3" for r in a) and all(r["path"] == "per-seed" for r in b)


def test_ensemble_parts_split_the_seeds_by_the_work_budget():
    assert ensemble_parts(10, 25e6, 300e6) == [list(range(10))]
    assert [len(p) for p in ensemble_parts(10, 100e6, 300e6)] in ([3, 2, 3, 2], [2, 3, 3, 2], [2, 3, 2, 3])
    assert ensemble_parts(10, 400e6, 300e6) == [[i] for i in range(10)]
    assert ensemble_parts(3, 1e12, float("inf")) == [[0, 1, 2]]
    for n, f in [(7, 1e6), (10, 60e6), (5, 150e6)]:
        parts = ensemble_parts(n, f, 300e6)
        assert sum(parts, []) == list(range(n)) and max(map(len, parts)) - min(map(len, parts)) <= 1


def test_ensembles_of_part_of_the_seeds_equal_the_per_seed_path():
    g = Group(TASK, "damcha", "paper", [0, 1, 2], 1, OPTS, FIT, CPU, True, ensemble_flops=1.0)
    assert g.path == "per-seed" and "exceeds the ensemble budget" in g.reason
    seed_flops = analytic_flops(g.models[0], FIT.batch_size, TASK.seq_len)
    g2 = Group(TASK, "damcha", "paper", [0, 1, 2], 1, OPTS, FIT, CPU, True, ensemble_flops=2.5 * seed_flops)
    assert g2.path == "2 ensembles of 2/1" and [len(p) for p in g2.parts] == [2, 1]
    _, slow = _train("damcha", False)
    for a, b in zip(g2.train(), slow):
        va, vb = _values(a), _values(b)
        for k in va:
            if k[0] not in ("train_cpu_s", "train_time_s"):
                assert va[k] == pytest.approx(vb[k], rel=1e-5, abs=1e-7), k


def test_the_test_split_is_scored_only_at_budget_points_and_the_end(monkeypatch):
    calls = []
    real = Group._test_metrics
    monkeypatch.setattr(Group, "_test_metrics", lambda self, net, data: calls.append(1) or real(self, net, data))
    _, rows = _train("mha", True)  # 4 evaluations, budgets at steps 12 and 24
    assert 1 <= len(calls) <= len(FIT.budget_fracs) + 1
    v = _values(rows[0])
    assert v[("test_mse@budget", 1.0, None)] == v[("test_mse", None, None)]


@pytest.mark.parametrize("arm,options", [("dcmha", {"use_static": True}), ("damcha", {"off_diag_mode": "linear_comb"})])
def test_variants_that_cannot_be_grouped_fall_back_and_say_why(arm, options):
    g = Group(CLS, arm, "paper", [0, 1], 1, options, dataclasses.replace(FIT, max_steps=2), CPU, True)
    assert g.path == "per-seed" and g.reason.startswith("model:"), g.reason
    rows = g.train()
    assert len(rows) == 2 and all(r["path_reason"] == g.reason for r in rows[0])


@pytest.mark.parametrize("arm", ["tha", "dcmha", "colmha", "moa"])
def test_head_mixing_and_routing_variants_group(arm):
    """THA, DCMHA, ColMHA and MoA carry a seed axis since round 5 (engine.ensemble): their seeds train together."""
    g = Group(CLS, arm, "paper", [0, 1], 1, {}, dataclasses.replace(FIT, max_steps=2), CPU, True)
    assert g.path == "ensemble of 2", g.reason


def test_early_stopping_keeps_the_best_checkpoint():
    frozen = dataclasses.replace(FIT, lr=0.0, max_steps=60)  # nothing improves after the first evaluation
    g, rows = _train("mha", True, fit=frozen)
    v = _values(rows[0])
    assert v[("steps_run", None, None)] == 6 * (1 + frozen.patience)  # stopped by patience, not the budget
    assert v[("best_step", None, None)] == 6
    # evaluations at the budget fractions (steps 8, 16, 32) do not count toward patience: still 12 steps after 6
    between = dataclasses.replace(frozen, max_steps=64, budget_fracs=(0.125, 0.25, 0.5, 1.0))
    _, rows3 = _train("mha", True, fit=between)
    assert _values(rows3[0])[("steps_run", None, None)] == 6 + between.patience * between.eval_every
    g2, rows2 = _train("damcha", False)
    for s, r in enumerate(rows2):  # the model left in place is each seed's best checkpoint
        again = g2._test_metrics(g2.models[s], {k: v[s:s + 1] for k, v in g2.data.items()})[0]
        assert _values(r)[("test_mse", None, None)] == pytest.approx(again["test_mse"])


@pytest.mark.parametrize("ensemble", [True, False])
def test_an_interrupted_group_resumes_with_the_same_results(tmp_path, ensemble):
    _, whole = _train("damcha", ensemble)
    ckpt = tmp_path / "group.pt"
    _, first = _train("damcha", ensemble, ckpt=ckpt, stop_at=8)
    assert first is None and (ckpt.is_file() or any(tmp_path.iterdir()))
    _, resumed = _train("damcha", ensemble, ckpt=ckpt)
    for a, b in zip(whole, resumed):
        va, vb = _values(a), _values(b)
        for k in va:
            if k[0] not in ("train_cpu_s", "train_time_s"):
                assert va[k] == pytest.approx(vb[k], rel=1e-6, abs=1e-9), k
    assert not list(tmp_path.iterdir())  # a finished group removes its checkpoints


def test_decide_preset_grid_and_arms():
    args = exp.build_parser().parse_args(["--preset", "decide"])
    tuning = exp.TUNING["decide"]
    assert len(tuning.lrs) == 5 and len(tuning.weight_decays) == 2 and len(tuning.tune_seeds) == 2
    assert min(tuning.lrs) < 1e-3 and max(tuning.lrs) > 1e-2  # the ends the first tuned run's arms chose are inside
    assert tuning.seeds == tuple(range(10)) and not set(tuning.tune_seeds) & set(tuning.seeds)
    cells = exp.build_cells(args, exp.PRESETS["decide"], "decide", tuning, [])  # nothing tuned yet
    arms = {c["variant"] for c in cells}
    assert arms == {"mha", "damcha", "mha_pm", "mha_ctx", "damcha_static", "damcha_bm", "mha_sep"}
    final = [c for c in cells if c["phase"] == "tuned"]
    assert {c["lam"] for c in final if c["task"] == "regression"} == {0.0, 0.2, 0.6, 1.0}
    assert {c["d_e"] for c in final if c["task"] == "classification"} == {4, 8, 12, 16, 20}
    assert {c["seed"] for c in final} == set(range(10)) and len(final) == 9 * 7 * 10
    assert all(c["lr"] is None for c in final)  # waiting for their arm's tuning
    tune = [c for c in cells if c["phase"] == "tune"]
    assert {(c["task"], c["lam"], c["d_e"]) for c in tune} == {("regression", 1.0, 8), ("classification", None, 12)}
    assert len(tune) == 2 * 7 * 10 * 2 and {"phase", "lr", "weight_decay"} <= set(tune[0])
    fit = exp.PRESETS["decide"].fit
    assert fit.patience and fit.eval_every and len(fit.budget_fracs) >= 4
    groups = exp.groups_of(tune)  # the grid rides the ensemble axis: one group per (task, arm)
    assert len(groups) == 14 and all(len(g) == 20 for g in groups)


def test_tiny_decide_preset_end_to_end(tmp_path, capsys):
    argv = ["--preset", "decide", "--steps", "12", "--seeds", "0", "1", "--lambda", "1", "--de", "4",
            "--variants", "mha,damcha,mha_ctx", "--workers", "1", "--threads", "1", "--quiet", "--out", str(tmp_path)]
    threads = torch.get_num_threads()
    try:
        assert exp.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "I.lambda1" in out and "[decide]" in out and "## Tuning" in out
    store = pd.read_json(tmp_path / "synthetic.jsonl", lines=True)
    cells = pd.DataFrame(list(store.loc[store["kind"] == "cell", "cell"]))
    assert set(cells["phase"]) == {"tune", "tuned"} and set(cells.loc[cells["phase"] == "tuned", "seed"]) == {0, 1}
    long = pd.read_csv(tmp_path / "synthetic_long.csv")
    for metric in ("test_r2", "trivial_mse", "oracle_mse", "test_acc_norm", "chance_acc", "test_mse@budget",
                   "val_loss@step", "train_flops", "train_cpu_s"):
        assert metric in set(long["metric"]), metric
    assert set(long.loc[long["metric"] == "test_mse@budget", "budget"]) == {0.125, 0.25, 0.5, 1.0}
    md = (tmp_path / "synthetic.md").read_text()
    assert "## Verdicts on the paper's claims" in md and "### Calibration" in md and "range of 2 seeds" in md
    assert "## Tuning" in md and "on the edge" in md
    for fig in ("figure12_r2.png", "figure12_gain.png", "figure13_accuracy.png", "figure13_gain.png",
                "synthetic_budget_gain_regression.png"):
        assert (tmp_path / fig).stat().st_size > 0, fig


def test_training_throughput_mode_reports_every_path(tmp_path, capsys):
    from attention_zoo import bench

    threads = torch.get_num_threads()
    try:
        assert bench.main(["train", "--variants", "mha,tha", "--seeds", "2", "--steps", "2", "--rounds", "1",
                           "--warmup", "0", "--csv", str(tmp_path / "t.csv"), "--md", str(tmp_path / "t.md")]) == 0
    finally:
        torch.set_num_threads(threads)
    df = pd.read_csv(tmp_path / "t.csv")
    ok = df[df["status"] == "ok"]
    assert set(ok[ok["variant"] == "mha"]["path"]) == {"legacy", "per-seed", "ensemble", "sweep"}
    assert set(ok[ok["variant"] == "tha"]["path"]) == {"legacy", "per-seed", "ensemble", "sweep"}  # groups since
    assert (ok["seed_steps_per_cpu_s"] > 0).all()  # round 5 (its [S, H, H] mixes)


def test_arms_share_the_data_and_steppers_read_views_of_it():
    """Memory: ten seeds at d_e = 20 are ≈ 1 GB of training data; a copy per arm or per stepper exhausted 24 GiB."""
    g = Group(TASK, "mha", "paper", [0, 1, 2], 1, OPTS, FIT, CPU, True)
    h = Group(TASK, "damcha", "paper", [0, 1, 2], 1, OPTS, FIT, CPU, True, data=g.data)
    assert h.data["x_train"] is g.data["x_train"]
    fresh = Group(TASK, "damcha", "paper", [0, 1, 2], 1, OPTS, FIT, CPU, True)
    assert all(torch.equal(fresh.data[k], h.data[k]) for k in fresh.data)  # sharing changes nothing
    base = g.data["x_train"].untyped_storage().data_ptr()
    step = g.stepper(g.models[1], [1, 2])[0]
    x = step.__closure__[[c.cell_contents is not None and isinstance(c.cell_contents, torch.Tensor)
                          and c.cell_contents.dim() == 4 for c in step.__closure__].index(True)].cell_contents
    assert x.untyped_storage().data_ptr() == base
