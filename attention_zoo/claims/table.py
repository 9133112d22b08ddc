"""The verdict tables: one headline row per claim (its most decisive preset), the other presets as "pipeline checks
and smaller budgets", a one-line count, as a DataFrame (plain text, for CSV), markdown and console lines."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from ..report import markdown_table
from .spec import base_preset
from .verdicts import ALPHA, KINDS, Verdict

COLUMNS = ("claim", "paper", "ours (effect, interval, n)", "verdict", "robustness", "scope", "strongest control",
           "gain over the budget", "cost", "what would decide it at paper scale")
# The preset that decides a claim where several have rows: the paper's configuration, then the CPU-scale decide
# preset, then the smoke preset (a pipeline check).
RANK = {"any": 0, "paper": 1, "decide": 2, "smoke": 3}


def _rank(preset: str) -> float:
    """Lower decides first; a preset's shared-setting rows come after its tuned ones."""
    return RANK.get(base_preset(preset), 9) + (0.5 if preset != base_preset(preset) else 0.0)


def _scope(v: Verdict) -> str:
    text = v.claim.scope.get(v.preset) or v.claim.scope.get(base_preset(v.preset)) or v.claim.scope.get("*") \
        or v.preset
    facts = f"; {v.scope}" if v.scope else ""
    return f"{text}{facts} [preset {v.preset}]" if v.preset != "any" else text


def _cost(v: Verdict) -> str:
    if v.cost_s <= 0:
        return "computed" if v.claim.rule == "analytic" else "–"
    unit = "CPU-s" if v.cost_unit == "CPU" else "s (wall)"
    if v.cost_s < 3600:
        return f"{v.cost_s:,.0f} {unit} training"
    return f"{v.cost_s / 3600:.2f} {'CPU-h' if v.cost_unit == 'CPU' else 'h (wall)'} training"


def split_headline(verdicts: list[Verdict]) -> tuple[list[Verdict], list[Verdict]]:
    """(one verdict per claim from its most decisive preset, the others), each in the ledger's order."""
    best: dict[str, Verdict] = {}
    for v in verdicts:
        cur = best.get(v.claim.id)
        if cur is None or (v.kind != "not run", -_rank(v.preset)) > (cur.kind != "not run", -_rank(cur.preset)):
            best[v.claim.id] = v
    chosen = set(map(id, best.values()))
    return [v for v in verdicts if id(v) in chosen], [v for v in verdicts if id(v) not in chosen]


def count_line(verdicts: list[Verdict]) -> str:
    """Each set of rows counted once: a claim that re-reads another claim's rows (``same_as``) is counted with it,
    and the line says how many do."""
    own = [v for v in verdicts if not v.same_as]
    counts = Counter(v.kind for v in own)
    parts = [f"{counts[k]} {k}" for k in KINDS if counts[k]]
    again = len(verdicts) - len(own)
    verb = "re-reads another claim's rows and is" if again == 1 else "re-read another claim's rows and are"
    tail = f" ({again} more claim{'s' if again != 1 else ''} {verb} counted with it)" if again else ""
    return f"{len(own)} claim{'s' if len(own) != 1 else ''}: " + ", ".join(parts) + tail + "."


def verdict_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """Plain-text rows (the CSV): every verdict, with ``headline`` marking the one row per claim."""
    head, _ = split_headline(verdicts)
    heads = set(map(id, head))
    rows = []
    for v in verdicts:
        same = f"same rows as {v.same_as}: decided once, counted once in its family; " if v.same_as else ""
        rows.append({
            "claim": f"{v.claim.id} {v.claim.text} ({v.claim.source})",
            "paper": v.claim.paper,
            "ours (effect, interval, n)": same + v.ours + (f"; {v.note}" if v.note else ""),
            "verdict": v.verdict,
            "scope": _scope(v),
            "strongest control": v.control,
            "gain over the budget": v.budget or "–",
            "cost": _cost(v),
            "what would decide it at paper scale": "; ".join(s for s in (v.claim.paper_scale, v.n_needed) if s),
            "robustness": (f"one Holm family: {v.one_family}; at the runner-up setting: {v.runner_up}"
                           if v.one_family else "–"),
            "one Holm family": v.one_family or "–", "at the runner-up setting": v.runner_up or "–",
            "stand-in": v.stand_in or "–",
            # machine-readable columns
            "id": v.claim.id, "preset": v.preset, "headline": id(v) in heads, "kind": v.kind, "n": v.n,
            "cost_s": v.cost_s, "same_as": v.same_as, "context": v.context, "runs": " ".join(v.runs),
            "commits": " ".join(v.commits),
        })
    return pd.DataFrame(rows)


def _markdown_rows(df: pd.DataFrame) -> str:
    df = df.assign(claim="`" + df["id"] + "` " + df["claim"].str.split(" ", n=1).str[1],
                   verdict="**" + df["verdict"] + "**")
    return markdown_table(df[list(COLUMNS)])


HEADER = ("Verdicts computed by `python -m attention_zoo.claims` from the stored rows (rules in docs/claims.md). "
          "Effects are seed-paired, positive = the treatment (usually DAMCHA) better, in the unit each row names; "
          "a control's gain and DAMCHA's gap to it are in the same unit against the same reference. With n ≥ 5 "
          "seeds the interval is Student-t at the comparison's Holm–Bonferroni level within its run and table "
          f"(family α = {ALPHA}); below 5 seeds the range of the seeds is shown and nothing is decided. A comparison "
          "in which an arm did not beat its task's trivial predictor is not decidable. A verdict on a stand-in is "
          "about the mechanism at this scale, not about CIFAR, WMT or ImageNet; the last column says what the "
          "paper-scale test would take.")


def verdict_markdown(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "_(no claims)_\n"
    head, rest = split_headline(verdicts)
    df = verdict_frame(verdicts)
    out = [HEADER, "", f"**{count_line(head)}**", "", _markdown_rows(df[df["headline"]])]
    if rest:
        out += ["### Pipeline checks and smaller budgets", "",
                "The same claims at the presets that do not decide them (a smaller budget, or the smoke preset that "
                "checks the pipeline); shown so a reader sees whether the answer moves with the budget.", "",
                _markdown_rows(df[~df["headline"]])]
    return "\n".join(out)


def verdict_lines(verdicts: list[Verdict]) -> list[str]:
    """One console line per verdict: id, preset, verdict, our effect."""
    return [f"{v.claim.id:<20} [{v.preset}] {v.verdict}: {v.ours}" for v in verdicts]
