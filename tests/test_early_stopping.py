"""Early stopping in the training engine (TrainConfig.patience, in steps since the best evaluation): the run stops,
its best evaluation stays in best.pt, a resumed early-stopped run trains no further, and stores written before the
field existed keep their keys."""

import numpy as np
import pytest
import torch

from attention_zoo.data.text import WindowEvaluator, WindowSampler
from attention_zoo.engine import TrainConfig, result_identity, train
from attention_zoo.io import read_jsonl
from attention_zoo.models import Decoder

STREAM = np.random.default_rng(0).integers(0, 16, 4000).astype(np.uint8)


def _run(out, **kw):
    cfg = TrainConfig(**{**dict(max_steps=60, batch_size=4, lr=3e-2, warmup_steps=0, eval_every=2,
                                eval_max_batches=1, progress=False, log_every=1), **kw})
    torch.manual_seed(0)
    model = Decoder(16, 16, 1, 2, max_seq_len=16)
    return train(model, cfg, WindowSampler([STREAM], 16, 4, seed=1), out,
                 {"val": WindowEvaluator(STREAM[:200], 16, 4)}, resume="auto")


def test_a_run_stops_patience_steps_after_its_best_evaluation(tmp_path):
    res = _run(tmp_path, patience=4)  # random tokens: the validation loss stops improving early
    assert res.status == "ok" and res.step < 60 and res.step - res.best_step >= 4
    events = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r.get("event") == "early_stop"]
    assert len(events) == 1 and events[0]["best_step"] == res.best_step
    assert (tmp_path / "checkpoints" / "best.pt").is_file()
    again = _run(tmp_path, patience=4)  # resumed from the early-stop checkpoint: finished, no more steps
    assert again.step == res.step


def test_patience_needs_evaluations_and_is_left_out_of_old_identities():
    with pytest.raises(ValueError, match="patience"):
        TrainConfig(patience=10, eval_every=0)
    assert "patience" not in result_identity(TrainConfig().to_dict())
    assert result_identity(TrainConfig(patience=10, eval_every=5).to_dict())["patience"] == 10


def _budget_run(out, fracs=(0.25, 0.5, 1.0), **kw):
    """A run whose budget scorer evaluates a held-out stream (the test split's role)."""
    held_out = WindowEvaluator(STREAM[200:600], 16, 4)
    calls = []

    def score(net):
        from attention_zoo.engine import evaluate

        calls.append(1)
        return {"test": evaluate(net, held_out(None))}

    cfg = TrainConfig(**{**dict(max_steps=40, batch_size=4, lr=3e-2, warmup_steps=0, eval_every=3,
                                eval_max_batches=1, progress=False, log_every=1), **kw})
    torch.manual_seed(0)
    model = Decoder(16, 16, 1, 2, max_seq_len=16)
    res = train(model, cfg, WindowSampler([STREAM], 16, 4, seed=1), out,
                {"val": WindowEvaluator(STREAM[:200], 16, 4)}, resume="auto", budget_fracs=fracs,
                budget_score=score)
    return res, model, held_out, len(calls)


def test_budget_scores_read_the_best_checkpoint_so_far_and_leave_the_run_unchanged(tmp_path):
    from attention_zoo.engine import evaluate

    res, model, held_out, calls = _budget_run(tmp_path / "a")
    plain, plain_model, _, _ = _budget_run(tmp_path / "b", fracs=())
    # the scoring swaps weights in and back and draws nothing from the RNG: the same run to the last bit
    assert res.step == plain.step == 40 and res.best_step == plain.best_step and res.best_eval == plain.best_eval
    for a, b in zip(model.state_dict().values(), plain_model.state_dict().values()):
        assert torch.equal(a, b)
    assert plain.budget is None and sorted(res.budget) == [0.25, 0.5]  # 1.0 is the caller's final
    # a fraction whose best checkpoint is the previous fraction's reuses its scores: one scoring per checkpoint
    assert calls == len({best_step for best_step, _ in res.budget.values()})
    evals = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if r.get("event") == "eval"]
    at = {}
    for frac, (best_step, scores) in res.budget.items():
        budget_step = round(frac * 40)
        seen = [r for r in evals if r["step"] <= budget_step]
        assert best_step == min(seen, key=lambda r: r["loss"])["step"]  # validation picks it, never the scorer
        if best_step not in at:  # the weights of that step, from a run stopped there (stop_at keeps the schedule)
            at[best_step] = _budget_run(tmp_path / f"stop{best_step}", fracs=(), stop_at=best_step)[1]
        assert scores["test"] == pytest.approx(evaluate(at[best_step], held_out(None)), rel=1e-6)


def test_budget_scores_survive_a_resume(tmp_path):
    whole, _, _, _ = _budget_run(tmp_path / "whole")
    first, _, _, _ = _budget_run(tmp_path / "cut", stop_at=15)  # after the 0.25 budget (step 10), before 0.5
    assert first.status == "interrupted" and sorted(first.budget) == [0.25]
    rest, _, _, calls = _budget_run(tmp_path / "cut")  # resumed: 0.25 comes from the checkpoint, 0.5 is scored
    assert rest.budget.keys() == whole.budget.keys()
    assert calls == int(rest.budget[0.5][0] != rest.budget[0.25][0])  # the same best checkpoint is not re-scored
    for f in whole.budget:
        assert rest.budget[f][0] == whole.budget[f][0]
        assert rest.budget[f][1]["test"] == pytest.approx(whole.budget[f][1]["test"], rel=1e-6)


@pytest.mark.parametrize("bad", [(0.0,), (1.5,), ("half",), (True,)])
def test_budget_fractions_are_checked(tmp_path, bad):
    with pytest.raises(ValueError, match="^budget_fracs:"):
        _budget_run(tmp_path, fracs=bad)


def _slow_run(out, **kw):
    """A learnable stream (a repeated pattern) at a small rate: the validation loss keeps improving a little."""
    pattern = np.tile(np.arange(16, dtype=np.uint8), 300)
    cfg = TrainConfig(**{**dict(max_steps=80, batch_size=4, lr=2e-3, warmup_steps=0, eval_every=2, min_lr_ratio=0.0,
                                eval_max_batches=1, progress=False, log_every=1), **kw})
    torch.manual_seed(0)
    model = Decoder(16, 16, 1, 2, max_seq_len=16)
    return train(model, cfg, WindowSampler([pattern], 16, 4, seed=1), out,
                 {"val": WindowEvaluator(pattern[:200], 16, 4)}, resume="auto")


def test_min_delta_stops_on_a_plateau_and_keeps_the_lowest_checkpoint(tmp_path):
    base = _slow_run(tmp_path / "a", patience=6)
    plateau = _slow_run(tmp_path / "b", patience=6, min_delta=0.05)  # improvements below 5 % do not reset it
    assert plateau.step < base.step
    evals = [r for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if r.get("event") == "eval"]
    assert plateau.best_eval == min(r["loss"] for r in evals)  # the best checkpoint is still the lowest evaluation
    resumed = _slow_run(tmp_path / "b", patience=6, min_delta=0.05)
    assert resumed.step == plateau.step
    assert "min_delta" not in result_identity(TrainConfig().to_dict())
    with pytest.raises(ValueError, match="^min_delta"):
        TrainConfig(min_delta=-0.1)


def test_min_delta_in_a_grouped_run_stops_each_member_as_alone(tmp_path):
    from attention_zoo.engine.grouped import Member, train_grouped

    pattern = np.tile(np.arange(16, dtype=np.uint8), 300)
    cfg = TrainConfig(max_steps=80, batch_size=4, lr=2e-3, warmup_steps=0, eval_every=2, min_lr_ratio=0.0,
                      eval_max_batches=1, progress=False, log_every=1, patience=6, min_delta=0.05)
    alone, models, members = [], [], []
    for s in (0, 1):
        torch.manual_seed(s)
        m = Decoder(16, 16, 1, 2, max_seq_len=16).double()
        alone.append(train(m, cfg.replace(seed=s), WindowSampler([pattern], 16, 4, seed=s), tmp_path / f"a{s}",
                           {"val": WindowEvaluator(pattern[:200], 16, 4)}))
        torch.manual_seed(s)
        models.append(Decoder(16, 16, 1, 2, max_seq_len=16).double())
        members.append(Member(s, cfg.lr, cfg.weight_decay, WindowSampler([pattern], 16, 4, seed=s), tmp_path / f"g{s}"))
    got = train_grouped(models, members, cfg, tmp_path / "group", {"val": WindowEvaluator(pattern[:200], 16, 4)})
    assert [r.step for r in got] == [r.step for r in alone]
