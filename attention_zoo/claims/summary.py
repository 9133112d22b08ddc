"""The one-minute reading of the verdicts (docs/results.md, "Reading the report"): one line per claim grouped by paper,
a count line per paper,
the rows of the forest plot, the compute-multiplier leaderboard and how to read them. Every number comes from the
verdict objects (``Verdict.results``: each comparison's mean, interval at its Holm level, unit and n); nothing is
typed here but words."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from ..report import markdown_table
from .ledger_papers import PAPERS
from .table import split_headline
from .verdicts import KINDS, Result, Verdict

MAX_ROW = 160  # characters of one markdown source row of the summary table (the budget)
DAMCHA_PREFIXES = ("T1.", "T2.", "T3.", "T4.", "T5.", "T6.", "T7.", "D3.", "D4.", "E.", "F.", "G.", "H.", "I.")
TITLES = {"damcha": "DAMCHA (the paper under test)", "tha": "Talking-Heads Attention (Shazeer et al. 2020)",
          "dcmha": "DCFormer (Xiao et al. 2024)", "colmha": "Collaborative heads (Cordonnier et al. 2020)",
          "moa": "Mixture of Attention Heads (Zhang et al. 2022)", "mma": "MMA (Cui et al. 2019)",
          "scale": "Scale axis: compute multipliers vs MHA", "other": "Other claims"}
SHORT = {"damcha": "DAMCHA", "tha": "THA", "dcmha": "DCFormer", "colmha": "ColMHA", "moa": "MoA", "mma": "MMA",
         "scale": "scale", "other": "other"}  # the paper column of the summary table
UNIT_WORDS = (("percentage points", "pp"), (" (difference)", ""))  # abbreviations: a row's budget is 160 characters
# (group, claim-id prefixes): the longest matching prefix wins, so "DC." is DCFormer's and "D3." DAMCHA's; an id that
# matches none is "other" (a new ledger's claims show up, never vanish)
GROUPS = (("damcha", DAMCHA_PREFIXES), *((paper, (prefix,)) for paper, prefix in PAPERS.items()), ("scale", ("S.",)))
OTHER = "other"
SCALE_COMMAND = "python reproduce/scaling.py --preset decide --out results/scaling_decide"
MULT_PREFIX = "S.mult_"
LADDER_RULES = ("multiplier", "gap_trend")  # claims.scaling's rules: one verdict text, its headline first
LADDER_WORDS = ((" at the largest rung ", " at the top rung "), (" nats per decade of FLOPs", " nats/decade of FLOPs"))
# one rung of a multiplier claim's "every rung (FLOPs)" text (claims.scaling.multiplier_text writes it)
RUNG = re.compile(r"(D\d+×\d+): (\S+) \[(\S+), (\S+)\]( \(extrapolated\))?")

READING = (
    "**How to read this report.** Each line gives a claim's verdict and the one comparison that decides it (the first "
    "of the verdict's kind; the full table below has every comparison), with its mean effect, its interval and n "
    "seeds. Effects are oriented so that **positive means the paper's treatment is better**, in the unit named (% of "
    "the reference arm's metric, metric points, or a slope per unit of a setting). A **stand-in** is the task we "
    "ran in place of the paper's (e.g. a digits reconstruction MSE for CIFAR-10 FID at a few hundred steps on a "
    "CPU): a verdict on it is about the mechanism at this scale and budget. **Contradicted** means that, at this "
    "scale and budget, the interval excludes the paper's direction (or, on the paper's own task, its quoted size); "
    "it does not say the paper's numbers are wrong at its own scale. **Inconclusive** quotes the smallest effect the "
    "run could have seen (MDE); **not decidable** means too few seeds, a diverged or unlearned arm, or a run still "
    "moving at the end of its budget. Whether the answer changes with scale is the scale axis' question: its "
    "multipliers (leaderboard below) say whether an arm's advantage grows with compute, where this scale alone "
    "cannot tell. The figure draws each deciding effect **in the paper's direction** (positive: as the paper claims), "
    "so a contradicted claim sits left of zero or short of the paper's own effect (◇).")


def group_of(claim_id: str) -> str:
    """The paper a claim belongs to, by the longest matching id prefix; ``"other"`` where none matches."""
    if not isinstance(claim_id, str) or not claim_id:
        raise ValueError(f"claim_id: expected a non-empty claim id, got {claim_id!r}")
    hits = [(len(p), g) for g, prefixes in GROUPS for p in prefixes if claim_id.startswith(p)]
    return max(hits)[1] if hits else OTHER


def deciding(v: Verdict) -> Result | None:
    """The comparison that gives the claim its verdict: the first of the verdict's kind (as ``combine`` keeps the
    first reason), else the first with rows; None for a claim without comparisons (formulas, a ladder fit)."""
    with_rows = [r for r in v.results if r.test.n]
    return next((r for r in v.results if r.verdict == v.kind), with_rows[0] if with_rows else None)


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "∞" if math.isinf(x) else "–"
    return f"{x:+.3g}" if abs(x) < 1000 else f"{x:+.0f}"


def effect_parts(v: Verdict) -> tuple[str, str]:
    """(the deciding comparison's name, "-30.8 [-43.1, -18.5] % of mha's MSE, n = 10 (1/6)"), or ("", what stands
    in for an effect: a formula's reading, the reason it cannot be decided, "no rows yet")."""
    r = deciding(v)
    if r is None:
        if v.kind == "not run":
            return "", "no rows yet"
        if v.ours in ("", "–"):
            return "", v.verdict[len(v.kind):].lstrip(": ")
        # a ladder's verdict: its headline reading only ("… multiplier 112 [1.4, ∞] at the largest rung D48×1, n = 2")
        head = re.sub(r" \(n = (\d+); [^)]*\)", r", n = \1", v.ours)
        for long, short in LADDER_WORDS:
            head = head.replace(long, short)
        return "", head.split("; ")[0] if v.claim.rule in LADDER_RULES else head
    more = f" ({v.results.index(r) + 1}/{len(v.results)})" if len(v.results) > 1 else ""
    if not r.test.n:
        return r.name, "no rows"
    if r.diverged or r.gate:
        return r.name, f"no effect ({r.diverged or 'an arm did not learn'})"
    if r.test.method == "t":
        lo, hi = r.interval
        body = f"{_num(r.test.mean)} [{_num(lo)}, {_num(hi)}]"
    else:  # below 5 seeds: the seeds' range, never an interval
        body = f"{_num(r.test.mean)} (range {_num(r.test.low)}, {_num(r.test.high)})"
    unit = r.unit
    for long, short in UNIT_WORDS:
        unit = unit.replace(long, short)
    return r.name, f"{body} {unit}, n = {r.test.n}{more}"


def effect_text(v: Verdict) -> str:
    """"vs mha -30.8 [-43.1, -18.5] % of mha's MSE, n = 10 (1/6)", or what stands in for it."""
    return " ".join(x for x in effect_parts(v) if x)


def _scale_facts(v: Verdict) -> list[str]:
    """The steps from the verdict's scope facts (``data.run_facts``: "10 seeds; 600 steps; data digits; …" or
    "300–1500 steps run (median 540; early stopping)": the cap then, as "≤ 1500 steps")."""
    facts = [f for f in v.scope.split("; ") if " steps" in f][:1]
    return [f"≤ {f.split(' steps')[0].split('–')[-1]} steps" if "–" in f else f for f in facts]


def stand_in_text(v: Verdict) -> str:
    """What the verdict was decided on, and at what scale: "digits MSE for CIFAR-10 FID@Top-50, 600 steps"."""
    if v.kind == "not run":
        return f"`{v.claim.store_at(v.preset)}` store, preset {v.preset}"
    if v.preset == "any" or (not v.results and not v.scope):
        return "computed (formulas, counts)"
    what = v.stand_in.replace(" (stand-in for ", " for ").rstrip(")") if v.stand_in else ""
    if not what:
        data = next((f[5:] for f in v.scope.split("; ") if f.startswith("data ")), "")
        what = data or "the paper's task"
    return ", ".join([what, *_scale_facts(v), v.preset])


@dataclass
class Line:
    """One summary row: a claim, the claims folded into it (same rows), its verdict and its texts."""

    verdict: Verdict
    folded: list[str]

    @property
    def ids(self) -> list[str]:
        return [self.verdict.claim.id, *self.folded]

    @property
    def group(self) -> str:
        return group_of(self.verdict.claim.id)


def summary_lines_of(verdicts: list[Verdict]) -> list[Line]:
    """One line per headline verdict; a claim that re-reads another claim's rows at the same preset folds into it."""
    head, _ = split_headline(verdicts)
    lines = {v.claim.id: Line(v, []) for v in head}
    for v in head:
        target = lines.get(v.same_as) if v.same_as else None
        if target is not None and target.verdict.preset == v.preset and not target.verdict.same_as:
            target.folded.append(v.claim.id)
            del lines[v.claim.id]
    return list(lines.values())


def _w(text: str) -> int:
    """A text's width against the row budget: its UTF-8 bytes (≥ its characters), so a row holds the budget by
    either count (λ, ≤ and … take two or three bytes)."""
    return len(text.encode())


def _cut(text: str, room: int) -> str:
    if _w(text) <= room:
        return text
    while text and _w(text) > room - _w("…"):
        text = text[:-1]
    return text.rstrip() + "…"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_row(line: Line) -> str:
    """The markdown source row, at most MAX_ROW characters (and UTF-8 bytes). Compressed in this order until it fits:
    the stand-in loses the paper's task it stands for (the full table names it), the comparison's name is shortened,
    then the stand-in, then the effect are cut; the paper, the id and the verdict word are never cut."""
    v = line.verdict
    ids = f"`{v.claim.id}`" + (f" (+{', '.join(line.folded)})" if line.folded else "")
    word = f"**{v.kind}**"
    name, number = (_cell(x) for x in effect_parts(v))
    where = _cell(stand_in_text(v))
    room = MAX_ROW - _w(f"| {SHORT[line.group]} | {ids} | {word} |  |  |")

    def effect() -> str:
        return f"{name} {number}" if name else number

    if _w(effect()) + _w(where) > room and " for " in where:
        what, _, rest = where.partition(" for ")
        where = ", ".join([what, *rest.split(", ")[1:]])
    if _w(effect()) + _w(where) > room and name:
        name = _cut(name, max(room - _w(where) - _w(number) - 1, 12))
    if _w(effect()) + _w(where) > room:
        where = _cut(where, max(room - _w(effect()), min(_w(where), 30)))
    return f"| {SHORT[line.group]} | {ids} | {word} | {_cut(effect(), room - _w(where))} | {where} |"


def count_line(title: str, lines: list[Line]) -> str:
    """"DAMCHA: 31 claims — 5 supported, 12 contradicted, …" (every claim id once, folded ones included)."""
    kinds = Counter(line.verdict.kind for line in lines for _ in line.ids)
    total = sum(kinds.values())
    parts = [f"{kinds[k]} {k}" for k in KINDS if kinds[k]] + [f"{n} {k}" for k, n in kinds.items() if k not in KINDS]
    folded = sum(len(line.folded) for line in lines)
    tail = f" ({folded} re-read another claim's rows: one line with it)" if folded else ""
    return f"**{title}**: {total} claim{'s' if total != 1 else ''} — {', '.join(parts)}{tail}."


def summary_markdown(verdicts: list[Verdict], figure: str | None = "verdicts.png") -> list[str]:
    """The report's summary: a count line per paper, then one table (its rows grouped by paper, a paper column) of
    one row per claim — a claim that re-reads another's rows on that claim's row; then the figure's link."""
    if not verdicts:
        raise ValueError("verdicts: no verdicts to summarise")
    lines = summary_lines_of(verdicts)
    order = [g for g, _ in GROUPS] + [OTHER]
    out = ["| paper | claim | verdict | deciding effect [interval] unit, n | decided on (stand-in, scale) |",
           "|---|---|---|---|---|"]
    counts = []
    for group in order:
        mine = [ln for ln in lines if ln.group == group]
        if not mine:
            continue
        counts.append("- " + count_line(TITLES[group], mine))
        out += [summary_row(ln) for ln in mine]
    fig = [f"![verdicts]({figure})", "", "The forest plot: every decided claim's deciding comparison with its "
           "interval and, where the paper quotes one, the paper's effect; colour by verdict.", ""] if figure else []
    return [*counts, "", *out, "", *fig]


def forest_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per summary line whose deciding comparison has an interval (n ≥ 5): label, verdict kind, effect and
    interval **in the paper's direction** (e = direction × effect, what the verdict rule tests: positive = as the
    paper claims), unit, the MDE and the paper's quoted effect in the same orientation (NaN where it quotes none)."""
    rows = []
    for line in summary_lines_of(verdicts):
        r = deciding(line.verdict)
        if r is None or r.test.method != "t" or r.diverged or r.gate or not math.isfinite(r.interval[0]):
            continue
        relative = r.unit.startswith("%") and "per unit" not in r.unit
        if not relative and not (math.isfinite(r.mde) and r.mde > 0):  # no MDE to standardise it by: not drawn
            continue
        d = r.direction
        lo, hi = sorted((d * r.interval[0], d * r.interval[1]))
        label = line.verdict.claim.id + (f" (+{len(line.folded)})" if line.folded else "") + f": {r.name}"
        rows.append({"label": label, "group": TITLES[line.group], "kind": line.verdict.kind, "effect": d * r.test.mean,
                     "low": lo, "high": hi, "unit": r.unit, "n": r.test.n, "mde": r.mde,
                     "relative": relative,
                     "paper": d * r.comp.paper_effect if r.comp.paper_effect is not None else math.nan})
    return pd.DataFrame(rows, columns=["label", "group", "kind", "effect", "low", "high", "unit", "n", "mde",
                                       "relative", "paper"])


def multipliers(verdicts: list[Verdict]) -> pd.DataFrame:
    """The leaderboard: per arm (each ``S.mult_<arm>`` headline verdict) its verdict and its multiplier vs MHA with
    the interval at every rung, from the verdict's per-rung text (FLOPs reading). Empty where none was run."""
    head, _ = split_headline(verdicts)
    rows = []
    for v in head:
        if not v.claim.id.startswith(MULT_PREFIX):
            continue
        flops = v.ours.split("every rung (FLOPs): ", 1)[-1].split("; CPU-seconds", 1)[0] if v.ours else ""
        cells = {m[1]: f"{m[2]} [{m[3]}, {m[4]}]" + ("ᵉ" if m[5] else "") for m in RUNG.finditer(flops)}
        rows.append({"arm": v.claim.id[len(MULT_PREFIX):], "verdict": v.kind, "preset": v.preset, **cells})
    return pd.DataFrame(rows)


def leaderboard_markdown(verdicts: list[Verdict]) -> list[str]:
    """The multiplier leaderboard as markdown lines; "not run yet" with the command where no ladder was run."""
    board = multipliers(verdicts)
    head = ["### Compute multipliers vs MHA (the scale axis)", ""]
    if board.empty or board.drop(columns=["arm", "verdict", "preset"]).empty:
        return head + [f"Not run yet: `{SCALE_COMMAND}`.", ""]
    return head + ["Each arm's compute multiplier over MHA (the compute MHA needs for the arm's loss ÷ the arm's "
                   "compute; > 1: the arm needs less) with its bootstrap interval, at each rung of the ladder "
                   "(D width × layers); ᵉ: read off MHA's curve outside its measured range.", "",
                   markdown_table(board.fillna("–")).rstrip("\n"), ""] + (
        [] if (board["preset"] == "decide").any() else [f"The deciding ladder is not run yet: `{SCALE_COMMAND}`.", ""])


__all__ = ["GROUPS", "MAX_ROW", "READING", "TITLES", "Line", "count_line", "deciding", "effect_text",
           "forest_frame", "group_of", "leaderboard_markdown", "multipliers", "stand_in_text", "summary_lines_of",
           "summary_markdown", "summary_row"]
