"""The scale ladder (experiments/scaling): its presets meet issue 54's design, a tiny run stores what the issue asks
per cell and renders its report, the dry run prices the decide ladder, and the ladder's claims decide from a store."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attention_zoo.claims import decide, get_claim
from attention_zoo.claims.data import StoreRows
from attention_zoo.claims.ledger import LADDER_ARMS, LADDER_TOP
from attention_zoo.experiments.scaling import ladder
from attention_zoo.experiments.scaling.presets import ARMS, CORE, PRESETS, tuning
from attention_zoo.measure.flops import analytic_flops
from attention_zoo.models import Decoder

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("variant", "flavor", "d_model", "n_layers", "seed", "phase", "lr", "weight_decay", "train_flops",
           "train_cpu_s", "tokens", "steps_run", "best_step", "max_steps", "val_loss", "test_loss", "trivial_loss",
           "stop_reason")


def test_the_decide_ladder_meets_the_issue():
    preset = PRESETS["decide"]
    flops = {}
    for rung in preset.rungs:
        steps = ladder.rung_steps(preset, rung, 84)
        model = Decoder(84, rung.d_model, rung.n_layers, rung.n_heads, attention="mha", max_seq_len=preset.context)
        flops[rung.d_model] = 3 * analytic_flops(model, preset.batch_size, preset.context) * steps
        t = tuning("decide", rung, (0, 1, 2, 3, 4))
        assert len(t.lrs) >= 3 and t.extend >= 1 and len(t.tune_seeds) == 2 and len(t.seeds) >= 5
        assert set(CORE) <= set(rung.arms or ARMS)
    assert len(preset.rungs) >= 4 and max(flops.values()) / min(flops.values()) >= 10
    assert sum(rung.arms is None for rung in preset.rungs) >= 3  # all seven variants (and mha_pm) on >= 3 rungs
    table5 = next(r for r in preset.rungs if (r.d_model, r.n_layers) == (64, 2))  # Table 5's decide shape is a rung
    assert table5.n_heads == 4 and table5.attention_options() == {"hidden_dims": (128, 128), "compact_rank": 4}
    assert (preset.context, preset.batch_size) == (64, 16)
    assert (preset.rungs[-1].d_model, preset.rungs[-1].n_layers) == LADDER_TOP  # T5.mix's rung is the largest
    assert set(LADDER_ARMS) == set(ARMS) - {"mha"}


def test_a_rungs_schedule_follows_its_budget():
    preset = PRESETS["decide"]
    steps = preset.max_steps(110_000)  # ≈ MHA at D 64: 20 tokens per parameter in batches of 16 × 64
    assert steps >= 20 * 110_000 / 1024 and steps % preset.schedule(steps)["eval_every"] == 0
    cfg = preset.schedule(steps)
    assert cfg["patience"] == 4 * cfg["eval_every"] and cfg["max_steps"] == steps


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "ATTENTION_ZOO_FINGERPRINT": "0"}
    proc = subprocess.run([sys.executable, str(ROOT / "reproduce" / "scaling.py"), "--preset", "smoke", "--out",
                           str(out), "--variants", "mha,damcha", "--rungs", "16", "24", "--quiet", "--jobs", "2"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_a_tiny_ladder_stores_what_the_issue_asks_per_cell(tiny_run):
    long = pd.read_csv(tiny_run / "scaling_long.csv")
    assert set(COLUMNS) <= set(long.columns)
    cells = pd.read_csv(tiny_run / "scaling_cells.csv")
    final = cells[cells["phase"] == "tuned"]
    assert set(final["variant"]) == {"mha", "damcha"} and set(final["d_model"]) == {16, 24}
    assert final["test_loss"].notna().all() and cells.loc[cells["phase"] == "tune", "test_loss"].isna().all()
    assert set(cells["stop_reason"]) <= {"patience", "token_budget"}
    assert (cells["best_step"] <= cells["steps_run"]).all() and (cells["steps_run"] <= cells["max_steps"]).all()
    fwd = long[long["metric"] == "fwd_flops_per_step"].drop_duplicates(["variant", "d_model", "seed", "phase", "lr"])
    merged = fwd.merge(cells, on=["variant", "d_model", "seed", "phase", "lr"], suffixes=("", "_cell"))
    assert np.allclose(merged["train_flops_cell"], 3 * merged["value"] * merged["best_step_cell"])
    assert (cells["train_cpu_s"] > 0).all()
    for name in ("scaling.md", "scaling_loss_vs_compute.png", "scaling_multipliers.png"):
        assert (tiny_run / name).is_file(), name
    text = (tiny_run / "scaling.md").read_text()
    assert "Compute multiplier over MHA (FLOPs reading)" in text and "Tuning at D16×1" in text


def test_the_probe_runs_a_ladder_cell(tiny_run):
    from attention_zoo.experiments.fingerprint import arms_of, fingerprint_arms
    from attention_zoo.results import ResultStore

    recs = [r for r in ResultStore(tiny_run, "scaling", None).records(every_context=True)]
    arms = arms_of("scaling", [r["cell"] for r in recs])
    assert {a["variant"] for a in arms} == {"mha", "damcha"} and any(a["phase"] == "tune" for a in arms)
    got = fingerprint_arms("scaling", arms[:1], {"preset": "smoke"})
    assert got and all(v for v in got.values())


def test_the_dry_run_prices_the_decide_ladder(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "reproduce" / "scaling.py"), "--preset", "decide", "--out",
                           str(tmp_path / "d"), "--dry-run"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "priced" in proc.stdout and "CPU-h" in proc.stdout and "D128×2: 8128 steps, 44 cells" in proc.stdout
    hours = float(proc.stdout.split("CPU-h ≈ ")[-1].split(" h on")[0])
    assert hours <= 10.0  # with one grid extension per arm and rung, on the calibration's (loaded) timings
    assert not (tmp_path / "d").exists()


def _ladder_frame(mult: float, seeds: int = 6, damcha_gap=(0.20, 0.12, 0.06, 0.02)) -> pd.DataFrame:
    """MHA on L = 1.2 + 2e5·C^-0.45; dcmha on the same curve at ``mult`` × its compute; damcha ``damcha_gap`` nats
    above MHA's curve at its compute."""
    rng, rows = np.random.default_rng(3), []
    for r, d in enumerate((32, 48, 64, LADDER_TOP[0])):
        c = 1e12 * 3.16 ** r
        for s in range(seeds):
            for arm, loss in (("mha", 1.2 + 2e5 * c ** -0.45), ("dcmha", 1.2 + 2e5 * (mult * c) ** -0.45),
                              ("damcha", 1.2 + 2e5 * c ** -0.45 + damcha_gap[r])):
                for metric, value in (("test_loss", loss * (1 + 0.002 * rng.standard_normal())),
                                      ("train_flops", c), ("best_cpu_s", c / 1e10), ("trivial_loss", 3.3)):
                    rows.append({"variant": arm, "flavor": "paper", "d_model": d, "n_layers": LADDER_TOP[1],
                                 "seed": s, "metric": metric, "value": value, "status": "ok", "phase": "tuned",
                                 "dataset": "shakespeare", "eval_set": "shakespeare"})
    return pd.DataFrame(rows)


def _verdicts(frame: pd.DataFrame, ids: tuple[str, ...]) -> dict:
    stores = {("scaling", "decide"): StoreRows(frame, Path("x.jsonl"), "ctx", ["run"], ["abc"])}
    return {v.claim.id: v for v in decide(stores, tuple(get_claim(i) for i in ids))}


def test_the_ladder_claims_decide_from_a_store():
    got = _verdicts(_ladder_frame(2.4), ("DC.compute", "S.mult_dcmha", "S.gap_trend", "S.mult_damcha"))
    assert got["DC.compute"].kind == "supported", got["DC.compute"].ours  # 2.4× against the claimed 1.7×
    assert got["S.mult_dcmha"].kind == "supported"
    assert got["S.gap_trend"].kind == "supported", got["S.gap_trend"].ours  # 0.20 → 0.02 nats: closing
    assert got["S.mult_damcha"].kind == "contradicted"  # always behind MHA at equal compute
    assert "CPU-seconds reading" in got["DC.compute"].ours and "D32×2" in got["DC.compute"].ours
    weak = _verdicts(_ladder_frame(1.2), ("DC.compute",))["DC.compute"]
    assert weak.verdict.startswith("contradicted: dcmha worth less than 1.7×")


def test_fewer_than_five_seeds_decide_nothing():
    got = _verdicts(_ladder_frame(2.4, seeds=3), ("DC.compute", "S.gap_trend"))
    assert all(v.verdict.startswith("not decidable at n = 3") for v in got.values())
    assert math.isfinite(got["DC.compute"].n)
