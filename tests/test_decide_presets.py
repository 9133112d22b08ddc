"""The decide presets with tuning parity: each declares its grid and arms, and a tiny version runs end to end
(the grid on validation only, then the final seeds at each arm's choice, the report's tuning and calibration)."""

import json

import torch

from attention_zoo.experiments.lm import table5_gpt2 as t5
from attention_zoo.experiments.tuning import Tuning
from attention_zoo.experiments.vision import table6_vit as t6
from attention_zoo.experiments.vision.table6_data import load_data

TINY = Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.1,), tune_seeds=(1000,), seeds=(0, 1))


def _cells(path):
    return [json.loads(line) for line in path.read_text().splitlines() if '"kind": "cell"' in line]


def _main(main, argv):
    threads = torch.get_num_threads()
    try:
        return main(argv)
    finally:
        torch.set_num_threads(threads)


def test_table5_decide_declares_its_grid_and_arms(capsys):
    tuning = t5.TUNING["decide"]
    assert len(tuning.lrs) == 3 and len(tuning.weight_decays) == 2 and len(tuning.tune_seeds) == 2
    assert min(tuning.lrs) < 4e-3 < max(tuning.lrs)  # the first grid's corner (every arm's choice) is now inside
    assert tuning.seeds == tuple(range(10)) and not set(tuning.tune_seeds) & set(tuning.seeds)
    assert (2e-3, 0.1) in [(g["lr"], g["weight_decay"]) for g in tuning.grid()]  # the smoke setting is a grid point
    assert t5._variants(None, "decide") == ["mha", "dcmha", "damcha", "mha_pm", "mha_ctx", "damcha_bm"]
    train = t5.PRESETS["decide"].train
    assert train["patience"] and train["eval_every"] and train["patience"] % train["eval_every"] == 0
    assert t5.main(["--preset", "decide", "--dry-run", "--out", "/nonexistent/t5"]) == 0
    out = capsys.readouterr().out
    assert "would run: 132" in out and "phase=tune" in out  # 6 arms × (6 grid points × 2 seeds + 10 final seeds)


def test_table5_tiny_decide_tunes_on_validation_then_runs_the_seeds_at_the_choice(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(t5.TUNING, "decide", TINY)
    argv = ["--preset", "decide", "--variants", "mha", "--seeds", "0", "1", "--steps", "6", "--eval-batches", "1",
            "--train", "eval_every=2", "patience=2", "eval_max_batches=1", "--jobs", "1", "--quiet",
            "--out", str(tmp_path)]
    assert _main(t5.main, argv) == 0
    cells = _cells(tmp_path / "table5_gpt2.jsonl")
    tune = [c for c in cells if c["cell"]["phase"] == "tune"]
    final = [c for c in cells if c["cell"]["phase"] == "tuned"]
    assert len(tune) == 2 and len(final) == 2
    assert all(not any(r["metric"].startswith(("test", "trivial")) for r in c["rows"]) for c in tune)
    val = {c["cell"]["lr"]: next(r["value"] for r in c["rows"] if r["metric"] == "val_loss") for c in tune}
    assert {c["cell"]["lr"] for c in final} == {min(val, key=val.get)}
    assert all(any(r["metric"] == "best_step" for r in c["rows"]) for c in final)
    for c in final:  # the test loss of the best checkpoint so far at budget fractions; 1.0 is the run's own
        budget = {r["budget"]: r["value"] for r in c["rows"] if r["metric"] == "test_loss@budget"}
        assert sorted(budget) == [0.125, 0.25, 0.5, 1.0]
        assert budget[1.0] == next(r["value"] for r in c["rows"] if r["metric"] == "test_loss")
    assert not any(r["metric"].endswith("@budget") for c in tune for r in c["rows"])
    md = (tmp_path / "table5_gpt2.md").read_text()
    assert "## Tuning" in md and "## Calibration: test_loss vs the trivial predictor" in md
    assert "n = 2 seeds per arm" in md  # the tables hold the final seeds only
    assert _main(t5.main, argv) == 0 and len(_cells(tmp_path / "table5_gpt2.jsonl")) == 4  # a rerun: nothing new


def test_table6_decide_declares_its_grid_arms_and_splits(capsys):
    tuning = t6.TUNING["decide"]
    assert len(tuning.lrs) == 3 and len(tuning.weight_decays) == 2 and len(tuning.tune_seeds) == 2
    assert tuning.seeds == tuple(range(10)) and tuning.shared == {"lr": 2e-3, "weight_decay": 0.05}
    assert t6.DECIDE_ARMS == ("mha", "dcmha", "damcha", "mha_pm", "mha_ctx", "damcha_bm")
    data = load_data(t6.PRESETS["decide"], holdout=t6.VAL_HOLDOUT["decide"])
    assert data.validator is not None and data.n_train + data.n_val < 1797  # the validation split is carved out
    assert t6.main(["--preset", "decide", "--dry-run", "--out", "/nonexistent/t6"]) == 0
    assert "would run: 222" in capsys.readouterr().out  # 6 arms × (12 tuning + 10 tuned + 10 shared + 5 runner-up)


def test_table6_tiny_decide_tunes_on_validation_then_runs_the_seeds_at_the_choice(tmp_path, monkeypatch):
    monkeypatch.setitem(t6.TUNING, "decide", Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.05,), tune_seeds=(1000,),
                                                    seeds=(0, 1), shared={"lr": 2e-3, "weight_decay": 0.05}))
    argv = ["--preset", "decide", "--variants", "mha,damcha", "--seeds", "0", "1", "--steps", "4", "--jobs", "1",
            "--quiet", "--out", str(tmp_path)]
    assert _main(t6.main, argv) == 0
    cells = _cells(tmp_path / "table6_vit.jsonl")
    by = {p: [c for c in cells if c["cell"]["phase"] == p] for p in ("tune", "tuned", "shared")}
    assert [len(v) for v in by.values()] == [4, 4, 4]
    assert all({r["metric"] for r in c["rows"]} & {"top1", "test_loss", "chance_top1", "top1@budget"} == set()
               for c in by["tune"])
    for c in by["tuned"] + by["shared"]:  # top-1 of the best checkpoint so far at budget fractions
        budget = {r["budget"]: r["value"] for r in c["rows"] if r["metric"] == "top1@budget"}
        assert sorted(budget) == [0.125, 0.25, 0.5, 1.0]
        assert budget[1.0] == next(r["value"] for r in c["rows"] if r["metric"] == "top1")
    for arm in ("mha", "damcha"):
        val = {c["cell"]["lr"]: next(r["value"] for r in c["rows"] if r["metric"] == "val_loss")
               for c in by["tune"] if c["cell"]["variant"] == arm}
        assert {c["cell"]["lr"] for c in by["tuned"] if c["cell"]["variant"] == arm} == {min(val, key=val.get)}
    md = (tmp_path / "table6_vit.md").read_text()
    assert "## Tuning" in md and "## Calibration: top1 vs the trivial predictor" in md
    assert "## Secondary: every arm at the shared setting" in md and "n = 2 seeds per arm (seeds 0, 1)" in md


def test_generation_decide_presets_declare_their_grid_arms_and_held_out_scoring():
    from attention_zoo.experiments.generation import decide
    from attention_zoo.experiments.generation import table1_generation as t1
    from attention_zoo.experiments.generation import table3_depth_blocks as t3
    from attention_zoo.experiments.generation import table4_ablation as t4
    from attention_zoo.experiments.generation.config import PRESETS
    from attention_zoo.experiments.generation.data import DataOptions, load_data

    tuning = decide.TUNING
    assert len(tuning.lrs) == 3 and len(tuning.weight_decays) == 2 and len(tuning.tune_seeds) == 2
    assert min(tuning.lrs) < 2e-3 < max(tuning.lrs)  # the smoke setting lies inside the grid, not on its edge
    assert tuning.seeds == tuple(range(10)) and 0.0 in tuning.weight_decays  # the authors' weight decay
    assert tuning.extend >= 1 and len(tuning.runner_up_seeds) >= 5  # edges extended; the robustness column's seeds
    assert t1.DECIDE_ARMS.split(",") == ["mha", "tha", "dcmha", "colmha", "mma", "moa", "damcha", "mha_ctx",
                                         "mha_pm", "mha_cm"]
    p = PRESETS["decide"]
    for train in (p.image_train, p.text_train):  # a plateau at a constant lr; max_steps a cap
        assert train["patience"] and train["eval_every"] and train["max_steps"] >= 4000
        assert train["min_lr_ratio"] == 1.0
    assert p.budget_fracs == (0.125, 0.25, 0.5, 1.0) and p.scored_fraction >= 0.5
    for mod in (t1, t3, t4):
        assert mod.build_parser().parse_args(["--preset", "decide"]).seeds == list(range(10))
    whole, held = (load_data("concepts", DataOptions(scored_holdout=h, scored_fraction=p.scored_fraction if h
                                                     else None)) for h in (False, True))
    assert len(held.val_set) + len(held.heldout_set) == len(whole.val_set)  # selection and scoring never overlap
    assert held.eval_pairs[0] != whole.eval_pairs[0]  # the scored items come from the later part
    digits = load_data("digits", DataOptions(scored_holdout=True, scored_fraction=p.scored_fraction))
    assert len(digits.heldout_set) >= 300 and len(held.heldout_set) >= 300  # every scored item, not 64


def test_table1_tiny_decide_runs_the_grid_then_the_choice(tmp_path, monkeypatch):
    from attention_zoo.experiments.generation import decide
    from attention_zoo.experiments.generation import table1_generation as t1

    monkeypatch.setattr(decide, "TUNING", Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.0,), tune_seeds=(1000,),
                                                 seeds=(0, 1)))
    argv = ["--preset", "decide", "--variants", "mha", "--datasets", "digits", "--seeds", "0", "1", "--steps", "2",
            "--eval-samples", "8", "--fid-extractor", "tiny-random", "--image-size", "16", "--jobs", "1", "--quiet",
            "--out", str(tmp_path)]
    assert _main(t1.main, argv) == 0
    cells = _cells(tmp_path / "table1_generation.jsonl")
    tune = [c for c in cells if c["cell"]["phase"] == "tune"]
    final = [c for c in cells if c["cell"]["phase"] == "tuned"]
    assert len(tune) == 2 and len(final) == 2
    assert all({r["metric"] for r in c["rows"]} == {"val_loss"} for c in tune)  # nothing scored on held-out items
    val = {c["cell"]["lr"]: c["rows"][0]["value"] for c in tune}
    assert {c["cell"]["lr"] for c in final} == {min(val, key=val.get)}
    assert all({"mse", "mse_q90", "mse_se", "n_scored", "trivial_val_loss", "steps_run", "best_step", "max_steps",
                "mse@budget"} <= {r["metric"] for r in c["rows"]} for c in final)
    assert all(sorted(r["budget"] for r in c["rows"] if r["metric"] == "mse@budget") == [0.125, 0.25, 0.5, 1.0]
               for c in final)
    md = (tmp_path / "table1_generation.md").read_text()
    assert "## Tuning" in md and "## Calibration: val_loss vs the trivial predictor" in md
