"""What a reviewer is shown: units and orientation of the control columns, every comparison checked against the
controls, small n, shared rows, the learned-at-all gate, costs, headline rows and scope from the stored rows."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attention_zoo.claims import decide, get_claim, stats, verdict_frame, verdict_markdown
from attention_zoo.claims.data import StoreRows
from attention_zoo.claims.gate import NOT_LEARNED, apply_gate

N = 10


def _rows(arms: dict, lam=1.0, task="regression", metric="test_mse", seeds=N, extra=None, noise=0.002, d_e=8):
    """One row per (arm, seed): value = base_s × factor (× small noise); ``arms`` {variant: factor}."""
    rng = np.random.default_rng(0)
    out = []
    for s in range(seeds):
        base = 0.5 + 0.01 * s
        for v, f in arms.items():
            out.append({"task": task, "lam": lam, "d_e": d_e, "seed": s, "variant": v, "flavor": "paper",
                        "metric": metric, "value": base * f * (1 + noise * rng.standard_normal()), "status": "ok"})
            for m, val in (extra or {}).items():
                out.append({**out[-1], "metric": m, "value": val(v, s) if callable(val) else val})
    return pd.DataFrame(out)


def _decide(df, *ids, preset="decide", path=Path("x/synthetic.jsonl")):
    rows = StoreRows(df, path, "ctx", ["run"], ["abc"])
    return [v for v in decide({("synthetic", preset): rows}, tuple(get_claim(i) for i in ids))]


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[+-]\d+\.\d+", text)]


def test_a_control_gap_is_in_the_claims_unit_against_the_claims_reference():
    # MHA 1.0, DAMCHA 0.9 (10 % better), mha_ctx 0.2 (80 % better): DAMCHA − mha_ctx = −70 % of MHA's MSE,
    # not (0.9 − 0.2)/0.2 = −350 % of the control's
    v = _decide(_rows({"mha": 1.0, "damcha": 0.9, "mha_ctx": 0.2}), "I.lambda1")[0]
    r = v.results[0]
    ctrl = r.controls[0]
    assert ctrl.name == "mha_ctx"
    assert ctrl.gain.mean == pytest.approx(80, abs=0.5) and ctrl.gap.mean == pytest.approx(-70, abs=0.5)
    assert r.test.mean == pytest.approx(ctrl.gain.mean + ctrl.gap.mean)  # the three numbers add up
    assert "% of mha's test MSE" in v.control and "damcha − mha_ctx -70" in v.control
    assert v.verdict == "explained by a control"


def test_a_worse_claims_control_column_has_the_effect_columns_sign():
    # I.lambda02: the paper says DAMCHA is worse; here DAMCHA is 10 % better and mha_pm 5 % worse than MHA
    v = _decide(_rows({"mha": 1.0, "damcha": 0.9, "mha_pm": 1.05}, lam=0.2), "I.lambda02")[0]
    assert v.results[0].test.mean == pytest.approx(10, abs=0.5)  # effect column: positive = DAMCHA better
    ctrl = v.results[0].controls[0]
    assert ctrl.name == "mha_pm" and ctrl.gain.mean == pytest.approx(-5, abs=0.5)
    assert ctrl.gap.mean == pytest.approx(15, abs=0.5)
    assert v.verdict == "contradicted: damcha better than the paper states (not worse than mha)"


def test_the_strongest_control_is_the_largest_gain_over_the_reference():
    v = _decide(_rows({"mha": 1.0, "damcha": 0.9, "mha_pm": 1.05, "damcha_static": 1.04, "mha_ctx": 0.5},
                      lam=0.2), "I.lambda02")[0]
    assert [c.name for c in v.results[0].controls][0] == "mha_ctx"


def test_a_control_that_explains_only_the_second_comparison_is_found():
    # I.de_lead: DAMCHA +10 points at every dₑ; mha_ctx matches it at dₑ = 8 only
    frames = []
    for d in (4, 8, 12, 16, 20):
        arms = {"mha": 0.5, "damcha": 0.6, "mha_ctx": 0.6 if d == 8 else 0.5}
        frames.append(_rows(arms, lam=None, task="classification", metric="test_acc", d_e=d, noise=0.01))
    v = _decide(pd.concat(frames, ignore_index=True), "I.de_lead")[0]
    verdicts = {r.name: r.verdict for r in v.results}
    assert verdicts["dₑ = 8"] == "explained by a control" and verdicts["dₑ = 4"] == "supported", verdicts
    assert v.verdict == "explained by a control"
    assert "dₑ = 8: mha_ctx" in v.control


def test_two_claims_on_the_same_rows_are_decided_once_and_counted_once_in_holm():
    from attention_zoo.claims.ledger import CLAIMS
    t1 = [c for c in CLAIMS if c.id in ("T1.cifar10", "T1.cifar100")]
    rows, rng = [], np.random.default_rng(1)
    variants = {"mha": 1.0, "damcha": 0.9, "tha": 1.0, "dcmha": 1.0, "colmha": 1.0, "mma": 1.0, "moa": 1.0}
    for s in range(N):
        for v, f in variants.items():
            rows.append({"dataset": "digits", "seed": s, "variant": v, "flavor": "paper" if v in ("mha", "damcha")
                         else "damcha_repo", "metric": "fid_top50", "status": "ok",
                         "value": (50 + s) * f * (1 + 0.02 * rng.standard_normal())})
    store = StoreRows(pd.DataFrame(rows), Path("x/table1_generation.jsonl"), "ctx", ["r"], ["c"])
    got = {v.claim.id: v for v in decide({("table1_generation", "smoke"): store}, tuple(t1))}
    a, b = got["T1.cifar10"], got["T1.cifar100"]
    assert b.same_as == "T1.cifar10" and not a.same_as
    assert [r.level for r in a.results] == [r.level for r in b.results]
    m = len(a.results)  # six distinct comparisons, not twelve
    assert min(r.level for r in a.results) == pytest.approx(0.05 / m)
    assert "same rows as T1.cifar10" in verdict_frame([a, b]).iloc[1]["ours (effect, interval, n)"]


def _text_cells(folder: Path, hypothesis, rows_of) -> pd.DataFrame:
    """A text store: per (seed, arm) a per-sample file of four ``hypothesis(v, s)``, rows ``rows_of(base, v, s)``."""
    (folder / "per_sample").mkdir(parents=True)
    rows = []
    for s in range(N):
        for v in ("mha", "damcha"):
            f = folder / "per_sample" / f"{v}-{s}.jsonl"
            f.write_text("\n".join(json.dumps({"hypothesis": hypothesis(v, s), "reference": "x"}) for _ in range(4)))
            base = {"dataset": "concepts", "seed": s, "variant": v, "flavor": "paper", "status": "ok",
                    "per_sample": f"per_sample/{v}-{s}.jsonl"}
            rows += rows_of(base, v, s)
    return pd.DataFrame(rows)


def test_an_arm_with_empty_outputs_is_not_ok_and_its_comparison_is_not_decidable(tmp_path):
    folder = tmp_path / "table1_generation"
    df = _text_cells(folder, lambda v, s: "" if v == "mha" else f"thou art a gentle knight of seed {s}",
                     lambda base, v, s: [{**base, "metric": "bertscore_f1",
                                          "value": 0.2 + 0.01 * s if v == "damcha" else 0.1}])
    gated, checked = apply_gate(df, folder)
    assert checked and set(gated.loc[gated["variant"] == "mha", "status"]) == {NOT_LEARNED}
    assert set(gated.loc[gated["variant"] == "damcha", "status"]) == {"ok"}
    store = StoreRows(df, folder / "table1_generation.jsonl", "ctx", ["r"], ["c"])
    v = [x for x in decide({("table1_generation", "smoke"): store}, (get_claim("T1.wmt"),))][0]
    assert v.verdict.startswith("not decidable: stand-in not learned: mha (10 of 10 seeds: 100 % of the generated"), \
        v.verdict
    assert "no effect reported" in v.ours and not _numbers(v.ours.split(";")[0])


def test_looping_generations_gate_the_text_scores_but_not_the_teacher_forced_nll(tmp_path):
    """An arm whose greedy outputs repeat fails BERTScore claims, but its held-out NLL (which beats the unigram) is
    still compared; an arm whose NLL does not beat the unigram fails every metric."""
    folder = tmp_path / "table1_generation"

    def rows_of(base, v, s):
        nll, base = (2.0 if v == "mha" else 1.8) + 0.01 * s, {**base, "phase": "tuned"}
        return [{**base, "metric": "nll", "value": nll}, {**base, "metric": "bertscore_f1", "value": 0.3},
                {**base, "metric": "val_loss", "value": nll}, {**base, "metric": "trivial_val_loss", "value": 3.3}]

    df = _text_cells(folder, lambda v, s: "the the the the the the", rows_of)
    gated, _ = apply_gate(df, folder)
    assert set(gated.loc[gated["metric"] == "bertscore_f1", "status"]) == {NOT_LEARNED}
    assert set(gated.loc[gated["metric"] == "nll", "status"]) == {"ok"}
    stores = {("table1_generation", p): StoreRows(df, folder / "table1_generation.jsonl", "ctx", ["r"], ["c"])
              for p in ("smoke", "decide")}
    got = {v.preset: v for v in decide(stores, (get_claim("T1.wmt"),))}
    assert got["smoke"].verdict.startswith("not decidable: stand-in not learned"), got["smoke"].verdict
    decided = got["decide"]  # NLL, lower is better: DAMCHA 10 % below MHA on every seed
    assert decided.results[0].name == "vs mha" and decided.results[0].test.mean > 5, decided.ours
    assert not decided.results[0].gate
    at_unigram = df.assign(value=lambda d: d["value"].where(~((d["variant"] == "mha") & (d["metric"] == "val_loss")),
                                                            3.3))
    gated, _ = apply_gate(at_unigram, folder)
    assert set(gated.loc[gated["variant"] == "mha", "status"]) == {NOT_LEARNED}  # every metric, NLL included


def test_the_decide_preset_compares_the_baselines_in_their_original_form():
    claim = get_claim("T1.cifar10")
    names = {p: [c.at(p).name for c in claim.comparisons] for p in ("smoke", "decide")}
    assert names["decide"] == ["vs mha", "vs tha", "vs dcmha", "vs colmha", "vs mma", "vs moa"]
    assert names["smoke"][1:] == [f"vs {v}/damcha_repo" for v in ("tha", "dcmha", "colmha", "mma", "moa")]
    assert {c.at("decide").reference.where["flavor"] for c in claim.comparisons[1:]} == {"paper"}
    text = get_claim("T1.wmt")
    assert (text.at("smoke").metric, text.at("smoke").better) == ("bertscore_f1", "higher")
    assert (text.at("decide").metric, text.at("decide").better) == ("nll", "lower")


def test_the_gate_fires_on_an_arm_at_the_trivial_predictor():
    df = _rows({"mha": 1.0, "damcha": 0.9}, extra={"trivial_mse": lambda v, s: 0.5 + 0.01 * s if v == "mha" else 9})
    v = _decide(df, "I.lambda1")[0]
    assert v.kind == "not decidable" and "mha (10 of 10 seeds: test_mse" in v.verdict
    ok = _rows({"mha": 1.0, "damcha": 0.9}, extra={"trivial_mse": 9.0})
    assert _decide(ok, "I.lambda1")[0].kind != "not decidable"


def test_the_cost_of_a_comparison_is_the_sum_of_its_two_arms_cells_each_once():
    df = _rows({"mha": 1.0, "damcha": 0.9, "mha_pm": 1.0},
               extra={"train_cpu_s": lambda v, s: {"mha": 1.0, "damcha": 2.0, "mha_pm": 100.0}[v]})
    v = _decide(df, "I.lambda1")[0]
    assert v.cost_s == pytest.approx(N * (1.0 + 2.0)) and v.cost_unit == "CPU"  # the control's cells not counted
    both = _decide(df, "I.lambda", "I.lambda1")  # two claims on overlapping cells: each claim counts its own once
    assert {x.claim.id: x.cost_s for x in both}["I.lambda1"] == pytest.approx(30.0)


def test_scope_is_read_from_the_stored_rows_not_typed():
    df = _rows({"mha": 1.0, "damcha": 0.9}, seeds=6, extra={"steps_run": lambda v, s: 150 if s else 120})
    v = _decide(df, "I.lambda1", preset="smoke")[0]
    assert "6 seeds" in v.scope and "120–150 steps run" in v.scope
    assert "200 steps" not in verdict_frame([v]).iloc[0]["scope"]


def test_one_headline_row_per_claim_from_the_most_decisive_preset():
    df = _rows({"mha": 1.0, "damcha": 0.9})
    rows = StoreRows(df, Path("x/synthetic.jsonl"), "ctx", ["run"], ["abc"])
    vs = decide({("synthetic", "smoke"): rows, ("synthetic", "decide"): rows}, (get_claim("I.lambda1"),))
    frame = verdict_frame(vs)
    assert frame.loc[frame["headline"], "preset"].tolist() == ["decide"]
    md = verdict_markdown(vs)
    assert md.index("**1 claim: 1 supported.**") < md.index("### Pipeline checks and smaller budgets")
    assert md.count("`I.lambda1`") == 2


def test_slopes_are_labelled_per_unit_of_the_setting():
    frames = [_rows({"mha": 1.0, "damcha": 1 - 0.05 * lam}, lam=lam) for lam in (0.0, 0.5, 1.0)]
    v = _decide(pd.concat(frames, ignore_index=True), "I.lambda")[0]
    assert v.results[0].unit == "% of mha's test MSE per unit λ"
    assert v.results[0].test.mean == pytest.approx(5, abs=0.3)


def test_families_follow_the_run_and_table():
    fgh = [c for c in (get_claim("F.structure"), get_claim("G.sharing_grads"), get_claim("H.adaptive"))]
    assert len({c.family for c in fgh}) == 1 and len({c.store_name for c in fgh}) == 1


def test_holm_and_interval_use_the_t_method_only_from_five_seeds():
    assert stats.paired_test([1.0, 2.0, 3.0, 4.0]).method == "range"
    assert math.isnan(stats.holm([math.nan])[0][0])


def test_the_trivial_references_that_tables_5_and_6_store():
    import torch

    from attention_zoo.data.text import CharCorpus
    from attention_zoo.experiments.vision.table6_data import majority_top1
    corpus = CharCorpus("x", b"ab", [np.array([0, 0, 0, 1])], {}, {"x": np.array([0, 1])})
    assert corpus.unigram_loss("test", "x") == pytest.approx(-(math.log(4 / 6) + math.log(2 / 6)) / 2)
    assert majority_top1(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1, 1])) == 25.0
    gated, checked = apply_gate(pd.DataFrame([
        {"variant": "mha", "seed": 0, "metric": "top1", "value": 11.0, "status": "ok"},
        {"variant": "mha", "seed": 0, "metric": "chance_top1", "value": 10.0, "status": "ok"},
        {"variant": "damcha", "seed": 0, "metric": "top1", "value": 60.0, "status": "ok"},
        {"variant": "damcha", "seed": 0, "metric": "chance_top1", "value": 10.0, "status": "ok"}]))
    assert checked and gated.groupby("variant")["status"].first().to_dict() == {"damcha": "ok", "mha": NOT_LEARNED}


def test_a_tuned_store_decides_on_its_tuned_rows_and_shows_the_shared_setting_beside_them(tmp_path):
    from attention_zoo.claims import frame_verdicts

    tuned = _rows({"mha": 1.0, "damcha": 0.9}).assign(phase="tuned", lr=3e-3, weight_decay=0.01)
    tuned.loc[tuned["variant"] == "damcha", "lr"] = 1e-3
    shared = _rows({"mha": 1.0, "damcha": 1.2}).assign(phase="shared", lr=3e-3, weight_decay=0.01)
    grid = _rows({"mha": 1.0, "damcha": 0.1}).assign(phase="tune", lr=1e-2, weight_decay=0.1)  # must not count
    vs = frame_verdicts("synthetic", "decide", pd.concat([tuned, shared, grid], ignore_index=True))
    got = {v.preset: v for v in vs if v.claim.id == "I.lambda1"}
    assert set(got) == {"decide", "decide, shared setting"}
    assert got["decide"].results[0].test.mean == pytest.approx(10, abs=0.5)  # the tuned rows, not the grid's 90
    assert got["decide, shared setting"].kind == "contradicted"
    assert "damcha lr 0.001 wd 0.01" in got["decide"].scope and "mha lr 0.003" in got["decide"].scope
    frame = verdict_frame([got["decide"], got["decide, shared setting"]])
    assert frame.loc[frame["headline"], "preset"].tolist() == ["decide"]


def test_table1_report_names_the_arms_whose_generated_text_fails_the_gate(tmp_path):
    """The delta table and figure show BERTScore deltas of every arm; a reader is told which arms' texts are
    degenerate (the verdicts' gate), and nothing is said when every arm's text passes."""
    from attention_zoo.experiments.generation.table1_report import text_gate_note

    def rows_of(base, v, s):
        return [{**base, "metric": "bertscore_f1", "value": 0.3}, {**base, "metric": "nll", "value": 2.0}]

    one = _text_cells(tmp_path / "one", lambda v, s: "" if v == "mha" else f"thou art a gentle knight {s}", rows_of)
    note = text_gate_note(one, tmp_path / "one")
    assert note is not None and f"concepts mha/paper ({N} of {N} seeds)" in note and "damcha" not in note
    every = _text_cells(tmp_path / "every", lambda v, s: "the the the the the", rows_of)
    assert f"every arm on concepts ({N} of {N} seeds each)" in text_gate_note(every, tmp_path / "every")
    fine = _text_cells(tmp_path / "fine", lambda v, s: f"thou art a gentle knight {s}", rows_of)
    assert text_gate_note(fine, tmp_path / "fine") is None
