"""The dry run's cost estimate (experiments.dryrun.estimate): which source prices each pending cell."""

from attention_zoo.experiments.dryrun import estimate


def _rec(variant: str, seconds: float, steps: int | None = 1000, task: str = "patch", seed: int = 0) -> dict:
    cell = {"dataset": "digits", "task": task, "variant": variant, "lr": 1e-3, "seed": seed}
    if steps is not None:
        cell["steps"] = steps
    return {"cell": cell, "rows": [{"metric": "val_loss", "value": 1.0, "train_cpu_s": seconds}]}


def _cell(variant: str, steps: int | None = 2000, task: str = "patch") -> dict:
    return _rec(variant, 0.0, steps, task, seed=7)["cell"]


def test_an_arm_never_run_is_priced_from_the_other_arms_on_its_task():
    records = [_rec("mha", 10.0), _rec("mha", 12.0, seed=1), _rec("damcha", 30.0), _rec("tha", 100.0, task="seq2seq")]
    seconds, sources = estimate([_cell("mha_sep")], records, "table1_generation")
    # median over the arms on the same task of their median price, scaled to the cell's 2000 steps: mha 22, damcha 60
    assert sources["other arms"] == 1 and sources["analytic"] == 0
    assert seconds == (22.0 + 60.0) / 2


def test_the_other_arms_price_nothing_on_another_task_and_an_arms_own_price_comes_first():
    records = [_rec("mha", 10.0), _rec("mha_sep", 5.0, task="seq2seq")]
    seconds, sources = estimate([_cell("damcha", task="concepts"), _cell("mha_sep")], records, "t")
    # damcha on concepts: no arm has run there -> the analytic floor (2000 steps × 15 ms); mha_sep has its own
    # price (from seq2seq), which the same-variant rule takes before the other arms' (mha's on patch)
    assert sources == {"same kind": 0, "priced": 0, "same variant": 1, "calibrated": 0, "other arms": 0,
                       "analytic": 1, "unknown": 0}
    assert seconds == 2000 * 0.015 + 5.0 * 2


def test_cells_without_steps_take_the_other_arms_as_measured():
    seconds, sources = estimate([_cell("mha_sep", steps=None)], [_rec("mha", 8.0, steps=None)], "synthetic")
    assert sources["other arms"] == 1 and seconds == 8.0
