"""Tuning parity: every arm tuned on the same grid, on the validation split, then run at its own best setting.

A decide preset declares a ``Tuning`` before it runs: the grid (learning rate × weight decay), the few seeds that
score it and the n ≥ 10 seeds of the final runs. The store contract (the claims layer reads it) is a cell column
``phase``:

- ``"tune"``: one grid point of one arm at one tuning seed, with its ``lr`` and ``weight_decay`` columns; these
  cells compute and store validation metrics only (the test split is never scored before the setting is fixed);
- ``"tuned"``: the final seeds at the arm's chosen setting (lowest mean validation loss over the tuning seeds),
  with the ``lr``/``weight_decay`` used;
- ``"shared"`` (optional): every arm at the one setting the preset used before tuning existed, so a reader sees
  whether tuning changed the answer;
- ``"runner_up"`` (optional, ``Tuning.runner_up_seeds``): final seeds at the arm's second-best setting, so the
  claims layer can say whether a verdict depends on the choice between two settings whose scores are close.

**Grid edges.** With ``Tuning.extend`` > 0 a grid that puts an arm's best at an edge of an axis is extended for that
arm, one step at a time (the axis's ratio between its last two values, beyond the edge; a weight decay of 0 has no
value below it), at the chosen value of the other axis, with the tuning seeds, until the best is inside or
``extend`` steps were taken in that direction; the final cells wait for it. An edge that remains is flagged.

An arm's choice reads the score of each tuning seed by its seed: a grid point is scored only once every tuning seed
has its cell (a cell of another seed never stands in), and a ``tune`` cell without its ``lr``, ``weight_decay`` or
``seed`` is refused with a ValueError.

The final cells of an arm exist only once all its tuning cells are stored, so a run goes in stages
(``execute_stages``: plan, run, plan again until nothing new appears); a rerun computes only what is missing.
Presets that do not tune never carry ``phase``, so their stores keep their keys.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

PHASES = ("tune", "tuned", "shared", "runner_up")
HPARAMS = ("lr", "weight_decay")
SETTING_KEYS = ("phase", "seed", *HPARAMS)  # what varies inside one arm


def _positive_tuple(name: str, values, allow_zero: bool) -> tuple[float, ...]:
    vals = tuple(values)
    ok = vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      and (v >= 0 if allow_zero else v > 0) for v in vals)
    if not ok or len(set(vals)) != len(vals):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected distinct finite values {bound}, got {values!r}")
    return tuple(float(v) for v in vals)


@dataclass(frozen=True)
class Tuning:
    """The grid of a decide preset, fixed before the run and the same for every arm.

    ``lrs`` × ``weight_decays``: the grid; ``tune_seeds``: the seeds that score each grid point on validation
    (2–3); ``seeds``: the final seeds at each arm's best (≥ 10, disjoint from nothing: seed-paired across arms);
    ``metric``: the stored validation metric the choice minimises; ``shared``: the preset's one setting before
    tuning ({"lr": …, "weight_decay": …}), run at ``seeds`` as the secondary ``"shared"`` phase (None: no such
    phase)."""

    lrs: tuple[float, ...]
    weight_decays: tuple[float, ...]
    tune_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    metric: str = "val_loss"
    shared: dict | None = field(default=None)
    extend: int = 0  # steps an arm's grid may grow beyond an edge its best sits on, per axis and direction
    runner_up_seeds: tuple[int, ...] = ()  # final seeds at each arm's second-best setting (phase "runner_up")

    def provenance(self) -> dict:
        """The part of a store's key: the grid and its rules, not the final seeds (a run of fewer seeds shares the
        store). Fields added later are left out at their neutral value, so stores made before them keep their key."""
        neutral = {"extend": 0, "runner_up_seeds": ()}
        return {k: v for k, v in asdict(self).items() if k != "seeds" and not (k in neutral and v == neutral[k])}

    def __post_init__(self):
        object.__setattr__(self, "lrs", _positive_tuple("lrs", self.lrs, allow_zero=False))
        object.__setattr__(self, "weight_decays", _positive_tuple("weight_decays", self.weight_decays, True))
        for name in ("tune_seeds", "seeds"):
            seeds = tuple(getattr(self, name))
            if not seeds or len(set(seeds)) != len(seeds) or not all(isinstance(s, int) and s >= 0 for s in seeds):
                raise ValueError(f"{name}: expected distinct non-negative ints, got {getattr(self, name)!r}")
            object.__setattr__(self, name, seeds)
        if self.shared is not None and set(self.shared) != set(HPARAMS):
            raise ValueError(f"shared: expected keys {HPARAMS}, got {sorted(self.shared)}")
        if isinstance(self.extend, bool) or not isinstance(self.extend, int) or self.extend < 0:
            raise ValueError(f"extend: expected an int >= 0, got {self.extend!r}")
        ru = tuple(self.runner_up_seeds)
        if len(set(ru)) != len(ru) or not all(isinstance(x, int) and x >= 0 for x in ru):
            raise ValueError(f"runner_up_seeds: expected distinct non-negative ints, got {self.runner_up_seeds!r}")
        object.__setattr__(self, "runner_up_seeds", ru)

    def grid(self) -> list[dict]:
        """Every grid point, learning rate major."""
        return [{"lr": lr, "weight_decay": wd} for lr in self.lrs for wd in self.weight_decays]

    def describe(self) -> str:
        wd = "" if len(self.weight_decays) > 2 else " (a two-value axis: its edge flag says little)"
        more = (f", extended up to {self.extend} step(s) past an edge the best sits on" if self.extend else "") + (
            f", {len(self.runner_up_seeds)} seeds at each arm's runner-up setting" if self.runner_up_seeds else "")
        return (f"lr {{{', '.join(f'{v:g}' for v in self.lrs)}}} × weight decay "
                f"{{{', '.join(f'{v:g}' for v in self.weight_decays)}}}{wd}, {len(self.tune_seeds)} tuning seeds, "
                f"{len(self.seeds)} final seeds{more}")


def arm_id(cell: dict) -> str:
    """A cell's arm: the cell without what varies inside one arm (phase, seed, the tuned hyper-parameters)."""
    return json.dumps({k: v for k, v in cell.items() if k not in SETTING_KEYS}, sort_keys=True, default=str)


@dataclass(frozen=True)
class Choice:
    """An arm's chosen setting: ``setting`` ({lr, weight_decay}), its mean validation ``score``, the score of
    every grid point (``scores``: (lr, weight_decay) -> mean), and ``edge``: the axes whose chosen value is the
    smallest or largest on the grid (the optimum may lie outside it)."""

    setting: dict
    score: float
    scores: dict
    edge: tuple[str, ...]
    runner_up: dict | None = None  # the second-best scored setting


def _seed_scores(tuning: Tuning, by_seed) -> list[float] | None:
    """The scores of one grid point from exactly the tuning seeds (``{seed: score}``), None while one is missing:
    a score from any other seed (an earlier grid's, a duplicate) never stands in for a missing tuning seed. A plain
    list (no seeds known) counts as complete when it has a score per tuning seed."""
    if isinstance(by_seed, dict):
        if any(s not in by_seed for s in tuning.tune_seeds):
            return None
        return [by_seed[s] for s in tuning.tune_seeds]
    vals = list(by_seed or ())
    return vals if len(vals) >= len(tuning.tune_seeds) else None


def _step(axis: tuple[float, ...], value: float, up: bool) -> float | None:
    """The next value beyond ``value`` on a geometric continuation of ``axis`` (None below a zero)."""
    vals = sorted(axis)
    if len(vals) < 2 or (not up and value <= 0):
        return None
    lo, hi = (vals[-2], vals[-1]) if up else (vals[0], vals[1])
    if lo <= 0:  # an axis starting at 0 (weight decay): continue with the ratio of its two largest positive values
        pos = [v for v in vals if v > 0]
        if len(pos) < 2:
            return None if not up else value * 10.0
        lo, hi = pos[-2], pos[-1]
    ratio = hi / lo
    return value * ratio if up else value / ratio


def arm_grid(tuning: Tuning, scores: dict) -> list[tuple[float, float]]:
    """The points an arm is scored at: the grid, then (``tuning.extend``) one point at a time beyond the edge its
    best sits on, at the best's value of the other axis, while the scores so far put the best there."""
    points = [(g["lr"], g["weight_decay"]) for g in tuning.grid()]
    taken: dict[tuple[int, bool], int] = {}
    while True:
        choice = _choice_on(tuning, points, scores)
        if choice is None:
            return points
        best = (choice.setting["lr"], choice.setting["weight_decay"])
        nxt = None
        for axis_i, base in enumerate((tuning.lrs, tuning.weight_decays)):
            if len(base) < 2:
                continue
            axis = sorted({p[axis_i] for p in points})
            for up, edge_value in ((True, axis[-1]), (False, axis[0])):
                if best[axis_i] != edge_value or taken.get((axis_i, up), 0) >= tuning.extend:
                    continue
                value = _step(tuple(axis), edge_value, up)
                if value is not None:
                    nxt = (axis_i, up, (value, best[1]) if axis_i == 0 else (best[0], value))
                    break
            if nxt:
                break
        if nxt is None:
            return points
        taken[(nxt[0], nxt[1])] = taken.get((nxt[0], nxt[1]), 0) + 1
        points.append(nxt[2])


def _choice_on(tuning: Tuning, points: list[tuple[float, float]], scores: dict) -> Choice | None:
    got = {p: _seed_scores(tuning, scores.get(p)) for p in points}
    if any(v is None for v in got.values()):
        return None
    means = {p: statistics.fmean(got[p]) if all(math.isfinite(v) for v in got[p]) else math.inf for p in points}
    ranked = sorted(points, key=lambda p: (means[p], points.index(p)))  # ties: the first scored (declared order)
    best = ranked[0]
    if not math.isfinite(means[best]):
        return None
    lr_axis, wd_axis = sorted({p[0] for p in points}), sorted({p[1] for p in points})
    edge = tuple(name for name, axis, v in (("lr", lr_axis, best[0]), ("weight_decay", wd_axis, best[1]))
                 if len(axis) > 1 and v in (axis[0], axis[-1]))
    second = ranked[1] if len(ranked) > 1 and math.isfinite(means[ranked[1]]) else None
    return Choice({"lr": best[0], "weight_decay": best[1]}, means[best], means, edge,
                  None if second is None else {"lr": second[0], "weight_decay": second[1]})


def choose(tuning: Tuning, scores: dict[tuple[float, float], dict[int, float]]) -> Choice | None:
    """The scored point with the lowest mean validation score over the tuning seeds (``scores``: per grid point,
    ``{seed: score}`` as ``tune_scores`` gives them) on the arm's grid (``arm_grid``: the declared grid, extended
    past an edge where ``tuning.extend`` allows); None until every point of it has a score from every tuning seed.
    A point whose seeds diverged (non-finite) is never chosen; if all diverged the arm has no choice. ``edge``: the
    axes whose chosen value is the smallest or largest scored one (the optimum may lie beyond)."""
    return _choice_on(tuning, arm_grid(tuning, scores), scores)


def tune_scores(records: list[dict], metric: str) -> dict[str, dict[tuple[float, float], dict[int, float]]]:
    """Per arm, per grid point, the stored validation score of each tuning seed (``{seed: score}``) of the
    ``tune`` cells (store records).

    Raises:
        ValueError: a record that is not a store record, or a ``tune`` cell without its setting (``lr``,
            ``weight_decay``) or seed (the message starts with ``records`` and shows the cell).
    """
    out: dict[str, dict] = {}
    for rec in records:
        cell = rec.get("cell") if isinstance(rec, dict) else None
        if not isinstance(cell, dict) or not isinstance(rec.get("rows"), list):
            raise ValueError(f"records: expected store records with a cell and its rows, got {rec!r:.200}")
        if cell.get("phase") != "tune":
            continue
        missing = [k for k in (*HPARAMS, "seed") if cell.get(k) is None]
        if missing:
            raise ValueError(f"records: a tuning cell without its {' and '.join(missing)} cannot score a grid point: "
                             f"{json.dumps(cell, sort_keys=True, default=str)[:300]}")
        vals = [r.get("value") for r in rec["rows"] if isinstance(r, dict) and r.get("metric") == metric
                and r.get("status", "ok") == "ok"
                and r.get("eval_set", cell.get("dataset")) == cell.get("dataset")]  # a mix's own figure
        value = float(vals[0]) if vals and isinstance(vals[0], (int, float)) else math.nan
        out.setdefault(arm_id(cell), {}).setdefault((cell["lr"], cell["weight_decay"]), {})[cell["seed"]] = value
    return out


def tuned_cells(tuning: Tuning, arms: list[dict], records: list[dict],
                finals: Callable[[dict], list[dict]] = lambda arm: [arm]) -> tuple[list[dict], list[dict], dict]:
    """The cells of a tuned preset as far as the store allows: (cells, cells still waiting for their arm's tuning,
    choices per arm id). ``arms``: one cell per arm without phase/seed/lr/weight_decay, where its grid is scored;
    ``finals(arm)``: the cells its choice applies to (default: the arm's own; a sweep tuned at one of its settings
    applies the choice to every setting). The waiting cells carry ``lr``/``weight_decay`` None: a dry run prices
    them, a run never starts them."""
    scores = tune_scores(records, tuning.metric)
    # the runner-up seeds are final seeds too (paired with them); a run of fewer seeds (--seeds) keeps those it has
    runner_up = [s for s in tuning.runner_up_seeds if s in tuning.seeds]
    cells, waiting, choices = [], [], {}
    for arm in arms:
        own = scores.get(arm_id(arm), {})
        cells += [{**arm, "phase": "tune", "lr": lr, "weight_decay": wd, "seed": s}
                  for lr, wd in arm_grid(tuning, own) for s in tuning.tune_seeds]
        if tuning.shared is not None:
            cells += [{**f, "phase": "shared", **tuning.shared, "seed": s} for f in finals(arm) for s in tuning.seeds]
        choice = choose(tuning, own)
        if choice is None:
            waiting += [{**f, "phase": phase, "lr": None, "weight_decay": None, "seed": s} for f in finals(arm)
                        for phase, seeds in (("tuned", tuning.seeds), ("runner_up", runner_up))
                        for s in seeds]
            continue
        choices[arm_id(arm)] = choice
        cells += [{**f, "phase": "tuned", **choice.setting, "seed": s} for f in finals(arm) for s in tuning.seeds]
        if choice.runner_up is not None:
            cells += [{**f, "phase": "runner_up", **choice.runner_up, "seed": s} for f in finals(arm)
                      for s in runner_up]
    return cells, waiting, choices


def is_waiting(cell: dict) -> bool:
    """A final cell (``tuned`` or ``runner_up``) whose arm's tuning has not chosen its setting yet (lr None)."""
    return cell.get("phase") in ("tuned", "runner_up") and cell.get("lr") is None


def execute_stages(plan_of: Callable[[], tuple[object, int]], args, name: str) -> int:
    """Run a tuned preset in stages: ``plan_of()`` builds a fresh ``protocol.Plan`` from the store and says how many
    final cells still wait for their arm's tuning; each stage runs what is plannable, until nothing waits (or
    nothing more can appear: an arm whose every grid point diverged). The report runs once, at the last stage. A
    dry run prints the first plan, whose ``units`` price the waiting cells too.

    Stages overlap where the launcher allows (``protocol.execute``'s ``more``): when a stored unit finishes an arm's
    tuning while no unit waits to start, its final cells (or its grid's extension) start at once on the worker it
    freed, instead of waiting for every other arm's tuning to end."""
    from .protocol import execute

    plan, waiting = plan_of()

    def more() -> list[list[dict]]:  # units of a later stage, computed by this plan's work function
        later, _ = plan_of()
        return later.units if same_work(later.work, plan.work) else []

    # A stage with nothing pending cannot make a choice appear (an arm whose every point diverged); otherwise every
    # stage stores cells (a grid extended past an edge keeps the finals waiting one stage more), so this ends.
    while waiting and not getattr(args, "dry_run", False) and plan.store.pending([c for u in plan.units for c in u]):
        plan.finish = lambda: 0
        code = execute(plan, args, name, more=more)
        if code:
            return code
        plan, waiting = plan_of()
    return execute(plan, args, name)


def same_work(a, b) -> bool:
    """Whether two plans' work functions compute a unit alike: the same function, or partials of the same function
    with equal arguments (each stage's plan builds its own)."""
    if a is b:
        return True
    return (isinstance(a, functools.partial) and isinstance(b, functools.partial) and a.func is b.func
            and a.args == b.args and a.keywords == b.keywords)


def report_lines(tuning: Tuning, records: list[dict], label: Callable[[dict], str]) -> list[str]:
    """The tuning section of a decide report: the grid, each arm's mean validation score at every grid point,
    the chosen setting, and a flag where the best sits on the grid's edge."""
    scores = tune_scores(records, tuning.metric)
    arms = {}
    for rec in records:
        if rec["cell"].get("phase") == "tune":
            arms.setdefault(arm_id(rec["cell"]), rec["cell"])
    grid = [(g["lr"], g["weight_decay"]) for g in tuning.grid()]
    head = " | ".join(f"lr {lr:g}, wd {wd:g}" for lr, wd in grid)
    ext = " | extended past the edge" if tuning.extend else ""
    lines = [f"## Tuning ({tuning.describe()}; mean validation {tuning.metric} over the tuning seeds, lower is "
             "better)", "", f"| arm | {head}{ext} | chosen | runner-up | on the edge |",
             "|" + "---|" * (len(grid) + 4 + bool(ext))]
    for aid, cell in sorted(arms.items(), key=lambda kv: label(kv[1])):
        by = scores.get(aid, {})
        own = {p: [v for seed, v in by[p].items() if seed in tuning.tune_seeds] for p in by}
        means = [statistics.fmean(own[p]) if own.get(p) else math.nan for p in grid]
        choice = choose(tuning, by)
        extra = [p for p in arm_grid(tuning, by) if p not in grid]
        ext_cell = (" | " + ("; ".join(f"lr {lr:g}, wd {wd:g}: " + (f"{statistics.fmean(own[(lr, wd)]):.4g}"
                                                                     if own.get((lr, wd)) else "pending")
                                       for lr, wd in extra) or "–")) if ext else ""
        chosen = (f"lr {choice.setting['lr']:g}, wd {choice.setting['weight_decay']:g}" if choice
                  else "not yet (tuning unfinished or diverged)")
        second = (f"lr {choice.runner_up['lr']:g}, wd {choice.runner_up['weight_decay']:g}"
                  if choice and choice.runner_up else "–")
        edge = ("**yes: " + ", ".join(choice.edge) + (" (after extending)" if extra else "") + "**"
                if choice and choice.edge else "no")
        lines.append(f"| {label(cell)} | " + " | ".join(f"{m:.4g}" for m in means)
                     + f"{ext_cell} | {chosen} | {second} | {edge} |")
    return lines


def calibration_lines(df, metric: str, trivial: str, lower_is_better: bool, what: str,
                      by: tuple[str, ...] = ("variant", "flavor")) -> list[str]:
    """The calibration rows of a decide report: each arm's mean ``metric`` beside its task's trivial predictor
    (``trivial``, stored beside it: unigram, majority class, training mean) and the margin between them, so a
    reader sees that the stand-in learned (the gate of ``claims.gate`` decides it per cell)."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    got = ok[ok["metric"] == metric].groupby(list(by))["value"].mean()
    ref = ok[ok["metric"] == trivial].groupby(list(by))["value"].mean()
    if got.empty or ref.empty:
        return []
    lines = [f"## Calibration: {metric} vs the trivial predictor ({what}; means over seeds)", "",
             f"| arm | {metric} | {trivial} | margin |", "|---|---|---|---|"]
    for key, v in got.items():
        t = ref.get(key, math.nan)
        margin = (t - v if lower_is_better else v - t)
        rel = f" ({100 * margin / t:+.1f} % of it)" if lower_is_better and t else ""
        lines.append(f"| {'/'.join(map(str, key if isinstance(key, tuple) else (key,)))} | {v:.4f} | {t:.4f} | "
                     f"{margin:+.4f}{rel} |")
    return lines


__all__ = ["HPARAMS", "PHASES", "Choice", "Tuning", "arm_grid", "arm_id", "calibration_lines", "choose",
           "execute_stages", "report_lines", "same_work", "tune_scores", "tuned_cells"]
