"""The baselines' stand-ins (issue 55): the MQAR generator and the masked character LM follow their rules, MQAR's loss
serves gradients and the error score, the experiments run end to end (tuned decide preset included) and store what
the claims read, arms are selected by paper and matched controls solved, and the dry run prices cells from the
calibration."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from attention_zoo.data.masked import MaskedEvaluator, MaskedSampler, mask_windows, n_masked, unigram_loss
from attention_zoo.data.mqar import IGNORE, MQARSampler, MQARSpec, accuracy, mqar_batch, mqar_examples
from attention_zoo.experiments.arm_plan import select_arms
from attention_zoo.experiments.arms import ArmSpec, build_decoder, matched_d_ff, model_costs
from attention_zoo.experiments.mqar.task import QueryLoss
from attention_zoo.results import read_records


# ---- MQAR ----------------------------------------------------------------------------------------------------------
def test_mqar_sequences_follow_zoologys_rules():
    spec = MQARSpec(64, 32, 4)
    x, y = mqar_batch(spec, 200, np.random.default_rng(0))
    assert x.shape == y.shape == (200, 32)
    keys, values = x[:, 0:8:2], x[:, 1:8:2]
    assert ((keys >= 1) & (keys < 32)).all() and ((values >= 32) & (values < 64)).all()
    for row_k, row_v in zip(keys, values):
        assert len(set(row_k.tolist())) == 4 and len(set(row_v.tolist())) == 4  # no repetition inside a sequence
    for i in range(200):
        q = (y[i] != IGNORE).nonzero().flatten()
        assert len(q) == 4 and ((q - 8) % 2 == 0).all() and (q >= 8).all()  # one query per key, on slot starts
        for pos in q:  # the query is its key, the target the value that followed it
            k = int(x[i, pos])
            j = keys[i].tolist().index(k)
            assert int(y[i, pos]) == int(values[i, j])
        others = torch.ones(32, dtype=torch.bool)
        others[:8] = False
        others[q] = False
        assert (x[i, others] == 0).all()
    # the power law puts most queries in the first slots
    slots = ((y != IGNORE).nonzero()[:, 1] - 8) // 2
    assert (slots == 0).float().mean() > 0.2
    assert spec.chance_accuracy == 0.25


def test_mqar_batches_are_addressable_and_the_sets_fixed():
    spec = MQARSpec(128, 64, 8)
    a, b = MQARSampler(spec, 4, seed=3), MQARSampler(spec, 4, seed=3)
    assert torch.equal(a(7)[0], b(7)[0]) and not torch.equal(a(7)[0], a(8)[0])
    assert not torch.equal(a(7)[0], MQARSampler(spec, 4, seed=4)(7)[0])
    assert torch.equal(mqar_examples(spec, 5, 1)[0], mqar_examples(spec, 5, 1)[0])
    with pytest.raises(ValueError, match="^sampler"):
        a.load_state_dict({**a.state_dict(), "seed": 9})


@pytest.mark.parametrize("kw, option", [({"vocab_size": 7}, "vocab_size"), ({"seq_len": 12}, "seq_len"),
                                        ({"n_pairs": 0}, "n_pairs"), ({"vocab_size": 8, "n_pairs": 4}, "n_pairs"),
                                        ({"power_a": 0.0}, "power_a")])
def test_mqar_spec_refuses_bad_rungs(kw, option):
    with pytest.raises(ValueError, match=f"^{option}:"):
        MQARSpec(**{"vocab_size": 64, "seq_len": 32, "n_pairs": 4, **kw})


def test_query_loss_is_cross_entropy_for_gradients_and_the_error_rate_for_scores():
    y = torch.full((2, 5), IGNORE)
    y[0, 1], y[1, 3] = 2, 4
    logits = torch.zeros(2, 5, 6)
    logits[0, 1, 2] = 5.0  # right
    logits[1, 3, 0] = 5.0  # wrong
    out = type("O", (), {"logits": logits.requires_grad_()})()
    with torch.enable_grad():
        ce = QueryLoss()((None, y), out)
    assert ce.requires_grad and ce.item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits[y != IGNORE], y[y != IGNORE]).item())
    with torch.no_grad():
        assert QueryLoss()((None, y), out).item() == 0.5
    assert accuracy(logits, y) == (1, 2)


# ---- masked LM -----------------------------------------------------------------------------------------------------
def test_masked_windows_mask_an_exact_count_and_score_only_there():
    windows = np.arange(40, dtype=np.uint8).reshape(2, 20) % 7
    x, y = mask_windows(windows, 3, 9, np.random.default_rng(0))
    assert ((x == 9).sum(1) == 3).all() and ((y != -100).sum(1) == 3).all()
    assert torch.equal(y[y != -100], torch.from_numpy(windows.astype(np.int64))[x == 9])
    assert n_masked(64, 0.15) == 10
    with pytest.raises(ValueError, match="^mask_rate"):
        n_masked(64, 1.5)
    stream = np.random.default_rng(0).integers(0, 7, 5000).astype(np.uint8)
    s = MaskedSampler(stream, 32, 4, 0.15, 7, seed=1)
    assert torch.equal(s(3)[0], MaskedSampler(stream, 32, 4, 0.15, 7, seed=1)(3)[0])
    ev = MaskedEvaluator(stream, 32, 8, 0.15, 7)
    again = MaskedEvaluator(stream, 32, 8, 0.15, 7)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ev(), again()))  # the same masks for every arm
    assert ev.n_targets == len(stream) // 32 * 5
    uni = unigram_loss([stream], 7, ev())
    assert 0 < uni <= np.log(7) + 1e-6


# ---- arms ----------------------------------------------------------------------------------------------------------
def test_matched_controls_are_solved_by_ffn_width():
    target, _ = build_decoder(40, 32, 2, 4, 16, ArmSpec("t", "tha", model={"n_heads": 8}), causal=False)
    flops = matched_d_ff("flops", model_costs(target, 16), 40, 32, 2, 4, 16, ArmSpec("c", "mha",
                                                                                     model={"n_heads": 8}), False)
    params = matched_d_ff("params", model_costs(target, 16), 40, 32, 2, 4, 16, ArmSpec("c", "mha"), False)
    ctl, _ = build_decoder(40, 32, 2, 4, 16, ArmSpec("c", "mha", model={"n_heads": 8, "d_ff": flops}), causal=False)
    assert abs(model_costs(ctl, 16)[1] - model_costs(target, 16)[1]) <= 2 * 16 * 2 * 2 * 32  # within one FFN unit
    assert params >= 128  # THA adds 2H² per layer: the width can only grow from 4D = 128
    with pytest.raises(ValueError, match="^match"):
        matched_d_ff("params", (10, 10), 40, 32, 2, 4, 16, ArmSpec("c", "mha"), False)
    with pytest.raises(ValueError, match="^options"):
        ArmSpec("x", "mha", {"n_experts": 3})
    with pytest.raises(ValueError, match="^papers"):
        ArmSpec("x", "mha", papers=("nope",))


def test_paper_selection_brings_the_arms_a_control_matches():
    from attention_zoo.experiments.mlm.presets import ARMS

    class A:
        paper, arms = "moa", None

    got = [a.label for a in select_arms(ARMS, A)]
    assert "mha_params_moa16" in got and "moa_e16" in got and "tha" not in got and "mha" in got
    A.paper, A.arms = None, ["mha_h16_flops"]
    assert [a.label for a in select_arms(ARMS, A)] == ["tha_h16", "mha_h16_flops"]
    A.arms = ["nope"]
    with pytest.raises(ValueError, match="^arms"):
        select_arms(ARMS, A)


# ---- the experiments end to end ------------------------------------------------------------------------------------
def test_mqar_decide_runs_tuned_and_stores_what_the_claims_read(tmp_path, monkeypatch, capsys):
    from attention_zoo.experiments.mqar import mqar

    monkeypatch.setenv("ATTENTION_ZOO_FINGERPRINT", "0")
    out = tmp_path / "mq"
    argv = ["--preset", "decide", "--out", str(out), "--arms", "mha", "--seeds", "0", "--steps", "2", "--train",
            "eval_every=1", "patience=0", "--quiet", "--jobs", "1"]
    assert mqar.main([*argv, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "calibrated" in plan and "phase=tune" in plan
    assert mqar.main(argv) == 0
    df = pd.read_csv(out / "mqar_long.csv")
    assert {"arm", "variant", "seed", "phase", "seq_len", "n_pairs", "metric", "value"} <= set(df.columns)
    tuned = df[df["phase"] == "tuned"]
    assert sorted(tuned["seq_len"].unique()) == [32, 64] and {"test_acc", "chance_acc", "steps_run"} <= set(
        tuned["metric"])
    assert len({(r["cell"]["lr"], r["cell"]["seed"]) for r in read_records(out / "mqar.jsonl")
                if r["cell"]["phase"] == "tune"}) == 6  # three rates × two tuning seeds
    assert (out / "mqar_capability.md").is_file() and "T=64, n=16" in (out / "mqar_capability.md").read_text()


def test_masked_lm_runs_grouped_and_logs_the_expert_loads(tmp_path, monkeypatch):
    from attention_zoo.experiments.mlm import masked_lm

    monkeypatch.setenv("ATTENTION_ZOO_FINGERPRINT", "0")
    out = tmp_path / "ml"
    assert masked_lm.main(["--preset", "smoke", "--out", str(out), "--arms", "moa_e16", "mha_params_moa16",
                           "--seeds", "0", "1", "--steps", "2", "--train", "eval_every=1", "eval_max_batches=1",
                           "--ensemble", "--quiet", "--jobs", "1"]) == 0
    df = pd.read_csv(out / "masked_lm_long.csv")
    assert set(df["ensemble"].dropna()) == {2}  # both arms group
    loads = df[df["metric"] == "expert_load_entropy"]
    assert set(loads["arm"]) == {"moa_e16"} and set(loads["layer_index"]) == {0, 1}
    assert all(sum(json.loads(c)) > 0 for c in loads["expert_load"])
    d_ff = json.loads(df.loc[df["arm"] == "mha_params_moa16", "backbone"].iloc[0])["d_ff"]
    params = df[df["metric"] == "params"].groupby("arm")["value"].mean()
    assert d_ff > 256 and abs(params["mha_params_moa16"] / params["moa_e16"] - 1) < 0.01
    assert {"test_loss", "trivial_loss", "test_ppl"} <= set(df["metric"])


def test_the_probes_run_each_arm_through_the_experiments_own_code(tmp_path, monkeypatch):
    from attention_zoo.experiments.fingerprint import probe_of

    monkeypatch.setenv("ATTENTION_ZOO_FINGERPRINT", "0")
    cells = [{"experiment": "mqar", "preset": "smoke", "vocab_size": 128, "max_steps": 300, "arm": "tha",
              "variant": "tha", "flavor": "paper", "attention_options": "{}", "backbone": "{}", "seq_len": 32,
              "n_pairs": 4, "seed": 0},
             {"experiment": "masked_lm", "preset": "smoke", "dataset": "shakespeare", "max_steps": 300,
              "arm": "moa_e4", "variant": "moa", "flavor": "paper", "attention_options": '{"n_experts": 4}',
              "backbone": "{}", "sweep": "experts", "sweep_value": 4, "seed": 0}]
    for cell in cells:
        probe = probe_of(cell["experiment"])
        arms = probe.arms([cell, {**cell, "seed": 1}])
        assert len(arms) == 1 and "seed" not in arms[0]
        rows = probe.run(arms[0], {}, tmp_path / cell["experiment"])
        assert any(r["metric"] == "steps_run" and r["value"] == 2 for r in rows)
