"""The verdict table: one row per claim and preset, as a DataFrame, markdown and console lines."""

from __future__ import annotations

import pandas as pd

from ..report import markdown_table
from .verdicts import ALPHA, Verdict

COLUMNS = ("claim", "paper", "ours (effect [CI], n)", "verdict", "scope", "strongest control", "cost",
           "what would decide it at paper scale")


def _scope(v: Verdict) -> str:
    text = v.claim.scope.get(v.preset) or v.claim.scope.get("*") or v.preset
    return f"{text} [preset {v.preset}]" if v.preset != "any" else text


def _cost(v: Verdict) -> str:
    if v.cost_s <= 0:
        return "computed" if v.claim.rule == "analytic" else "–"
    return f"{v.cost_s:,.0f} s training" if v.cost_s < 3600 else f"{v.cost_s / 3600:.2f} h training"


def verdict_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    rows = []
    for v in verdicts:
        extra = f"; {v.note}" if v.note else ""
        rows.append({
            "claim": f"`{v.claim.id}` {v.claim.text} ({v.claim.source})",
            "paper": v.claim.paper,
            "ours (effect [CI], n)": v.ours + extra,
            "verdict": f"**{v.verdict}**",
            "scope": _scope(v),
            "strongest control": v.control,
            "cost": _cost(v),
            "what would decide it at paper scale": "; ".join(s for s in (v.claim.paper_scale, v.n_needed) if s),
            # machine-readable columns (CSV)
            "id": v.claim.id, "preset": v.preset, "verdict_plain": v.verdict, "n": v.n, "cost_s": v.cost_s,
            "context": v.context, "runs": " ".join(v.runs), "commits": " ".join(v.commits),
        })
    return pd.DataFrame(rows)


def verdict_markdown(verdicts: list[Verdict]) -> str:
    df = verdict_frame(verdicts)
    header = [f"Verdicts computed by `python -m attention_zoo.claims` from the stored rows (rules in "
              f"docs/claims.md): seed-paired effects, positive = the paper's treatment better; intervals are drawn at "
              f"each comparison's Holm–Bonferroni level within its table or sweep (family α = {ALPHA}); n < 5 "
              "seeds use a bootstrap interval and the exact sign-flip test, which cannot decide; effect sizes are "
              "compared with the paper's only where the rows are the paper's own task.", ""]
    return "\n".join(header) + "\n" + markdown_table(df[list(COLUMNS)]) if not df.empty else "_(no claims)_\n"


def verdict_lines(verdicts: list[Verdict]) -> list[str]:
    """One console line per verdict: id, preset, verdict, our effect."""
    return [f"{v.claim.id:<20} [{v.preset}] {v.verdict}: {v.ours}" for v in verdicts]
