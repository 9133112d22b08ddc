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
