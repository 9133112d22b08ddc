"""The training engine: exact resume (stop_at and a real SIGTERM), atomic/verified checkpoints, NaN stop, aux
losses, accumulation, config validation, and the Table 5 CLI end to end on a tiny budget."""

from __future__ import annotations

import math
import os
import signal
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from attention_zoo.data.text import WindowEvaluator, WindowSampler
from attention_zoo.engine import (
    CheckpointError,
    CheckpointManager,
    TrainConfig,
    evaluate,
    lm_loss,
    load_checkpoint,
    lr_factor,
    parse_overrides,
    save_checkpoint,
    train,
)
from attention_zoo.experiments.lm import table5_gpt2 as table5_gpt2
from attention_zoo.io import read_jsonl
from attention_zoo.models import Decoder, ModelOutput

STREAM = np.random.default_rng(0).integers(0, 16, 4000).astype(np.uint8)


def _model(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(16, 16, 1, 2, max_seq_len=16, dropout=0.1)  # dropout: the RNG state must be restored too


def _cfg(**kw) -> TrainConfig:
    base = dict(max_steps=10, batch_size=4, lr=1e-2, warmup_steps=3, log_every=1, eval_every=4, eval_max_batches=2,
                ckpt_every=3, keep_last=2, progress=False)
    return TrainConfig(**{**base, **kw})


def _run(out, model=None, resume=None, sampler=None, **kw):
    sampler = sampler or WindowSampler([STREAM], 16, 4, seed=1)
    evals = {"val": WindowEvaluator(STREAM[:600], 16, 8)}
    return train(model or _model(), _cfg(**kw), sampler, out, evals, resume=resume)


def _losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl") if r["event"] == "train"}


def _evals(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl") if r["event"] == "eval"}


def test_resume_after_stop_reproduces_the_uninterrupted_run(tmp_path):
    full = _run(tmp_path / "a")
    assert full.status == "ok" and full.step == 10
    part = _run(tmp_path / "b", stop_at=5)
    assert part.status == "interrupted" and part.step == 5
    # A different init proves that weights, optimizer, schedule and RNG all come from the checkpoint.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same config: no "config differs" warning
        resumed = _run(tmp_path / "b", model=_model(seed=99), resume="auto")
    assert resumed.status == "ok" and resumed.step == 10
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")  # exact, every step
    assert _evals(tmp_path / "b") == _evals(tmp_path / "a")
    assert resumed.evals == full.evals and resumed.tokens_seen == full.tokens_seen == 10 * 4 * 16
    kept = [p.name for _, p in CheckpointManager(tmp_path / "b" / "checkpoints").step_checkpoints()]
    assert kept == ["step_00000010.pt", "step_00000009.pt"] and (tmp_path / "b" / "checkpoints" / "best.pt").exists()


def test_sigterm_checkpoints_and_resumes_exactly(tmp_path):
    sampler = WindowSampler([STREAM], 16, 4, seed=1)

    def sends_sigterm(step):
        if step == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by train(): finish the step, checkpoint, stop
        return sampler(step)

    part = _run(tmp_path / "b", sampler=sends_sigterm)
    assert part.status == "interrupted" and part.signal == signal.SIGTERM and part.step == 7
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert load_checkpoint(part.checkpoint)["step"] == 7
    _run(tmp_path / "b", model=_model(seed=5), resume="auto")
    _run(tmp_path / "a")
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")


def test_truncated_or_corrupt_checkpoint_is_never_loaded(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    good = mgr.save({"step": 1, "x": torch.arange(5)}, 1)
    newest = mgr.save({"step": 2, "x": torch.arange(5)}, 2)
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(newest)
    newest.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(newest)
    with pytest.warns(RuntimeWarning, match="skipping unreadable checkpoint"):
        path, state = mgr.resolve("auto")
    assert path == good and state["step"] == 1  # the previous good checkpoint still loads
    with pytest.raises(CheckpointError):
        mgr.resolve(newest)  # an explicit corrupt path is an error, not a fallback
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mgr.resolve(tmp_path / "missing.pt")  # never a silent restart
    (tmp_path / "bogus.pt").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="magic"):
        load_checkpoint(tmp_path / "bogus.pt")
    save_checkpoint(tmp_path / "c.pt", {"a": 1})
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # atomic: no temp file left


def test_nan_stops_cleanly_with_status_row_and_debug_checkpoint(tmp_path):
    calls = {"n": 0}

    def poisoned(batch, output):
        calls["n"] += 1
        loss = lm_loss(batch, output)
        return loss * math.nan if calls["n"] >= 4 else loss

    res = train(_model(), _cfg(eval_every=0), WindowSampler([STREAM], 16, 4, seed=1), tmp_path, loss_fn=poisoned)
    assert res.status == "nan" and res.step == 3
    status = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "status"]
    assert status[0]["status"] == "nan" and status[0]["step"] == 4
    assert status[0]["lr"] > 0 and not math.isfinite(status[0]["grad_norm"])
    debug = load_checkpoint(res.checkpoint)
    assert res.checkpoint.name == "nan_step_00000004.pt" and debug["nan"]["step"] == 4 and debug["step"] == 3
    assert all(torch.isfinite(v).all() for v in debug["model"].values())  # the bad update was not applied


class _AuxModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 16)
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return ModelOutput(self.emb(x), 0.5 * self.w**2)


def test_aux_loss_is_trained_but_not_evaluated(tmp_path):
    model = _AuxModel()
    res = train(model, _cfg(eval_every=0, eval_max_batches=None, max_steps=3, lr=0.1, warmup_steps=0),
                WindowSampler([STREAM], 16, 4),
                tmp_path, {"val": WindowEvaluator(STREAM[:300], 16, 8)})
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "train"]
    assert rows[0]["aux_loss"] == pytest.approx(0.5) and model.w.item() < 1.0  # aux gradients reach the model
    x, y = next(iter(WindowEvaluator(STREAM[:300], 16, 100)()))
    assert res.evals["val"] == pytest.approx(lm_loss((x, y), model(x)).item(), rel=1e-6)
    assert evaluate(model, [(x, y)]) == pytest.approx(res.evals["val"], rel=1e-6)


def test_grad_accumulation_matches_one_big_batch(tmp_path):
    kw = dict(eval_every=0, max_steps=3)
    m1, m2 = Decoder(16, 16, 1, 2, max_seq_len=16).double(), Decoder(16, 16, 1, 2, max_seq_len=16).double()
    m2.load_state_dict(m1.state_dict())
    sampler = WindowSampler([STREAM], 16, 4, seed=1)
    train(m1, _cfg(**kw), sampler, tmp_path / "a")
    train(m2, _cfg(grad_accum=2, **kw), sampler, tmp_path / "b")
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p1, p2, rtol=1e-9, atol=1e-10)


def test_config_validation_and_schedule():
    for bad, field in (({"lr": -1.0}, "lr"), ({"max_steps": 0}, "max_steps"), ({"amp": "fp8"}, "amp"),
                       ({"batch_size": 6, "grad_accum": 4}, "batch_size"), ({"stop_at": 0}, "stop_at")):
        with pytest.raises(ValueError, match=f"^{field}"):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match="unknown"):
        TrainConfig.from_dict({"learning_rate": 1e-3})
    assert parse_overrides(["lr=1e-3", "amp=off", "stop_at=None", "grad_accum=2", "progress=false"]) == {
        "lr": 1e-3, "amp": "off", "stop_at": None, "grad_accum": 2, "progress": False}
    with pytest.raises(ValueError, match="max_steps"):
        parse_overrides(["max_steps=1.5"])
    cfg = TrainConfig(max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0) and lr_factor(100, cfg) == pytest.approx(0.1)


@pytest.fixture
def keep_threads():
    """The CLI sets torch's (process-wide) thread count; give the rest of the session its own back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_table5_cli_smoke_skip_and_nan_exit(tmp_path, capsys, keep_threads):
    args = ["--preset", "smoke", "--variants", "mha", "--max-steps", "3", "--eval-batches", "1", "--quiet",
            "--out", str(tmp_path), "--train", "eval_every=2", "eval_max_batches=1"]
    assert table5_gpt2.main(args) == 0
    for name in ("table5_gpt2.md", "table5_gpt2_long.csv", "table5_gpt2_wide.csv", "table5_gpt2.env.json"):
        assert (tmp_path / name).is_file(), name
    assert "T5.mix" in (tmp_path / "table5_gpt2.md").read_text()  # the verdict rows, "not run" without DAMCHA
    df = pd.read_csv(tmp_path / "table5_gpt2_long.csv")
    test_bpc = df[(df.metric == "test_bpc")].value.item()
    assert 0 < test_bpc < 7 and df[df.metric == "tokens_seen"].value.item() == 3 * 16 * 64
    # the learned-at-all gate's reference: a unigram model of Shakespeare's characters (≈ 3.3 nats)
    assert 2.5 < df[df.metric == "trivial_loss"].value.item() < 4.5
    assert "tables and plots in" in capsys.readouterr().out
    mtime = (tmp_path / "table5_gpt2.jsonl").stat().st_mtime_ns
    assert table5_gpt2.main(args) == 0  # finished cell: skipped, not retrained
    assert (tmp_path / "table5_gpt2.jsonl").stat().st_mtime_ns == mtime
    nan_out = tmp_path / "nan"
    assert table5_gpt2.main([*args[:-3], "--out", str(nan_out), "--train", "lr=1e30"]) == 1
    (rec,) = [r for r in read_jsonl(nan_out / "table5_gpt2.jsonl") if r["kind"] == "cell"]
    assert {r["status"] for r in rec["rows"]} == {"nan"} and list(nan_out.glob("runs/*/checkpoints/nan_step_*.pt"))
