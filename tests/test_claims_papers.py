"""The baselines' own claims (issue 55): the ledger holds at least three per paper, 15 or more in all, each with its
source and its number or "number not verified"; verdicts come from stored rows (supported, contradicted, equivalent,
slopes over a sweep, the expert-load balance), one Holm family per paper across stores, the formula claims from the
closed forms, and ``python -m attention_zoo.claims --paper`` selects one paper's verdicts."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from attention_zoo.claims import CLAIMS, decide, paper_of
from attention_zoo.claims.data import StoreRows
from attention_zoo.claims.ledger_papers import NV, PAPER_CLAIMS


def test_the_ledger_holds_each_papers_claims_with_sources():
    per = Counter(paper_of(c.id) for c in PAPER_CLAIMS)
    assert all(per[p] >= 3 for p in ("tha", "dcmha", "colmha", "moa", "mma")) and len(PAPER_CLAIMS) >= 15
    assert {c.family for c in PAPER_CLAIMS} == {"THA", "DCMHA", "ColMHA", "MoA", "MMA"}
    for c in PAPER_CLAIMS:
        assert c.source and c.paper, c.id
        assert NV in c.paper or "(formula)" in c.paper or any(ch.isdigit() for ch in c.paper), c.id
        assert c in CLAIMS
    assert "DC.compute" not in {c.id for c in PAPER_CLAIMS}  # the scaling issue's
    assert paper_of("T5.mix") == "damcha"


def _frame(arms: dict, metric="test_loss", seeds=10, extra=None, **cols):
    """Rows of ``arms`` ({label: (variant, mean, per-seed noise sd, sweep, sweep value)}), seed-paired noise, with
    the gate's trivial reference beside each cell."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 1, seeds)
    rows = []
    for label, (variant, mean, sd, sweep, value) in arms.items():
        own = rng.normal(0, 1, seeds)
        for s in range(seeds):
            base = {"experiment": "masked_lm", "arm": label, "variant": variant, "flavor": "paper", "seed": s,
                    "status": "ok", "phase": "tuned", **cols}
            if sweep:
                base.update(sweep=sweep, sweep_value=value)
            v = mean * (1 + 0.01 * shared[s]) + sd * own[s]
            rows += [{**base, "metric": metric, "value": v}, {**base, "metric": "trivial_loss", "value": 3.3}]
            rows += [{**base, **r} for r in (extra or {}).get(label, [])]
    return pd.DataFrame(rows)


def _decide(frames: dict, ids: tuple[str, ...]):
    stores = {key: StoreRows(df, None, "ctx", ["run"], ["abc"]) for key, df in frames.items()}
    claims = tuple(c for c in CLAIMS if c.id in ids)
    return {(v.claim.id, v.preset): v for v in decide(stores, claims)}


def test_mlm_claims_are_supported_equivalent_or_contradicted_from_the_rows():
    df = _frame({"mha": ("mha", 2.0, 0.002, "heads", 4), "tha": ("tha", 1.9, 0.002, "heads", 4),
                 "tha_pre_only": ("tha", 1.95, 0.002, None, None), "tha_post_only": ("tha", 1.8, 0.002, None, None),
                 "moa": ("moa", 2.0005, 0.002, "experts", 8), "mma": ("mma", 2.2, 0.002, None, None)})
    got = _decide({("masked_lm", "decide"): df}, ("THA.mlm", "THA.ablate", "MOA.mlm", "MMA.mlm"))
    assert got["THA.mlm", "decide"].kind == "supported"
    assert got["THA.ablate", "decide"].kind == "contradicted"  # post-only beats the full THA here
    assert got["MOA.mlm", "decide"].kind == "equivalent"  # 0.03 % apart: inside ±1 %
    assert got["MMA.mlm", "decide"].verdict.startswith("contradicted")


def test_sweep_claims_read_slopes_over_the_sweep_setting():
    df = _frame({"mha": ("mha", 2.0, 0.002, "heads", 4), "tha": ("tha", 1.98, 0.002, "heads", 4),
                 "mha_h16": ("mha", 2.05, 0.002, "heads", 16), "tha_h16": ("tha", 1.9, 0.002, "heads", 16),
                 "moa_e4": ("moa", 2.1, 0.002, "experts", 4), "moa": ("moa", 2.0, 0.002, "experts", 8),
                 "moa_e16": ("moa", 1.9, 0.002, "experts", 16)})
    got = _decide({("masked_lm", "decide"): df}, ("THA.heads", "MOA.experts"))
    assert got["THA.heads", "decide"].kind == "supported"  # the gain grows with H and MHA gets worse
    assert got["MOA.experts", "decide"].kind == "supported"  # the loss falls as E grows


def test_one_holm_family_per_paper_spans_stores_and_controls_are_arms():
    mq = _frame({"mha": ("mha", 0.70, 0.01, None, None), "dcmha": ("dcmha", 0.80, 0.01, None, None),
                 "mha_qknorm": ("mha", 0.80, 0.01, None, None)}, metric="test_acc", seq_len=64, n_pairs=16)
    mq = mq[mq["metric"] == "test_acc"]
    t5 = _frame({"mha": ("mha", 2.0, 0.002, None, None), "dcmha": ("dcmha", 1.95, 0.002, None, None)},
                dataset="shakespeare")
    got = _decide({("mqar", "decide"): mq, ("table5_gpt2", "decide"): t5}, ("DC.icl", "DC.lm"))
    icl, lm = got["DC.icl", "decide"], got["DC.lm", "decide"]
    assert lm.kind == "supported"
    assert icl.kind == "explained by a control"  # MHA + QK-norm does as well as DCMHA
    assert icl.results[0].family_m == lm.results[0].family_m == 2  # one DCMHA family over both stores


def test_balance_reads_the_stored_expert_loads():
    loads = {a: [{"metric": "expert_load_entropy", "value": e, "layer_index": i} for i in (0, 1)]
             for a, e in (("moa", 0.97), ("moa_e16", 0.93))}
    df = _frame({"moa": ("moa", 2.0, 0.002, "experts", 8), "moa_e16": ("moa", 2.0, 0.002, "experts", 16)},
                extra=loads)
    assert _decide({("masked_lm", "decide"): df}, ("MOA.balance",))["MOA.balance", "decide"].kind == "supported"
    low = df.copy()
    low.loc[(low["metric"] == "expert_load_entropy") & (low["arm"] == "moa_e16"), "value"] = 0.5
    assert _decide({("masked_lm", "decide"): low}, ("MOA.balance",))["MOA.balance", "decide"].kind == "contradicted"


def test_formula_claims_from_the_closed_forms():
    got = {v.claim.id: v for v in decide({}, tuple(c for c in PAPER_CLAIMS if not c.needs_rows))}
    assert got["THA.cost"].kind == "supported" and "+288 parameters" in got["THA.cost"].ours
    assert got["DC.cost"].kind == "supported" and "2.04 %" in got["DC.cost"].ours
    assert got["COL.params"].kind == "supported" and got["COL.flops"].kind == "contradicted"
    assert got["COL.reparam"].kind == "supported"
    assert got["MOA.default"].kind == "contradicted" and "1.127×" in got["MOA.default"].ours
    assert got["MMA.params"].kind == "supported"
    assert "cannot be tested at this scale" in got["THA.transfer"].verdict
    assert got["DC.pythia"].kind == "not decidable"


def test_cli_selects_one_papers_verdicts(tmp_path, capsys):
    from attention_zoo.claims.__main__ import main

    assert main(["--results", str(tmp_path), "--paper", "colmha"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("wrote")]
    assert lines and all(ln.startswith("COL.") for ln in lines)
    assert (tmp_path / "claims_colmha.md").is_file() and "Collaborative heads" in (tmp_path / "claims_colmha.md"
                                                                                  ).read_text()
    assert main(["--results", str(tmp_path), "--paper", "damcha"]) == 0
    assert not any(ln.startswith(("THA.", "COL.")) for ln in capsys.readouterr().out.splitlines())
    with pytest.raises(SystemExit) as exc:
        main(["--results", str(tmp_path), "--paper", "nope"])
    assert exc.value.code == 2
