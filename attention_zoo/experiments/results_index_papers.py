"""The report's sections on the baselines' own papers (docs/claims.md §7): one per paper, naming its claims, the
stand-ins that
decide them and their limits; the MQAR and masked-LM sections; and the MQAR capability table that opens the report's
summary, read from the stored rows (``mqar.report.capability``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import report
from ..results import read_records

# (name, title, folder, markdown, claims prefixes, what the stand-ins are and where they stop)
PAPER_SECTIONS = (
    ("MQAR (decide)", "associative recall for every arm: the capability ladder", "mqar_decide", "mqar.md",
     ("DC.icl", "DC.ablate"), "Zoology's multi-query associative recall at CPU size: 2 layers, D = 64, three rungs "
     "(T, n) = (32, 4), (64, 8), (64, 16); each arm tuned on three learning rates, 10 seeds for the arms the claims "
     "compare, 5 for the others. Zoology's own runs go to D = 512 and T = 512 with a vocabulary of 8,192."),
    ("Masked LM (decide)", "the baselines' masked-LM claims and sweeps", "masked_lm_decide", "masked_lm.md", (),
     "A masked character LM on Shakespeare (15 % masked), 2 bidirectional layers, D = 64, 1,800 steps of 16 windows: "
     "the runs still improve at the end of the budget, so arms are compared at an equal budget, not at a plateau."),
    ("Talking-Heads Attention", "Shazeer et al. 2020: masked-LM gain, head sweep, ablation, cost", "masked_lm_decide",
     "masked_lm.md", ("THA.",), "THA's masked-LM claims are decided on the masked character LM (the paper: T5-base "
     "span corruption on C4, then GLUE/SuperGLUE/SQuAD). The head sweep stops at H = 16 (d_k = 4) and carries an MHA "
     "given THA's FLOPs there; transfer after pretraining cannot be tested at this scale."),
    ("DCFormer (DCMHA)", "Xiao et al., ICML 2024: in-context recall, composition ablation, LM, ViT, cost",
     "mqar_decide", "mqar.md", ("DC.",), "The in-context claim is decided on MQAR's hardest rung with an MHA + QK-norm "
     "control (DCFormer++'s 405 M configuration adds QK-norm its baseline lacks); the LM and ViT claims on Tables 5 "
     "and 6's decide stores. The compute multiplier (DC.compute) belongs to the scaling issue; DCPythia-6.9B vs "
     "Pythia-12B cannot be tested at this scale. The efficiency formula holds at 405 M, not at D = 64."),
    ("Collaborative heads (ColMHA)", "Cordonnier et al. 2020: key width, parameters, re-parametrization",
     "masked_lm_decide", "masked_lm.md", ("COL.",), "The NMT key-width table (verified) is stood in for by the masked "
     "character LM at D = 64: collaborative heads at D̃ ∈ {32, 16, 8} against concatenated heads with the same total "
     "key width (MHA's qk_dim). The exact re-parametrization at D̃ = D is computed; its half-size, no-retraining half "
     "needs a decomposition of trained weights and is not tested."),
    ("Mixture of Attention Heads (MoA)", "Zhang et al., EMNLP 2022: masked-LM gain, experts, parameters, balance",
     "masked_lm_decide", "masked_lm.md", ("MOA.",), "MoA's masked-LM claim and its sweep over experts (E ∈ {4, 8, 16} "
     "at k = 4) on the masked character LM, with an MHA given MoA(E = 16)'s parameters (SwitchHead's test); the "
     "expert loads are logged in every MoA cell. WMT14 translation is not run."),
    ("MMA", "Cui et al., WNGT 2019: mixed heads in the encoder setting", "masked_lm_decide", "masked_lm.md", ("MMA.",),
     "MMA's backward heads need a bidirectional model, so its claim is decided on the masked character LM; the "
     "decoder-only comparison (Table 1's concept task, where the backward heads see only themselves) is a second, "
     "weaker stand-in."),
)


def capability(df: pd.DataFrame) -> pd.DataFrame:
    """One row per arm, one column per rung "T=…, n=…": mean test accuracy (%) [95 % t-interval] (n seeds)."""
    acc = df[(df["metric"] == "test_acc") & (df["status"] == "ok")]
    if acc.empty:
        return pd.DataFrame()
    rows = {}
    for (arm, t, n), g in acc.groupby(["arm", "seq_len", "n_pairs"]):
        mean, lo, hi = report.t_interval(100 * g["value"].to_numpy(float))
        cell = f"{mean:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if pd.notna(lo) else "") + f" (n={len(g)})"
        rows.setdefault(arm, {})[f"T={int(t)}, n={int(n)}"] = cell
    order = sorted({c for r in rows.values() for c in r}, key=lambda c: tuple(int(x.split("=")[1]) for x in
                                                                                c.split(", ")))
    out = pd.DataFrame([{"arm": a, **{c: r.get(c, "–") for c in order}} for a, r in rows.items()])
    return out.sort_values("arm").reset_index(drop=True)


def capability_summary(results: str | Path) -> list[str]:
    """The MQAR capability table of the decide store (else the smoke one) as markdown lines, or []."""
    for folder in ("mqar_decide", "mqar"):
        path = Path(results) / folder / "mqar.jsonl"
        if not path.is_file():
            continue
        frame = pd.DataFrame([{**rec["cell"], **row} for rec in read_records(path) for row in rec.get("rows") or []])
        if frame.empty:
            continue
        if "status" not in frame:
            frame["status"] = "ok"
        if "phase" in frame:
            frame = frame[frame["phase"].fillna("tuned") == "tuned"]
        table = capability(frame)
        if table.empty:
            continue
        return ["## MQAR capability (associative recall per arm and rung)", "",
                f"Test accuracy at the query positions (% of queries), mean [95 % t-interval] (n seeds), from "
                f"`{folder}/mqar.jsonl` (the newest record of every cell; chance is 100/n %). The stand-in and its "
                "limits: the MQAR section below.", "", report.markdown_table(table), ""]
    return []


__all__ = ["PAPER_SECTIONS", "capability", "capability_summary"]
