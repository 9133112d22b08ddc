"""Tuning parity (experiments/tuning.py): the grid is chosen on validation only, per-member learning rates and
weight decays in one ensemble equal separate runs, and the decide presets declare their grids and arms."""

import functools
import json
import math
import os

import pytest
import torch

from attention_zoo.experiments.synthetic.fit import Fit, Group, Task
from attention_zoo.experiments.tuning import Tuning, arm_id, choose, tune_scores, tuned_cells

CPU = torch.device("cpu")
TASK = Task("regression", 1.0, n_train=256, n_val=64, n_test=64, reg_d_e=4, seq_len=6, noise=0.1, kappa=2.0)
FIT = Fit(max_steps=16, batch_size=16, lr=3e-3, warmup=4, eval_every=4, patience=2, budget_fracs=(0.5, 1.0))
TUNING = Tuning(lrs=(1e-3, 3e-3, 1e-2), weight_decays=(0.0, 0.1), tune_seeds=(7, 8), seeds=tuple(range(10)))


def _values(rows):
    return {(r["metric"], r.get("budget"), r.get("step")): r["value"] for r in rows
            if r["metric"] not in ("train_cpu_s", "train_time_s")}


def _record(arm: str, lr: float, wd: float, seed: int, val: float, test: float | None = None) -> dict:
    rows = [{"metric": "val_loss", "value": val}] + ([] if test is None else [{"metric": "test_loss", "value": test}])
    return {"cell": {"variant": arm, "phase": "tune", "lr": lr, "weight_decay": wd, "seed": seed}, "rows": rows}


def test_the_choice_is_the_validation_best_not_the_test_best():
    recs = []
    for lr in TUNING.lrs:
        for wd in TUNING.weight_decays:
            for s in TUNING.tune_seeds:
                # planted: validation prefers lr 3e-3 / wd 0.1; a test metric (were it read) would prefer lr 1e-2
                val = 1.0 if (lr, wd) == (3e-3, 0.1) else 2.0 + lr
                recs.append(_record("mha", lr, wd, s, val, test=0.1 if lr == 1e-2 else 5.0))
    choice = choose(TUNING, tune_scores(recs, "val_loss")[arm_id({"variant": "mha"})])
    assert choice.setting == {"lr": 3e-3, "weight_decay": 0.1} and choice.score == 1.0
    assert choice.edge == ("weight_decay",)  # 0.1 is the largest weight decay of the grid: flagged


def test_no_choice_until_every_grid_point_has_every_tuning_seed_and_diverged_points_lose():
    recs = [_record("mha", lr, wd, 7, 1.0) for lr in TUNING.lrs for wd in TUNING.weight_decays]
    assert choose(TUNING, tune_scores(recs, "val_loss")[arm_id({"variant": "mha"})]) is None
    recs += [_record("mha", lr, wd, 8, math.nan if lr == 1e-3 else 1.0 + lr) for lr in TUNING.lrs
             for wd in TUNING.weight_decays]
    choice = choose(TUNING, tune_scores(recs, "val_loss")[arm_id({"variant": "mha"})])
    assert choice.setting["lr"] == 3e-3 and choice.edge == ("weight_decay",)


def test_tuned_cells_wait_for_their_arms_tuning():
    arms = [{"variant": "mha"}, {"variant": "damcha"}]
    cells, waiting, choices = tuned_cells(TUNING, arms, [])
    assert {c["phase"] for c in cells} == {"tune"} and len(cells) == 2 * 6 * 2 and len(waiting) == 20
    recs = [_record("mha", lr, wd, s, lr + wd) for lr in TUNING.lrs for wd in TUNING.weight_decays
            for s in TUNING.tune_seeds]
    cells, waiting, choices = tuned_cells(TUNING, arms, recs)
    final = [c for c in cells if c["phase"] == "tuned"]
    assert [c["seed"] for c in final] == list(range(10)) and all(c["lr"] == 1e-3 and c["weight_decay"] == 0.0
                                                                 for c in final)
    assert len(waiting) == 10 and all(c["variant"] == "damcha" for c in waiting)


@pytest.mark.parametrize("bad", [dict(lrs=()), dict(lrs=(0.0,)), dict(weight_decays=(-1.0,)),
                                 dict(seeds=(1, 1)), dict(shared={"lr": 1e-3})])
def test_a_bad_grid_is_a_value_error_naming_the_argument(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Tuning(**{**dict(lrs=(1e-3,), weight_decays=(0.0,), tune_seeds=(0,), seeds=(0,)), **bad})


@pytest.mark.parametrize("arm", ["mha", "damcha"])
def test_per_member_lr_and_weight_decay_in_one_ensemble_equal_separate_runs(arm):
    members = [(0, 1e-3, 0.0), (0, 1e-2, 0.3), (1, 3e-3, 0.1)]  # two members share seed 0's data and init
    seeds, hp = [m[0] for m in members], [m[1:] for m in members]
    g = Group(TASK, arm, "paper", seeds, 1, {"hidden_dims": (8, 8)}, FIT, CPU, True, hparams=hp)
    assert g.path == "ensemble of 3", g.reason
    together = g.train()
    for (seed, lr, wd), rows in zip(members, together):
        fit = Fit(**{**FIT.__dict__, "lr": lr, "weight_decay": wd})
        alone = Group(TASK, arm, "paper", [seed], 1, {"hidden_dims": (8, 8)}, fit, CPU, False).train()[0]
        va, vb = _values(rows), _values(alone)
        assert va.keys() == vb.keys()
        for k in va:
            assert va[k] == pytest.approx(vb[k], rel=1e-5, abs=1e-7), (arm, seed, lr, wd, k)


def test_a_tuning_group_never_reads_the_test_split(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the test split was scored during tuning")

    monkeypatch.setattr(Group, "_test_metrics", refuse)
    hp = [(lr, wd) for lr in (1e-3, 1e-2) for wd in (0.0, 0.1)]
    rows = Group(TASK, "mha", "paper", [0] * 4, 1, {}, FIT, CPU, True, hparams=hp, score_test=False).train()
    metrics = {r["metric"] for member in rows for r in member}
    assert "best_val_loss" in metrics and not any(m.startswith(("test", "trivial", "oracle")) for m in metrics)


# ---- grid edges and the runner-up setting (a verdict's dependence on the choice) ----------------------------------
def _scores(f):
    return {(lr, wd): {s: f(lr, wd) + 0.001 * s for s in (0, 1)} for lr in (1e-3, 2e-3, 4e-3, 8e-3, 16e-3, 32e-3)
            for wd in (0.0, 0.1, 0.3, 0.9)}


def test_a_best_on_the_edge_extends_the_arms_grid_until_it_is_inside():
    from attention_zoo.experiments.tuning import Tuning, arm_grid, choose

    t = Tuning(lrs=(1e-3, 2e-3, 4e-3), weight_decays=(0.0, 0.1, 0.3), tune_seeds=(0, 1), seeds=(5,), extend=2)
    bowl = _scores(lambda lr, wd: (math.log2(lr / 8e-3)) ** 2 + (wd - 0.1) ** 2)  # best lr 8e-3, beyond the grid
    grid = [(g["lr"], g["weight_decay"]) for g in t.grid()]
    assert arm_grid(t, {p: v for p, v in bowl.items() if p in grid}) == grid + [(8e-3, 0.1)]
    scored = {p: v for p, v in bowl.items() if p in grid + [(8e-3, 0.1), (16e-3, 0.1)]}
    assert arm_grid(t, scored) == grid + [(8e-3, 0.1), (16e-3, 0.1)]  # 8e-3 was the new edge: one more step
    choice = choose(t, scored)
    assert choice.setting == {"lr": 8e-3, "weight_decay": 0.1} and choice.edge == ()
    assert choice.runner_up in ({"lr": 4e-3, "weight_decay": 0.1}, {"lr": 16e-3, "weight_decay": 0.1})
    far = _scores(lambda lr, wd: -lr + wd)  # better ever higher: stops after two steps, still flagged
    cap = arm_grid(t, far)
    assert cap[-2:] == [(8e-3, 0.0), (16e-3, 0.0)] and choose(t, far).edge == ("lr", "weight_decay")
    assert arm_grid(Tuning(lrs=(1e-3, 2e-3), weight_decays=(0.0, 0.1), tune_seeds=(0, 1), seeds=(5,)), far) == [
        (1e-3, 0.0), (1e-3, 0.1), (2e-3, 0.0), (2e-3, 0.1)]  # extend=0: the declared grid only


def test_runner_up_cells_run_at_the_second_best_setting_and_wait_with_the_finals():
    from attention_zoo.experiments.tuning import Tuning, tuned_cells

    t = Tuning(lrs=(1e-3, 2e-3, 4e-3), weight_decays=(0.0, 0.1, 0.3), tune_seeds=(0, 1), seeds=(5, 6, 7),
               runner_up_seeds=(5, 6))
    cells, waiting, _ = tuned_cells(t, [{"variant": "mha"}], [])
    assert {c["phase"] for c in waiting} == {"tuned", "runner_up"} and len(waiting) == 5
    bowl = _scores(lambda lr, wd: (math.log2(lr / 2e-3)) ** 2 + (wd - 0.1) ** 2 + 0.01 * (lr > 2e-3))
    recs = [{"cell": {"variant": "mha", "phase": "tune", "lr": lr, "weight_decay": wd, "seed": s},
             "rows": [{"metric": "val_loss", "value": v}]} for (lr, wd), by in bowl.items() for s, v in by.items()]
    cells, waiting, choices = tuned_cells(t, [{"variant": "mha"}], recs)
    assert waiting == []
    runner = [c for c in cells if c["phase"] == "runner_up"]
    assert [c["seed"] for c in runner] == [5, 6] and {(c["lr"], c["weight_decay"]) for c in runner} == {(2e-3, 0.0)}
    assert Tuning(lrs=(1e-3, 2e-3), weight_decays=(0.0, 0.1), tune_seeds=(0, 1), seeds=(5,)).describe().endswith(
        "(a two-value axis: its edge flag says little), 2 tuning seeds, 1 final seeds")


def test_provenance_keeps_the_key_of_stores_made_before_the_later_fields():
    base = Tuning(lrs=(1e-3, 2e-3), weight_decays=(0.0,), tune_seeds=(1000, 1001), seeds=(0, 1, 2))
    key = base.provenance()
    assert "seeds" not in key and "extend" not in key and "runner_up_seeds" not in key  # neutral: left out
    assert key["lrs"] == (1e-3, 2e-3) and key["tune_seeds"] == (1000, 1001)
    wider = Tuning(lrs=(1e-3, 2e-3), weight_decays=(0.0,), tune_seeds=(1000, 1001), seeds=(0, 1, 2), extend=1,
                   runner_up_seeds=(0, 1))
    assert wider.provenance()["extend"] == 1 and wider.provenance()["runner_up_seeds"] == (0, 1)  # a new store
    assert Tuning(lrs=(1e-3, 2e-3), weight_decays=(0.0,), tune_seeds=(1000, 1001), seeds=(5,)).provenance() == key


# ---- stages overlap: an arm's finals start when its tuning is stored, not when every arm's is ----------------------
def _staged_work(unit, marker):
    """A unit of the planted staged run. Arm A's tuning ends at once; arm B's tuning waits (up to 20 s) until a final
    cell of arm A has started, and records whether it saw one: only a run whose stages overlap lets it."""
    import time
    from pathlib import Path

    c = unit[0]
    if c["phase"] == "tuned" and c["arm"] == "A":
        Path(marker).touch()
    saw = None
    if c["phase"] == "tune" and c["arm"] == "B":
        deadline = time.monotonic() + 20
        while not Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        saw = Path(marker).exists()
    return [[{"metric": "val_loss", "value": 1.0, "unit": "", "pid": os.getpid(), "saw_a_final": saw}] for _ in unit]


def _staged_plan_of(store, marker, workers, work=None):
    import functools

    from attention_zoo.experiments.protocol import Plan

    def plan_of():
        tuned = {r["cell"]["arm"] for r in store.records() if r["cell"]["phase"] == "tune"}
        cells = [{"arm": a, "phase": "tune", "seed": 0} for a in "AB"]
        cells += [{"arm": a, "phase": "tuned", "seed": s} for a in sorted(tuned) for s in (0, 1)]
        fn = work or functools.partial(_staged_work, marker=marker)
        return Plan(store, [[c] for c in cells if not store.is_done(c)], fn, lambda: 0, workers=workers), \
            2 * (2 - len(tuned))

    return plan_of


def _run_stages(tmp_path, workers, work=None):
    from argparse import Namespace

    from attention_zoo.experiments.tuning import execute_stages
    from attention_zoo.results import ResultStore

    store = ResultStore(tmp_path, "staged", {"options": {}})
    marker = str(tmp_path / "a-final-started")
    code = execute_stages(_staged_plan_of(store, marker, workers, work),
                          Namespace(dry_run=False, launcher="local", quiet=True), "staged")
    store.refresh()
    return code, {json.dumps(r["cell"], sort_keys=True): r["rows"][0] for r in store.records()}


def test_a_tuned_arms_finals_start_while_another_arm_still_tunes(tmp_path):
    code, rows = _run_stages(tmp_path, workers=2)
    assert code == 0 and len(rows) == 6  # 2 tuning cells + 2 finals per arm
    b_tune = rows[json.dumps({"arm": "B", "phase": "tune", "seed": 0}, sort_keys=True)]
    assert b_tune["saw_a_final"] is True  # the old barrier: A's finals waited for B's tuning (False after 20 s)


def test_one_worker_runs_every_stage_in_one_pass_and_a_different_work_function_keeps_the_barrier(tmp_path):
    from attention_zoo.experiments.tuning import same_work

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a-final-started").touch()  # one worker runs B's tuning before any final: nothing to wait for
    code, rows = _run_stages(tmp_path / "one", workers=1)
    assert code == 0 and len(rows) == 6
    assert same_work(functools.partial(_staged_work, marker="m"), functools.partial(_staged_work, marker="m"))
    assert not same_work(functools.partial(_staged_work, marker="m"), functools.partial(_staged_work, marker="n"))
    assert not same_work(_staged_work, functools.partial(_staged_work, marker="m"))
