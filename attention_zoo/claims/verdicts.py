"""Verdicts, computed from stored rows (rules in docs/claims.md).

For each claim at each preset with rows:
1. the learned-at-all gate marks cells that do not beat their task's trivial predictor (``gate``);
2. every comparison gives per-seed effects (``effects``: positive = treatment better, in the comparison's unit) and
   a seed-paired test (``stats.paired_test``: t for n ≥ 5; below, the range of the seeds and the exact sign-flip
   test, which cannot decide);
3. within a family — one table or figure of one run (store × preset) — the p-values of the *distinct* comparisons
   are Holm-adjusted (two claims that read the same rows count once); each interval is drawn at its comparison's
   Holm level, and the MDE is taken at that level;
4. with e = direction × effect (positive: as the paper says), a comparison is **supported** when its adjusted
   p < α and e's interval lies above 0; **contradicted** when it lies below 0, or — where the rows are the paper's
   own task and the paper quotes an effect — when the whole interval lies short of the paper's effect;
   **explained by a control** when supported but matched by a control (``controls``); **not decidable** when a
   seed of either arm diverged (``data.diverged_units``: "not decidable: k of n seeds of <arm> diverged") or did
   not learn, or with fewer than 5 seeds; **inconclusive (MDE …)** otherwise; the MDE is taken at the family's
   fixed level α/m (m: its distinct decidable comparisons), not at the comparison's data-dependent Holm rank;
   **budget-bound** (``budget_bound``): a comparison whose effect still moves between the last two budget
   fractions, in the direction that could overturn its verdict, reads "not decidable at this budget";
5. a claim's comparisons combine: contradicted if any is; else not decidable if any is; else inconclusive if any
   is; else equivalent if any is (a claim with an equivalence margin: the interval inside ±margin, two one-sided
   tests); else explained by a control if any is; else supported.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from . import stats
from .analytic import ANALYTIC
from .controls import ControlResult, check_controls, control_text, interval_text
from .data import StoreRows, diverged_units, matches, metric_inputs, metric_rows, run_facts
from .effects import arms_rows, budget_curve, budget_movement, cell_costs, comparison_effects, unit_of
from .gate import apply_gate, arm_failures
from .ledger import CLAIMS
from .scaling import RULES as SCALING_RULES
from .scaling import decide_claims as scaling_claims
from .scrutiny import _frac, budget_bound, positive_control, seeds_needed, seeds_to_detect, stand_in  # noqa: F401
from .spec import RUNNER_UP, Claim, Comparison, base_preset, resolve

ALPHA = 0.05
KINDS = ("supported", "contradicted", "equivalent", "explained by a control", "inconclusive", "not decidable",
         "not run")


@dataclass
class Result:
    """One comparison's numbers (effects oriented: positive = treatment better)."""

    comp: Comparison
    effects: np.ndarray
    test: stats.PairedResult
    unit: str
    key: tuple = ()  # what identifies its rows: equal keys are the same comparison
    level: float = ALPHA  # Holm level of this comparison
    p_adj: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)
    mde: float = math.nan
    verdict: str = "not run"
    why: str = ""  # the direction of a contradiction, the reason a comparison is not decidable
    gate: str = ""  # non-empty: an arm did not learn
    diverged: str = ""  # non-empty: seeds of an arm diverged ("2 of 10 seeds of damcha diverged")
    controls: list[ControlResult] = field(default_factory=list)
    budget: list[tuple[float, float, int]] = field(default_factory=list)
    costs: dict = field(default_factory=dict)
    family_m: int = 1  # distinct decidable comparisons in its Holm family: the MDE's level is ALPHA / family_m
    movement: tuple | None = None  # (budget fraction before, last fraction, per-seed change of the effect)

    @property
    def name(self) -> str:
        return self.comp.name

    @property
    def direction(self) -> int:
        return self.comp.direction


@dataclass
class Verdict:
    claim: Claim
    preset: str
    verdict: str
    results: list[Result] = field(default_factory=list)
    ours: str = "–"
    note: str = ""
    control: str = "–"
    n: int = 0
    cost_s: float = 0.0
    context: str = ""
    runs: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    n_needed: str = ""
    scope: str = ""
    same_as: str = ""  # the claim whose rows (and so whose comparisons) these are
    budget: str = ""
    cost_unit: str = "CPU"
    stand_in: str = ""  # "digits MSE (stand-in for CIFAR-10 FID@Top-50)" where the rows are not the paper's task
    one_family: str = ""  # robustness: the verdict under one Holm family over every decide comparison
    runner_up: str = ""  # robustness: the verdict with every arm at its runner-up setting

    @property
    def kind(self) -> str:
        return next((k for k in KINDS if self.verdict.startswith(k)), self.verdict)


# ---- one comparison --------------------------------------------------------------------------------------------
def comparison_verdict(res: Result, paper_task: bool) -> str:
    t = res.test
    if res.diverged:  # a diverged seed is a failure of its arm: dropping it would keep the runs that favour the arm
        res.why = res.diverged
        return "not decidable"
    if res.gate:
        res.why = f"stand-in not learned: {res.gate}"
        return "not decidable"
    if t.n == 0:
        return "not run"
    if not t.decidable:
        res.why = f"at n = {t.n}" if t.n > 1 else "with one seed"
        return "not decidable"
    lo, hi = res.interval
    e_lo, e_hi = sorted((res.direction * lo, res.direction * hi))
    decided = math.isfinite(res.p_adj) and res.p_adj < ALPHA
    if decided and e_hi < 0:
        res.why = contradiction_words(res)
        return "contradicted"
    quoted = res.comp.paper_effect is not None and paper_task
    if quoted and math.isfinite(e_hi) and e_hi < res.direction * res.comp.paper_effect:
        res.why = f"the whole interval lies short of the paper's {res.comp.paper_effect:+g} {res.unit}"
        return "contradicted"
    if decided and e_lo > 0:
        return "supported"
    return "inconclusive"


def contradiction_words(res: Result) -> str:
    treat = res.comp.treatment.label
    if res.comp.reference is None or "per unit" in res.unit:
        return "the slope has the opposite sign"
    ref = res.comp.reference.label
    if res.direction > 0:
        return f"{treat} worse than {ref}"
    return f"{treat} better than the paper states (not worse than {ref})"


def noninferior_verdict(res: Result, margin: float) -> str:
    """One-sided: supported when e's lower bound (at the comparison's level) exceeds −margin with p < α."""
    if res.diverged or res.gate or not res.test.decidable:
        return comparison_verdict(res, False)
    e = res.direction * res.effects
    one = stats.paired_test(e + margin, 1 - 2 * res.level)
    p_one = one.p / 2 if one.mean > 0 else 1 - one.p / 2
    res.interval = (one.low - margin, one.high - margin)
    res.p_adj = p_one
    if math.isfinite(p_one) and p_one < res.level:
        return "supported"
    worse = stats.paired_test(-(e + margin), 1 - 2 * res.level)
    p_worse = worse.p / 2 if worse.mean > 0 else 1 - worse.p / 2
    if math.isfinite(p_worse) and p_worse < res.level:
        res.why = f"{res.comp.treatment.label} worse than {res.comp.reference.label} by more than the margin"
        return "contradicted"
    return "inconclusive"


def combine(results: list[Result]) -> str:
    """The claim's verdict from its comparisons' (the first reason of the deciding kind is kept)."""
    verdicts = [r.verdict for r in results]
    if not verdicts or all(v == "not run" for v in verdicts):
        return "not run"
    for kind in ("contradicted", "not decidable"):
        hit = [r for r in results if r.verdict == kind]
        if hit:
            why = hit[0].why
            return f"{kind} {why}" if why.startswith(("at ", "with ")) else f"{kind}: {why}" if why else kind
    if "inconclusive" in verdicts or "not run" in verdicts:
        return "inconclusive"
    if hit := [r for r in results if r.verdict == "equivalent"]:  # the claimed difference is absent there
        return f"equivalent: {hit[0].name} {hit[0].why}"
    return "explained by a control" if "explained by a control" in verdicts else "supported"


def describe(res: Result) -> str:
    """"name: mean [interval at the comparison's Holm level] unit (n)"; below 5 seeds the range of the seeds."""
    t = res.test
    if res.diverged:
        return f"{res.name}: no effect reported ({res.diverged})"
    if res.gate:
        return f"{res.name}: no effect reported (stand-in not learned)"
    if t.n == 0:
        return f"{res.name}: no rows"
    shown = replace(t, low=res.interval[0], high=res.interval[1]) if t.method == "t" else t
    return f"{res.name}: {interval_text(shown)} {res.unit} (n = {t.n})"


# ---- one claim -------------------------------------------------------------------------------------------------
def _claim_frame(claim: Claim, preset: str, rows: StoreRows) -> tuple[pd.DataFrame, dict]:
    where = {k: v for k, v in ((k, resolve(v, preset)) for k, v in claim.where.items()) if v is not None}
    frame = rows.frame[matches(rows.frame, where)] if where else rows.frame
    return frame, where


def row_key(claim: Claim, preset: str, comp: Comparison, where: dict) -> tuple:
    """Everything that determines a comparison's per-seed effects; equal keys read the same rows the same way."""
    arms = [(sorted(a.where.items()), a.reduce, a.over) if a else None for a in (comp.treatment, comp.reference)]
    return (claim.store_name, preset, repr((resolve(claim.metric, preset), sorted(where.items()),
                                            sorted(comp.where.items()), arms, claim.rule, claim.effect, claim.better,
                                            claim.over, claim.pair_on, comp.direction)))


def claim_results(claim: Claim, preset: str, rows: StoreRows) -> list[Result]:
    frame, where = _claim_frame(claim, preset, rows)
    metric = resolve(claim.metric, preset)
    df = metric_rows(frame, metric)
    # the gate's verdict on this metric's rows (every status): a text-only failure does not touch an NLL
    of_metric = frame[frame["metric"].isin(metric_inputs(metric))] if "metric" in frame else frame
    out = []
    for comp in (c.at(preset) for c in claim.comparisons):
        eff = comparison_effects(df, claim, comp)
        arms = arms_rows(frame, comp, (comp.treatment, comp.reference))
        res = Result(comp, eff, stats.paired_test(eff), unit_of(claim, comp, preset),
                     row_key(claim, preset, comp, where), costs=cell_costs(arms))
        failed = []
        for arm in (comp.treatment, comp.reference):
            if arm is not None:
                units, bad, reason = arm_failures(arms_rows(of_metric, comp, (arm,)), claim.pair_on)
                if bad:
                    failed.append(f"{arm.label} ({bad} of {units} seeds: {reason})")
        res.gate = "; ".join(failed)
        res.diverged = "; ".join(
            f"{bad} of {units} seeds of {arm.label} diverged" for arm in (comp.treatment, comp.reference)
            if arm is not None for units, bad in [diverged_units(arms_rows(of_metric, comp, (arm,)), claim.pair_on)]
            if bad)
        res.budget = budget_curve(frame, claim, comp, metric)
        res.movement = budget_movement(frame, claim, comp, metric)
        out.append(res)
    return out


def decide(stores: dict[tuple[str, str], StoreRows], claims: tuple[Claim, ...] = CLAIMS) -> list[Verdict]:
    """Every claim at every preset that has rows (a claim without any: one "not run" row)."""
    gated = {key: _gated(rows) for key, rows in stores.items()}
    verdicts: list[Verdict] = []
    partial: list[tuple[Claim, str, StoreRows, list[Result]]] = []
    ladders: list[tuple[Claim, str, StoreRows]] = []
    for claim in claims:
        if not claim.needs_rows:
            verdicts.append(ANALYTIC[claim.analytic](claim, "any", StoreRows(pd.DataFrame(), None, "", [], []),
                                                     Verdict))
            continue
        presets = sorted(p for (store, p) in gated if store == claim.store_at(p))
        if not presets:
            first = next(iter(claim.scope))
            verdicts.append(Verdict(claim, first if first != "*" else "smoke", "not run",
                                    note=f"no rows in any `{claim.store_name}.jsonl`"))
            continue
        for preset in presets:
            rows = gated[(claim.store_at(preset), preset)]
            if claim.rule == "analytic":
                verdicts.append(ANALYTIC[claim.analytic](claim, preset, rows, Verdict))
            elif claim.rule in SCALING_RULES:  # a ladder's fits (claims.scaling), Holm-adjusted there
                ladders.append((claim.at(preset), preset, rows))
            else:
                at = claim.at(preset)
                partial.append((at, preset, rows, claim_results(at, preset, rows)))
    verdicts += scaling_claims(ladders, Verdict)
    pooled = [(c, p, rows, [copy.copy(r) for r in res]) for c, p, rows, res in partial if p == "decide"]
    _holm(partial)
    first_reader: dict[tuple, str] = {}
    for claim, preset, rows, results in partial:
        keys = tuple(r.key for r in results)
        same = first_reader.setdefault(keys, claim.id)
        verdicts.append(finish(claim, preset, rows, results, same_as="" if same == claim.id else same))
    robustness(verdicts, pooled)
    originals = {c.id: c for c in claims}
    for v in verdicts:
        name_stand_in(v, originals.get(v.claim.id, v.claim))
    order = {c.id: i for i, c in enumerate(claims)}
    return sorted((v for v in verdicts if not v.preset.endswith(RUNNER_UP)),
                  key=lambda v: (order.get(v.claim.id, 0), v.preset))


def _holds(kind: str, other: str | None) -> str:
    return "not run" if other is None else "holds" if other == kind else f"changes (→ {other})"


def robustness(verdicts: list[Verdict], pooled: list) -> None:
    """The decide verdicts' two robustness columns: the verdict kind under one Holm family over every decide
    comparison of every store (``pooled``: the decide claims' comparisons, not yet adjusted), and the verdict kind
    with every arm at its runner-up setting (the "<preset>, runner-up setting" rows); "holds" or "changes (→ …)"."""
    _holm(pooled, family=lambda claim, preset: ("every decide comparison",))
    one = {c.id: finish(c, p, rows, res).kind for c, p, rows, res in pooled}
    runner = {v.claim.id: v.kind for v in verdicts if v.preset == f"decide, {RUNNER_UP}"}
    for v in verdicts:
        if v.preset == "decide" and v.claim.rule not in ("analytic", *SCALING_RULES):
            v.one_family = _holds(v.kind, one.get(v.claim.id))
            v.runner_up = _holds(v.kind, runner.get(v.claim.id))


def _gated(rows: StoreRows) -> StoreRows:
    frame, checked = apply_gate(rows.frame, rows.path.parent if rows.path is not None else None)
    return StoreRows(frame, rows.path, rows.context_id, rows.run_ids, rows.commits, checked)


def _family(claim: Claim, preset: str) -> tuple:
    """A Holm family: one claim family at one preset. The DAMCHA paper's families each read one store (one table or
    figure of one run); a baseline paper's family (``THA``, ``DCMHA``, …) spans the stores its stand-ins wrote."""
    return preset, claim.family


def _holm(partial, family=_family) -> None:
    """Holm within each family over its distinct comparisons; duplicates take their first reader's level."""
    families: dict[tuple, dict[tuple, Result]] = {}
    for claim, preset, _, results in partial:
        if claim.rule == "noninferior":
            continue
        fam = families.setdefault(family(claim, preset), {})
        for r in results:
            fam.setdefault(r.key, r)
    canonical: dict[tuple, Result] = {}
    for fam in families.values():
        distinct = list(fam.values())
        p_adj, levels = stats.holm([r.test.p if r.test.decidable else math.nan for r in distinct], ALPHA)
        m = max(1, sum(math.isfinite(p) for p in p_adj))
        for r, p, lvl in zip(distinct, p_adj, levels):
            r.p_adj, r.level, r.family_m = p, (lvl if math.isfinite(lvl) else ALPHA), m
            canonical[r.key] = r
    for _, _, _, results in partial:
        for r in results:
            if r.key in canonical:
                c = canonical[r.key]
                r.p_adj, r.level, r.family_m = c.p_adj, c.level, c.family_m


def finish(claim: Claim, preset: str, rows: StoreRows, results: list[Result], same_as: str = "") -> Verdict:
    paper_task = base_preset(preset) in claim.paper_task
    frame, _ = _claim_frame(claim, preset, rows)
    for r in results:
        t = stats.paired_test(r.effects, 1 - r.level)
        r.interval = (t.low, t.high)
        if claim.rule == "noninferior":
            r.verdict = noninferior_verdict(r, claim.margin)
        else:
            r.verdict = comparison_verdict(r, paper_task)
        if r.test.decidable:
            r.mde = stats.mde(r.test.n, r.test.sd, ALPHA / r.family_m)  # the family's fixed worst-case level
        if claim.controls and r.test.n:
            r.controls = check_controls(metric_rows(frame[matches(frame, r.comp.where)],
                                                    resolve(claim.metric, preset)), claim, r.comp, r.level)
            if r.verdict == "supported" and r.direction > 0 and any(c.explains for c in r.controls):
                r.verdict = "explained by a control"
                r.why = "matched by " + ", ".join(c.name for c in r.controls if c.explains)
        if claim.equivalence and r.verdict == "inconclusive" and stats.tost(r.effects, claim.equivalence, r.level)[0]:
            r.verdict, r.why = "equivalent", f"within ±{claim.equivalence:g} {r.unit}"  # two one-sided tests
        if r.verdict in ("supported", "contradicted", "inconclusive") and (bound := budget_bound(r)):
            r.verdict, r.why = "not decidable", f"at this budget: {bound}"
    control_note = positive_control(claim, preset, frame, results)
    costs = {k: v for r in results for k, v in r.costs.items()}
    v = Verdict(claim, preset, combine(results), results, n=min((r.test.n for r in results if r.test.n), default=0),
                cost_s=sum(s for s, _ in costs.values()), context=rows.context_id, runs=rows.run_ids,
                commits=rows.commits, same_as=same_as,
                cost_unit="CPU" if all(u == "CPU" for _, u in costs.values()) else "wall")
    v.ours = "; ".join(describe(r) + (f" → {r.verdict}" if len(results) > 1 else "") for r in results) or "–"
    if v.kind == "inconclusive":
        mdes = [(r.mde, r.unit) for r in results if r.verdict == "inconclusive" and math.isfinite(r.mde)]
        if mdes:
            mde, unit = max(mdes)
            v.verdict = f"inconclusive (MDE {mde:.2g} {unit})"
    notes = []
    if any(r.test.n and not r.test.decidable for r in results):
        n = min(r.test.n for r in results if r.test.n)
        notes.append(f"the sign-flip test cannot reject at n = {n} (smallest p = {2 / 2 ** n:.2g}); no MDE is "
                     f"quoted below {stats.DECIDABLE_N} seeds")
    if claim.rule == "noninferior":
        notes.append(f"non-inferiority margin {claim.margin:g} {results[0].unit if results else ''}")
    if not rows.gate_checked:
        notes.append("learned-at-all gate: no trivial-predictor reference in this store (not checked)")
    if control_note:
        notes.append(control_note)
    v.note = "; ".join(notes)
    v.control = " | ".join(s for r in results if (s := control_text(r.comp, r.controls, r.unit))) or "–"
    v.budget = "; ".join(
        f"{r.name}: " + ", ".join(f"{_frac(f)} {m:+.2f}" for f, m, _ in r.budget) for r in results if r.budget)
    v.n_needed = next((s for r in results if r.verdict == "inconclusive" and (s := seeds_needed(r, paper_task))), "")
    v.scope = run_facts(frame)
    return v


def name_stand_in(v: Verdict, original: Claim) -> None:
    """Say in the verdict what it was decided on where that is a stand-in for the paper's data or metric."""
    v.stand_in = stand_in(original, v.preset)
    if v.stand_in and v.kind in ("supported", "contradicted", "explained by a control", "inconclusive"):
        v.verdict = f"{v.kind} on {v.stand_in}{v.verdict[len(v.kind):]}"


__all__ = ["ALPHA", "KINDS", "Result", "Verdict", "decide"]
