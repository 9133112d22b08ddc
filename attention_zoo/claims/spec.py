"""The shape of a claim: arms, comparisons and the rule that decides them (the data is in ``ledger.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

PRESETS = ("smoke", "decide", "paper")
RULES = ("all", "noninferior", "slope", "analytic", "multiplier", "gap_trend")
EFFECTS = ("relative", "difference", "points")


@dataclass(frozen=True)
class ByPreset:
    """A value that depends on the preset (a dataset or metric standing in for the paper's at smoke scale)."""

    values: tuple[tuple[str, object], ...]

    def get(self, preset: str):
        d = dict(self.values)
        return d.get(preset, d.get(base_preset(preset), d.get("*")))


def by_preset(**values) -> ByPreset:
    """``by_preset(smoke="digits", paper="cifar10")``; ``_`` (written ``any=``) is the fallback for other presets."""
    if "any" in values:
        values["*"] = values.pop("any")
    return ByPreset(tuple(values.items()))


SHARED = "shared setting"  # the secondary rows of a tuned preset: every arm at the one setting used before tuning
RUNNER_UP = "runner-up setting"  # a tuned preset's final seeds at each arm's second-best setting (a robustness check)


def base_preset(preset: str) -> str:
    """"decide" for "decide" and for its secondary rows "decide, shared setting"."""
    return preset.split(",", 1)[0]


def resolve(value, preset: str):
    return value.get(preset) if isinstance(value, ByPreset) else value


def _resolved(where: dict, preset: str) -> dict:
    return {k: resolve(v, preset) for k, v in where.items()}


@dataclass(frozen=True)
class Arm:
    """Rows of one arm: column filters; ``reduce`` over column ``over`` collapses several rows of a pairing unit into
    one value: "best"/"worst" by the metric's direction (e.g. the weakest depth of a seed), "first"/"last" the row
    with the smallest/largest ``over`` (e.g. the deepest generator, the last snapshot)."""

    label: str | ByPreset
    where: dict = field(default_factory=dict)
    reduce: str | None = None
    over: str | None = None

    def at(self, preset: str) -> Arm:
        """This arm at ``preset``: its label and filters that depend on the preset resolved."""
        return replace(self, label=resolve(self.label, preset), where=_resolved(self.where, preset))


@dataclass(frozen=True)
class Comparison:
    """Treatment vs reference on the rows that match ``where`` (besides the arms' own filters), paired on the
    claim's ``pair_on`` columns. ``direction``: +1 when the paper says the treatment is better, −1 worse.
    ``paper_effect``: the paper's effect in the claim's effect unit and orientation (positive = treatment better),
    where it quotes one; it is only compared where the scope is the paper's task."""

    name: str | ByPreset
    treatment: Arm
    reference: Arm | None  # None: the treatment's own trend (slope rule)
    where: dict = field(default_factory=dict)
    direction: int = 1
    paper_effect: float | None = None

    def at(self, preset: str) -> Comparison:
        """This comparison at ``preset`` (e.g. a baseline that ran as the paper's authors' code at one preset and in
        its original form at another)."""
        return replace(self, name=resolve(self.name, preset), treatment=self.treatment.at(preset),
                       reference=self.reference.at(preset) if self.reference else None,
                       where=_resolved(self.where, preset))


@dataclass(frozen=True)
class Claim:
    """One claim of the paper and how this harness tests it.

    ``rule``: ``all`` — every comparison must hold (a seed-paired test each; Holm within ``family``);
    ``noninferior`` — the treatment is no worse than the reference by more than ``margin`` (one-sided test);
    ``slope`` — the per-seed least-squares slope over ``over`` of the effect (or of the treatment's metric when
    the comparison has no reference) has the paper's sign; ``analytic`` — decided by ``analytic`` (a function name
    in ``verdicts.ANALYTIC``) from formulas and measured counts; ``multiplier`` — the treatment's compute multiplier
    over the reference at the largest rung of a ladder store against ``margin`` (the multiplier claimed, default 1),
    ``gap_trend`` — the slope of its gap to the reference over log compute is negative (``claims.scaling``).
    ``scope`` maps presets to what the rows measure there; ``paper_task`` lists the presets whose rows are the
    paper's own task, the only ones where a quoted effect size is compared.
    ``controls``: control arms whose gain over the reference could explain the treatment's.
    """

    id: str
    text: str
    source: str
    paper: str  # the paper's numbers, as quoted
    experiment: str  # the script / results folder whose store holds the rows
    metric: str | ByPreset
    better: str | ByPreset  # "lower" | "higher" (by preset where the metric differs, e.g. BERTScore vs NLL)
    effect: str  # relative (% of the reference) | difference (metric units) | points (100 × fraction difference)
    comparisons: tuple[Comparison, ...]
    family: str
    scope: dict
    paper_task: tuple[str, ...] = ()
    rule: str = "all"
    store: str | ByPreset | None = None  # default: the experiment's name (a preset may read another store)
    pair_on: tuple[str, ...] = ("seed",)
    where: dict = field(default_factory=dict)
    controls: tuple[str | Arm, ...] = ()  # a name filters ``variant``; an Arm its own columns (e.g. ``arm``)
    over: str | None = None  # slope rule: the setting column
    margin: float | None = None  # noninferior rule; multiplier rule: the multiplier claimed (default 1)
    # ``all`` rule: a comparison that is neither supported nor contradicted is "equivalent" when its interval lies
    # within ±equivalence (effect units; two one-sided tests at its Holm level): the arms do not differ by more
    equivalence: float | None = None
    analytic: str | None = None
    needs_rows: bool = True  # False: a formula-only analytic claim, decided without any store
    unit: str | None = None  # the effect's unit as shown (default: from ``effect`` and the metric)
    paper_scale: str = ""  # what would decide it at paper scale
    paper_metric: str = ""  # the paper's own data and metric ("CIFAR-10 FID@Top-50"), named where a stand-in decides
    # A positive control: an arm whose metric must get worse as ``positive_over`` grows (its per-seed slope's 95 %
    # interval above 0) for the task to exercise what the claim is about; where it does not, the claim is not
    # decidable ("the task does not isolate ..."). None: no such precondition.
    positive_control: Arm | None = None
    positive_over: str = ""
    positive_what: str = ""  # what the task must isolate, for the verdict's words

    def __post_init__(self):
        betters = dict(self.better.values).values() if isinstance(self.better, ByPreset) else (self.better,)
        if self.rule not in RULES or self.effect not in EFFECTS or not set(betters) <= {"lower", "higher"}:
            raise ValueError(f"claim {self.id}: bad rule/effect/better ({self.rule}, {self.effect}, {self.better})")
        if self.rule == "noninferior" and not (self.margin and self.margin > 0):
            raise ValueError(f"claim {self.id}: the noninferior rule needs a positive margin")
        if self.rule == "slope" and not self.over:
            raise ValueError(f"claim {self.id}: the slope rule needs ``over``")
        if self.equivalence is not None and not (self.rule == "all" and self.equivalence > 0):
            raise ValueError(f"claim {self.id}: an equivalence margin needs the all rule and a positive margin")
        if self.rule == "analytic" and not self.analytic:
            raise ValueError(f"claim {self.id}: the analytic rule needs ``analytic``")

    def at(self, preset: str) -> Claim:
        """This claim at ``preset``: its metric, better direction and store resolved (comparisons resolve their
        own)."""
        return replace(self, metric=resolve(self.metric, preset), better=resolve(self.better, preset),
                       store=self.store_at(preset))

    def store_at(self, preset: str) -> str:
        """The store whose rows decide it at ``preset``."""
        return resolve(self.store, preset) or self.experiment

    @property
    def store_name(self) -> str:
        return self.store_at("*")

    def effect_unit(self, preset: str) -> str:
        if self.unit:
            return self.unit
        metric = resolve(self.metric, preset)
        return {"relative": f"% of the reference's {metric}", "difference": f"{metric} units",
                "points": f"{metric} points (×100)"}[self.effect]
