"""Closed-form complexity and parameter counts of MHA vs DAMCHA (paper App. D.3–D.4; docs/variants.md §8,
docs/experiments.md §7): pure arithmetic, used by Table 7's report and by the analytic claims."""

from __future__ import annotations

import pandas as pd


# ---- 1. complexity table -------------------------------------------------------------------------------------------
def generator_cost(d: int, h: int, hidden: tuple[int, ...], fused: bool = True) -> tuple[int, int]:
    """(G_c MACs of one call, G parameters) of a generator d -> hidden... -> d² (fused RowSum: d²/h outputs run)."""
    widths = (d, *hidden, d * d)
    params = sum(i * o + o for i, o in zip(widths[:-1], widths[1:]))
    run = (d, *hidden, d * d // h if fused else d * d)
    return sum(i * o for i, o in zip(run[:-1], run[1:])), params


FORMULAS = [  # component, MHA, DAMCHA no sharing, DAMCHA shared (docs/variants.md §8; MACs per layer, one sequence)
    ("score-forming projection", "Q,K: 2LD²", "X_i m_i: LD²/H", "LD²/H"),
    ("similarity", "QKᵀ: L²D", "(X_i m_i)X_iᵀ: L²D", "L²D"),
    ("softmax (elementwise, not in totals)", "O(HL²)", "O(HL²)", "O(HL²)"),
    ("aggregation", "AV: L²D", "L²D", "L²D"),
    ("V and O projections", "2LD²", "2LD²", "2LD²"),
    ("context mean (adds, not in totals)", "—", "O(LD)", "O(LD) once per stack"),
    ("metric generator, non-causal", "—", "G_c", "G_c/N (once per stack)"),
    ("metric generator, causal prefix", "—", "L·G_c", "L·G_c/N (once per stack)"),
    ("RowSum", "—", "D² adds (0 fused)", "D² once (0 fused)"),
    ("attention params (stack)", "N(4D²+4D)", "N(2D²+2D+G)", "N(2D²+2D)+G"),
    ("extra activation memory", "O(HL²) weights (0 fused)", "metric D²/H; causal fused L·D²/H",
     "same, once per stack"),
]


def complexity_numbers(L: int, D: int, H: int, N: int, hidden: tuple[int, ...], causal: bool) -> dict[str, dict]:
    """Per-layer MACs by component and in total, for the three columns, at one size."""
    g_c, G = generator_cost(D, H, hidden)
    gen = L * g_c if causal else g_c
    common = {"similarity": L * L * D, "aggregation": L * L * D, "V and O projections": 2 * L * D * D}
    cols = {"MHA": {"score-forming projection": 2 * L * D * D, **common, "metric generator": 0},
            "DAMCHA no sharing": {"score-forming projection": L * D * D // H, **common, "metric generator": gen},
            "DAMCHA shared": {"score-forming projection": L * D * D // H, **common, "metric generator": gen / N}}
    params = {"MHA": N * (4 * D * D + 4 * D), "DAMCHA no sharing": N * (2 * D * D + 2 * D + G),
              "DAMCHA shared": N * (2 * D * D + 2 * D) + G}
    for name, c in cols.items():
        c["total MACs per layer"] = sum(c.values())
        c["attention params (stack)"] = params[name]
    return cols


COMPLEXITY_SIZES = {  # label -> (L, D, H, N, generator hidden widths)
    "GPT-2 scale, 9-layer w=1536 generator": (1024, 768, 12, 12, (1536,) * 8),
    "compact config, default generator (256, 512)": (256, 128, 8, 4, (256, 512)),
}


def complexity_frame() -> pd.DataFrame:
    rows = []
    for label, (L, D, H, N, hidden) in COMPLEXITY_SIZES.items():
        for causal in (False, True):
            for col, comps in complexity_numbers(L, D, H, N, hidden, causal).items():
                for comp, v in comps.items():
                    rows.append({"size": label, "L": L, "D": D, "H": H, "N": N, "causal": causal, "column": col,
                                 "component": comp, "value": float(v)})
    return pd.DataFrame(rows)


# ---- 3. parameter counts under the readings of P --------------------------------------------------------------------
def _mlp(widths: tuple[int, ...]) -> int:
    return sum(i * o + o for i, o in zip(widths[:-1], widths[1:]))


def generator_readings(d: int, w: int, P: int) -> dict[str, int]:
    """G for each reading of P (docs/experiments.md §7), plus attention_zoo's default generator for reference."""
    return {"P = generator depth (d -> w ×8 -> d²)": _mlp((d,) + (w,) * 8 + (d * d,)),
            "P = output multiplicity (d -> w -> w -> P·d)": _mlp((d, w, w, P * d)),
            "P = number of d×d basis metrics (d -> w -> w -> P coefficients, + P·d²)": _mlp((d, w, w, P)) + P * d * d,
            "attention_zoo default (d -> 256 -> 512 -> d²)": _mlp((d, 256, 512, d * d))}


def gpt2_whole(d: int, N: int, attn_per_layer: int, vocab: int = 50257, ctx: int = 1024) -> int:
    """GPT-2 whole model: embeddings (tied head), N blocks (attention + 4d MLP + 2 LN), final LN."""
    mlp = 2 * 4 * d * d + 4 * d + d
    return vocab * d + ctx * d + N * (attn_per_layer + mlp + 4 * d) + 2 * d


def params_frame(d: int = 768, w: int = 1536, P: int = 9, layers=(12, 15)) -> pd.DataFrame:
    rows = []
    for reading, G in generator_readings(d, w, P).items():
        for N in layers:
            for sharing in ("shared", "unshared"):
                mha = N * (4 * d * d + 4 * d)
                dam = N * (2 * d * d + 2 * d) + (G if sharing == "shared" else N * G)
                whole_mha = gpt2_whole(d, N, 4 * d * d + 4 * d)
                whole_dam = whole_mha - mha + dam
                rows.append({"reading of P": reading, "N": N, "sharing": sharing, "G": G,
                             "MHA attention": mha, "DAMCHA attention": dam, "attention ratio": dam / mha,
                             "attention reduction %": 100 * (1 - dam / mha), "MHA whole model": whole_mha,
                             "DAMCHA whole model": whole_dam, "whole-model ratio": whole_dam / whole_mha,
                             "parity N (shared)": G / (2 * d * d), "N for 25% fewer (shared)": G / (d * d)})
    return pd.DataFrame(rows)
