"""The verdicts a skeptic asks for (claims/verdicts.py, claims/table.py): the MDE at the family's fixed level α/m
and the exact seeds to detect, budget-bound comparisons, the two robustness columns (one Holm family over every
decide comparison; every arm at its runner-up setting), the stand-in named in the verdict, and the count line that
counts each set of rows once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from attention_zoo.claims import CLAIMS, decide, get_claim, stats
from attention_zoo.claims.data import StoreRows, by_phase
from attention_zoo.claims.table import count_line
from attention_zoo.claims.verdicts import ALPHA, seeds_to_detect  # re-exported there from claims.scrutiny

N = 10


def _rows(gain: float, phase: str = "tuned", noise: float = 0.01, seed: int = 0, budget: dict | None = None,
          lam: float = 1.0) -> list[dict]:
    """Synthetic-store rows (test MSE, MHA vs DAMCHA at λ): DAMCHA ``gain`` (fraction) below MHA; ``budget``
    {fraction: DAMCHA's gain at that fraction of the budget} adds ``test_mse@budget`` rows."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(N):
        base = 0.2 + 0.02 * s
        for frac, g in {**(budget or {}), None: gain}.items():
            arms = {"mha": base, "damcha": base * (1 - g) * (1 + noise * rng.standard_normal())}
            for v, value in arms.items():
                row = {"task": "regression", "lam": lam, "d_e": 8, "seed": s, "variant": v, "flavor": "paper",
                       "phase": phase, "metric": "test_mse" if frac is None else "test_mse@budget", "value": value,
                       "status": "ok"}
                out.append({**row, "budget": frac} if frac is not None else row)
    return out


def _decide(frame: pd.DataFrame, claims) -> list:
    stores = {("synthetic", label): StoreRows(part, Path("x.jsonl"), "ctx", ["run"], ["abc"])
              for label, part in by_phase(frame, "decide").items()}
    return decide(stores, tuple(claims))


def _one(frame, claim_id="I.lambda1", claim=None):
    return next(v for v in _decide(frame, (claim or get_claim(claim_id),)) if v.preset == "decide")


def _no_quote(claim_id: str):
    claim = get_claim(claim_id)
    return dataclasses.replace(claim, controls=(), comparisons=tuple(dataclasses.replace(c, paper_effect=None)
                                                                    for c in claim.comparisons))


def test_the_mde_is_at_the_familys_fixed_level_and_the_seeds_to_detect_are_the_smallest_n():
    claims = (_no_quote("I.lambda1"), _no_quote("I.lambda02"))  # one family ("Figure 12") of two comparisons
    frame = pd.DataFrame(_rows(0.0, noise=0.08) + _rows(0.0, noise=0.08, seed=1, lam=0.2))
    v = next(v for v in _decide(frame, claims) if v.claim.id == "I.lambda1" and v.preset == "decide")
    r = v.results[0]
    assert r.family_m == 2
    expected = stats.mde(r.test.n, r.test.sd, ALPHA / 2)
    assert f"MDE {expected:.2g}" in v.verdict
    n = seeds_to_detect(r.test.sd, abs(r.test.mean) or 0.01, ALPHA / 2)
    target = abs(r.test.mean) or 0.01
    assert stats.mde(n, r.test.sd, ALPHA / 2) <= target < stats.mde(n - 1, r.test.sd, ALPHA / 2) or n == 5
    assert seeds_to_detect(1.0, 1e-9, 0.05) is None


def test_a_comparison_still_moving_toward_the_claim_at_the_end_of_its_budget_is_not_decidable():
    claim = _no_quote("I.lambda1")
    # DAMCHA 5 % worse at the full budget, but it gained 10 points between half and full: budget-bound
    moving = _one(pd.DataFrame(_rows(-0.05, budget={0.5: -0.15, 1.0: -0.05})), claim=claim)
    assert moving.verdict.startswith("not decidable at this budget: the effect still moves toward the paper's claim")
    # the same end point reached at half the budget already: a plateau, so the contradiction stands
    flat = _one(pd.DataFrame(_rows(-0.05, budget={0.5: -0.05, 1.0: -0.05}, noise=0.002)), claim=claim)
    assert flat.kind == "contradicted", flat.verdict
    # a supported verdict whose gain shrinks at the end is budget-bound too; one that still grows is not
    shrinking = _one(pd.DataFrame(_rows(0.10, budget={0.5: 0.20, 1.0: 0.10})), claim=claim)
    assert shrinking.kind == "not decidable" and "away from the paper's claim" in shrinking.verdict
    growing = _one(pd.DataFrame(_rows(0.10, budget={0.5: 0.05, 1.0: 0.10})), claim=claim)
    assert growing.kind == "supported"


def test_the_robustness_columns_say_whether_the_verdict_holds():
    claim = _no_quote("I.lambda1")
    frame = pd.DataFrame(_rows(0.10) + _rows(0.10, phase="runner_up", seed=3))
    v = _one(frame, claim=claim)
    assert (v.kind, v.one_family, v.runner_up) == ("supported", "holds", "holds")
    assert all(not x.preset.endswith("runner-up setting") for x in _decide(frame, (claim,)))  # a column, not a row
    flips = _one(pd.DataFrame(_rows(0.10) + _rows(-0.10, phase="runner_up", seed=3)), claim=claim)
    assert flips.runner_up == "changes (→ contradicted)"
    assert _one(pd.DataFrame(_rows(0.10)), claim=claim).runner_up == "not run"


def test_a_verdict_on_a_stand_in_names_it():
    frame = pd.DataFrame([{"dataset": "digits", "seed": s, "variant": v, "flavor": "paper", "phase": "tuned",
                           "metric": "mse", "value": 0.1 + 0.001 * s + (0.02 if v == "damcha" else 0), "status": "ok"}
                          for s in range(N) for v in ("mha", "damcha")])
    claim = dataclasses.replace(get_claim("T1.cifar10"), comparisons=get_claim("T1.cifar10").comparisons[:1],
                                controls=())
    stores = {("table1_generation", "decide"): StoreRows(frame, Path("x.jsonl"), "ctx", ["run"], ["abc"])}
    v = next(v for v in decide(stores, (claim,)) if v.preset == "decide")
    assert v.verdict.startswith("contradicted on digits MSE (stand-in for CIFAR-10 FID@Top-50)"), v.verdict


def test_the_count_line_counts_each_set_of_rows_once():
    verdicts = [v for v in decide({}, tuple(c for c in CLAIMS if not c.needs_rows))]
    line = count_line(verdicts)
    assert line.startswith(f"{len(verdicts)} claims:")
    again = [dataclasses.replace(verdicts[0], same_as=verdicts[1].claim.id)] + verdicts[1:]
    line = count_line(again)
    assert line.startswith(f"{len(verdicts) - 1} claims:") and "(1 more claim re-reads another claim's rows" in line


def _lambda_rows(sep_slope: float) -> pd.DataFrame:
    """λ ∈ {0, 0.5, 1}: DAMCHA 10 % below MHA everywhere; mha_sep's test MSE rises by ``sep_slope`` per unit λ."""
    rng = np.random.default_rng(1)
    rows = []
    for s in range(N):
        for lam in (0.0, 0.5, 1.0):
            base = 0.2 + 0.01 * s
            for v, value in (("mha", base), ("damcha", 0.9 * base * (1 + 0.01 * rng.standard_normal())),
                             ("mha_sep", base + sep_slope * lam + 0.002 * rng.standard_normal())):
                rows.append({"task": "regression", "lam": lam, "d_e": 8, "seed": s, "variant": v,
                             "flavor": "paper", "phase": "tuned", "metric": "test_mse", "value": value,
                             "status": "ok"})
    return pd.DataFrame(rows)


def test_the_lambda_claims_need_a_positive_control_that_responds_to_lambda():
    claim = _no_quote("I.lambda1")
    flat = _one(_lambda_rows(0.0), claim=claim)
    assert flat.verdict.startswith("not decidable: the task does not isolate cross-head interaction"), flat.verdict
    rising = _one(_lambda_rows(0.05), claim=claim)
    assert rising.kind == "supported" and "positive control mha_sep" in rising.note and "responds" in rising.note


def test_the_separate_towers_control_keeps_the_subspaces_apart_until_the_pooled_head():
    import torch

    from attention_zoo.experiments.synthetic.task import SyntheticModel

    torch.manual_seed(0)
    model = SyntheticModel(32, 2, "mha_sep", {}, 1)
    x = torch.randn(3, 6, 32, requires_grad=True)
    h, _ = model.stack(x)
    for i in range(4):
        g = torch.autograd.grad(h[..., 8 * i:8 * (i + 1)].sum(), x, retain_graph=True)[0]
        others = torch.cat([g[..., :8 * i], g[..., 8 * (i + 1):]], dim=-1)
        assert others.abs().max() == 0 and g[..., 8 * i:8 * (i + 1)].abs().max() > 0
    out, _ = model(x)
    g = torch.autograd.grad(out.sum(), x)[0]
    assert all(g[..., 8 * i:8 * (i + 1)].abs().max() > 0 for i in range(4))  # the pooled head reads every subspace
