"""Could a control explain the treatment's gain? Checked on every comparison of a claim, in the comparison's unit.

For a comparison treatment vs reference and each control arm c on the same rows, paired on the same seeds:
``gain`` = c's effect over the reference and ``gap`` = treatment's effect over the reference − c's, both in the
comparison's unit and orientation (positive = better; for ``relative`` effects, % of the reference's value), so
gain + gap is the treatment's own effect. The strongest control is the one with the largest gain. A comparison in
which the paper says the treatment is better is **explained by a control** when some control's gap is not
significantly above 0 at the comparison's Holm level: the data cannot attribute the gain to what the treatment
adds over that control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from . import stats
from .effects import arm_values, oriented_effect
from .spec import Arm, Claim, Comparison


@dataclass
class ControlResult:
    name: str
    gain: stats.PairedResult  # control over the reference
    gap: stats.PairedResult  # treatment over the control, against the reference's value

    @property
    def explains(self) -> bool:
        g = self.gap
        return not (g.decidable and math.isfinite(g.p) and g.p < 1 - g.confidence and g.mean > 0)


def check_controls(df: pd.DataFrame, claim: Claim, comp: Comparison, level: float) -> list[ControlResult]:
    """Every control with at least two seeds paired with both arms, strongest (largest gain) first."""
    if comp.reference is None or claim.rule == "slope":
        return []
    t = arm_values(df, comp.treatment, claim.pair_on, claim.better)
    r = arm_values(df, comp.reference, claim.pair_on, claim.better)
    out = []
    for control in claim.controls:
        arm = control if isinstance(control, Arm) else Arm(control, {"variant": control})
        name = arm.label
        c = arm_values(df, arm, claim.pair_on, claim.better)
        idx = c.index.intersection(r.index).intersection(t.index)
        if len(idx) < 2:
            continue
        gain = oriented_effect(c[idx], r[idx], claim)
        gap = oriented_effect(t[idx], r[idx], claim) - gain
        out.append(ControlResult(name, stats.paired_test(gain, 1 - level), stats.paired_test(gap, 1 - level)))
    return sorted(out, key=lambda x: -x.gain.mean if math.isfinite(x.gain.mean) else math.inf)


def fmt(v: float) -> str:
    return "–" if not math.isfinite(v) else f"{v:+.2f}"


def interval_text(t: stats.PairedResult) -> str:
    """"+1.23 [+0.50, +2.00]" for n ≥ 5 (t-interval); "+1.23 (range of 3 seeds [+0.1, +2.0])" below."""
    if t.n == 0:
        return "–"
    if t.method == "range":
        return f"{fmt(t.mean)} (range of {t.n} seeds [{fmt(t.low)}, {fmt(t.high)}])"
    if not math.isfinite(t.low):
        return f"{fmt(t.mean)} (n = {t.n})"
    return f"{fmt(t.mean)} [{fmt(t.low)}, {fmt(t.high)}]"


def control_text(comp: Comparison, controls: list[ControlResult], unit: str) -> str:
    """The strongest control of one comparison, and the one that explains it where that is another."""
    if not controls:
        return ""
    treat, ref = comp.treatment.label, comp.reference.label
    parts = []
    for c in [controls[0]] + [c for c in controls[1:] if c.explains and not controls[0].explains][:1]:
        parts.append(f"{c.name} {interval_text(c.gain)} over {ref}; {treat} − {c.name} {interval_text(c.gap)}")
    return f"{comp.name}: " + "; ".join(parts) + f" ({unit})"


__all__ = ["ControlResult", "check_controls", "control_text", "fmt", "interval_text"]
