"""``--ensemble`` in the decide presets (experiments.ensemble_units): one arm's cells of one phase train as one grouped
model and store what the cells give one at a time (float32: to rounding), in the same cells (the flag is not part
of a cell's identity); an arm that cannot be grouped falls back and its rows say why."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from attention_zoo.experiments.lm import table5_gpt2 as t5
from attention_zoo.experiments.tuning import Tuning
from attention_zoo.experiments.vision import table6_vit as t6

TINY = Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.1,), tune_seeds=(1000,), seeds=(0, 1))


def _main(main, argv):
    threads = torch.get_num_threads()
    try:
        return main(argv)
    finally:
        torch.set_num_threads(threads)


def _values(path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") != "cell":
            continue
        c = rec["cell"]
        key = tuple(str(c.get(k)) for k in ("variant", "phase", "seed", "lr", "weight_decay", "setting"))
        for r in rec["rows"]:
            if isinstance(r.get("value"), (int, float)) and "time" not in r["metric"] and "_per_s" not in r["metric"] \
                    and "rss" not in r["metric"]:
                out[key + (r["metric"], str(r.get("budget")), str(r.get("inference")))] = (
                    r["value"], r.get("ensemble"), r.get("ensemble_reason"))
    return out


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        x, y = a[k][0], b[k][0]
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=2e-3, abs=1e-4), k


def test_table5_decide_ensemble_equals_one_at_a_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(t5.TUNING, "decide", TINY)
    argv = ["--preset", "decide", "--variants", "mha,moa", "--seeds", "0", "1", "--steps", "6", "--eval-batches", "1",
            "--train", "eval_every=2", "patience=2", "eval_max_batches=1", "--jobs", "1", "--quiet"]
    assert _main(t5.main, [*argv, "--dry-run", "--ensemble", "--out", str(tmp_path / "g")]) == 0
    assert "8 cell(s)" in (out := capsys.readouterr().out) and "4 unit(s)" in out  # (arm, phase) groups
    assert _main(t5.main, [*argv, "--ensemble", "--out", str(tmp_path / "g")]) == 0
    assert _main(t5.main, [*argv, "--out", str(tmp_path / "one")]) == 0
    grouped, one = _values(tmp_path / "g" / "table5_gpt2.jsonl"), _values(tmp_path / "one" / "table5_gpt2.jsonl")
    _same(grouped, one)
    assert {v[1] for v in grouped.values()} == {2} and {v[1] for v in one.values()} == {None}
    runs = [p.name for p in (tmp_path / "g" / "runs").iterdir()]
    assert not any(n.startswith("group-") for n in runs)  # a finished group leaves no checkpoint behind
    # the flag is not part of a cell's identity: a rerun either way computes nothing
    assert _main(t5.main, [*argv, "--no-ensemble", "--out", str(tmp_path / "g")]) == 0
    assert _values(tmp_path / "g" / "table5_gpt2.jsonl") == grouped


def test_table5_ensemble_falls_back_per_arm_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setitem(t5.TUNING, "decide", TINY)
    monkeypatch.setitem(t5.PRESETS, "decide", dataclasses.replace(t5.PRESETS["decide"], dropout=0.1))
    argv = ["--preset", "decide", "--variants", "mha", "--seeds", "0", "1", "--steps", "4", "--eval-batches", "1",
            "--train", "eval_every=2", "eval_max_batches=1", "--jobs", "1", "--quiet", "--ensemble",
            "--out", str(tmp_path)]
    assert _main(t5.main, argv) == 0
    got = _values(tmp_path / "table5_gpt2.jsonl")
    assert {v[1] for v in got.values()} == {1}
    reasons = {v[2] for v in got.values()}
    assert len(reasons) == 1 and "random" in reasons.pop()


def test_table6_decide_ensemble_equals_one_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setitem(t6.TUNING, "decide", Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.05,), tune_seeds=(1000,),
                                                    seeds=(0, 1), shared={"lr": 2e-3, "weight_decay": 0.05}))
    argv = ["--preset", "decide", "--variants", "damcha", "--seeds", "0", "1", "--steps", "4", "--jobs", "1",
            "--quiet"]
    assert _main(t6.main, [*argv, "--ensemble", "--out", str(tmp_path / "g")]) == 0
    assert _main(t6.main, [*argv, "--out", str(tmp_path / "one")]) == 0
    grouped, one = _values(tmp_path / "g" / "table6_vit.jsonl"), _values(tmp_path / "one" / "table6_vit.jsonl")
    _same(grouped, one)
    assert {v[1] for v in grouped.values()} == {2}


def test_table4_decide_ensemble_equals_one_at_a_time(tmp_path, monkeypatch):
    from attention_zoo.experiments.generation import decide
    from attention_zoo.experiments.generation import table4_ablation as t4

    monkeypatch.setattr(decide, "TUNING", Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.0,), tune_seeds=(1000,),
                                                 seeds=(0, 1)))
    argv = ["--preset", "decide", "--datasets", "digits", "--settings", "full,no_fx", "--seeds", "0", "1", "--steps",
            "4", "--train", "eval_every=2", "--eval-samples", "8", "--fid-extractor", "tiny-random", "--image-size",
            "16", "--jobs", "1", "--quiet"]
    assert _main(t4.main, [*argv, "--ensemble", "--out", str(tmp_path / "g")]) == 0
    assert _main(t4.main, [*argv, "--out", str(tmp_path / "one")]) == 0
    grouped, one = (_values(tmp_path / d / "table4_ablation.jsonl") for d in ("g", "one"))
    _same(grouped, one)
    assert {v[1] for v in grouped.values()} == {2}


def test_text_cells_fall_back_to_one_at_a_time_and_say_why(tmp_path, monkeypatch):
    """Text batches are padded to their own longest pair, so members' batches differ in length and cannot be stacked:
    a Table 1 concepts unit trains one cell at a time (it failed the whole unit before) and its rows say why."""
    from attention_zoo.data.sampling import IndexSampler
    from attention_zoo.data.seq2seq import Seq2SeqSampler
    from attention_zoo.engine.ensemble import EnsembleUnsupported
    from attention_zoo.engine.members import check_samplers
    from attention_zoo.experiments.generation import decide
    from attention_zoo.experiments.generation import table1_generation as t1

    assert IndexSampler.fixed_shape and not Seq2SeqSampler.fixed_shape
    with pytest.raises(EnsembleUnsupported, match="Seq2SeqSampler"):
        check_samplers([Seq2SeqSampler.__new__(Seq2SeqSampler)])
    monkeypatch.setattr(decide, "TUNING", Tuning(lrs=(1e-3, 4e-3), weight_decays=(0.0,), tune_seeds=(1000,),
                                                 seeds=(0, 1)))
    argv = ["--preset", "decide", "--datasets", "concepts", "--variants", "mha", "--seeds", "0", "1", "--steps", "3",
            "--train", "eval_every=2", "--eval-samples", "8", "--jobs", "1", "--quiet", "--ensemble",
            "--out", str(tmp_path)]
    assert _main(t1.main, argv) == 0
    got = _values(tmp_path / "table1_generation.jsonl")
    assert got and {v[1] for v in got.values()} == {1}
    reasons = {v[2] for v in got.values()}
    assert len(reasons) == 1 and "differ in length" in reasons.pop()
