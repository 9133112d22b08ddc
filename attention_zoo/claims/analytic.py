"""Claims decided from formulas and measured counts rather than from seeds (Table 2's GFLOPs, Table 7, App. D).

Each function states its reading of the claim's terms in the verdict's note; "computed" in the scope means the
numbers are arithmetic (closed forms), not measurements.
"""

from __future__ import annotations

import math

import pandas as pd

from ..measure.complexity import complexity_numbers, generator_readings, params_frame
from .analytic_papers import PAPER_ANALYTIC
from .data import StoreRows, matches, metric_rows

PAPER_GFLOPS = {("CIFAR-10/100", "damcha"): 0.0786, ("CIFAR-10/100", "moa"): 0.1101, ("WMT", "damcha"): 0.3586}
MEMORY_TOLERANCE = 0.05  # one CPU peak-RSS measurement per cell: closer than 5 % counts as a tie
WMT_BASELINES = ("tha", "dcmha", "colmha", "mma", "moa")
GPT2 = dict(d=768, w=1536, P=9)
DEPTH_READING = "P = generator depth (d -> w ×8 -> d²)"


def _value(df: pd.DataFrame, **where) -> float:
    sel = df[matches(df, where)]
    return float(sel["value"].mean()) if not sel.empty else math.nan


def paper_gflops(claim, preset: str, rows: StoreRows, Verdict):
    """The authors' closed form (batch 1, one forward, generator once per layer) against the three quoted GFLOPs."""
    df = metric_rows(rows.frame, "paper_model_gflops")
    parts, ok = [], []
    for (setting, variant), quoted in PAPER_GFLOPS.items():
        ours = _value(df, setting=setting, variant=variant)
        parts.append(f"{variant} {setting}: {ours:.4f} vs {quoted}")
        ok.append(math.isfinite(ours) and abs(ours - quoted) < 5e-5)
    verdict = "not run" if df.empty else ("supported" if all(ok) else "contradicted")
    ours = _value(metric_rows(rows.frame, "fwd_gflops_analytic"), setting="WMT", variant="damcha")
    note = ("reading: the authors' profiler formula (docs/experiments.md §6) — it counts DAMCHA's generator once per "
            "layer with no causal-prefix cost and a constant input; our analytic count of the current method at WMT "
            f"is {ours:.4g} GFLOPs (forward, this preset's model)")
    return Verdict(claim, preset, verdict, ours="; ".join(parts), note=note, context=rows.context_id,
                   runs=rows.run_ids, commits=rows.commits)


def wmt_cost(claim, preset: str, rows: StoreRows, Verdict):
    """DAMCHA vs each baseline (damcha_repo flavour, as the paper ran them) at the WMT setting: analytic forward
    GFLOPs (exact) and CPU peak training RSS (one measurement each: ties within MEMORY_TOLERANCE)."""
    out, verdicts = [], []
    for metric, tol in (("fwd_gflops_analytic", 0.0), ("peak_train_rss_mib", MEMORY_TOLERANCE)):
        df = metric_rows(rows.frame, metric)
        df = df[matches(df, {"setting": "WMT"})]
        dam = _value(df, variant="damcha")
        for base in WMT_BASELINES:
            ref = _value(df, variant=base, flavor="damcha_repo")
            if not (math.isfinite(dam) and math.isfinite(ref)):
                continue
            rel = dam / ref - 1
            verdicts.append("supported" if rel < -tol else "contradicted" if rel > tol else "inconclusive")
            out.append(f"{metric} damcha/{base} {dam / ref:.3g}")
    if not verdicts:
        verdict = "not run"
    elif "contradicted" in verdicts:
        verdict = "contradicted"
    else:
        verdict = "supported" if all(v == "supported" for v in verdicts) else \
            f"inconclusive (memory within {100 * MEMORY_TOLERANCE:.0f} % of a baseline)"
    note = ("ours: analytic forward FLOPs of the current method (causal prefix generator) and CPU peak RSS of a "
            "training step at batch 1; the paper's GPU allocation and closed form differ (T2.gflops)")
    return Verdict(claim, preset, verdict, ours="; ".join(out) or "–", note=note, context=rows.context_id,
                   runs=rows.run_ids, commits=rows.commits)


def score_cost(claim, preset: str, rows: StoreRows, Verdict):
    """Score-forming projections: DAMCHA's X_i m_i over heads (L·D²/H MACs) vs MHA's Q and K (2·L·D²)."""
    L, D, H, N = 1024, 768, 12, 12
    c = complexity_numbers(L, D, H, N, (1536,) * 8, causal=False)
    ratio = c["DAMCHA shared"]["score-forming projection"] / c["MHA"]["score-forming projection"]
    total = c["DAMCHA shared"]["total MACs per layer"] / c["MHA"]["total MACs per layer"]
    verdict = "supported" if ratio <= 1 / H else "contradicted"
    ours = f"projection MACs DAMCHA/MHA = {ratio:.4f} (1/(2H) = {1 / (2 * H):.4f})"
    return Verdict(claim, preset, verdict, ours=ours,
                   note=f"reading: 'score formation' = the score-forming projections only; QKᵀ (L²·D) is the same in "
                        f"both; per layer in total (non-causal, shared, L={L}, D={D}, H={H}) DAMCHA/MHA = {total:.3f}",
                   context=rows.context_id, runs=rows.run_ids, commits=rows.commits)


def shared_amortised(claim, preset: str, rows: StoreRows, Verdict):
    """The shared generator's per-layer share G_c/N (non-causal) and L·G_c/N (causal) as N grows."""
    L, D, H = 1024, 768, 12
    hidden = (1536,) * 8
    shares = {N: complexity_numbers(L, D, H, N, hidden, causal=True)["DAMCHA shared"]["metric generator"]
              for N in (12, 48, 192)}
    decreasing = shares[12] > shares[48] > shares[192]
    mha_stack = 12 * complexity_numbers(L, D, H, 12, hidden, causal=True)["MHA"]["total MACs per layer"]
    return Verdict(claim, preset, "supported" if decreasing else "contradicted",
                   ours="causal per-layer generator MACs at N = 12 / 48 / 192: "
                        + " / ".join(f"{v / 1e9:.3g} G" for v in shares.values()),
                   note=f"the share falls as 1/N, but one causal-prefix call costs L·G_c = "
                        f"{12 * shares[12] / 1e9:.3g} G MACs per forward, more than the whole 12-layer MHA stack "
                        f"({mha_stack / 1e9:.3g} G)",
                   context=rows.context_id, runs=rows.run_ids, commits=rows.commits)


def _readings(N: int) -> pd.DataFrame:
    p = params_frame(GPT2["d"], GPT2["w"], GPT2["P"], layers=(N,))
    return p[p["sharing"] == "shared"].set_index("reading of P")


def param_parity(claim, preset: str, rows: StoreRows, Verdict):
    """Attention-only DAMCHA/MHA at N = 12 within ±5 % ("essentially the same"), under each reading of P."""
    p = _readings(12)
    holds = {r: abs(v - 1) <= 0.05 for r, v in p["attention ratio"].items()}
    primary = holds[DEPTH_READING]
    others = [f"{r.split(' (')[0]}: ratio {p.loc[r, 'attention ratio']:.3g} ({'holds' if h else 'fails'})"
              for r, h in holds.items() if r != DEPTH_READING and "attention_zoo" not in r]
    return Verdict(claim, preset, "supported" if primary else "contradicted",
                   ours=f"attention DAMCHA/MHA = {p.loc[DEPTH_READING, 'attention ratio']:.3g} (G = "
                        f"{generator_readings(**GPT2)[DEPTH_READING] / 1e6:.0f} M)",
                   note="other readings: " + "; ".join(others), context=rows.context_id, runs=rows.run_ids,
                   commits=rows.commits)


def param_fewer(claim, preset: str, rows: StoreRows, Verdict):
    """Attention-only reduction at N = 15 of at least 20 % ("about 25 %"), under each reading of P."""
    p = _readings(15)
    holds = {r: v >= 20 for r, v in p["attention reduction %"].items()}
    others = [f"{r.split(' (')[0]}: {p.loc[r, 'attention reduction %']:.1f} % ({'holds' if h else 'fails'})"
              for r, h in holds.items() if r != DEPTH_READING and "attention_zoo" not in r]
    return Verdict(claim, preset, "supported" if holds[DEPTH_READING] else "contradicted",
                   ours=f"reduction at N = 15: {p.loc[DEPTH_READING, 'attention reduction %']:.1f} %",
                   note="other readings: " + "; ".join(others) + "; no single reading satisfies D4.parity and "
                        "D4.fewer for attention-only counts", context=rows.context_id, runs=rows.run_ids,
                   commits=rows.commits)


ANALYTIC = {"paper_gflops": paper_gflops, "wmt_cost": wmt_cost, "score_cost": score_cost,
            "shared_amortised": shared_amortised, "param_parity": param_parity, "param_fewer": param_fewer}
ANALYTIC.update(PAPER_ANALYTIC)  # the baselines' formula claims (analytic_papers)
