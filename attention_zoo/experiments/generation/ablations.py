"""The rows of the two DAMCHA ablations: what each row of Table 3 (inference-time block scales) and Table 4
(sharing × input adaptivity) changes in the model. Their experiments train these rows and their reports name and
order them, so a change here changes the numbers (this module is part of both stores' code)."""

from __future__ import annotations

# ---- Table 3: one model per generator depth, scored under five inference-time block scalings -----------------------
INFERENCE = ("full", "diag_only", "off_diag_only", "full_over_H", "full_times_H1_over_H")


def block_scales(n_heads: int) -> dict[str, tuple[float, float]]:
    """(diagonal, off-diagonal) block scale of each inference row."""
    off = (n_heads - 1) / n_heads
    return dict(zip(INFERENCE, ((1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (1.0 / n_heads, 1.0 / n_heads), (off, off))))


def depth_of(setting: str) -> int:
    """A Table 3 cell's generator depth from its setting ("depth3" -> 3)."""
    return int(setting.removeprefix("depth"))


# ---- Table 4: each row is a model of its own --------------------------------------------------------------------
SETTINGS = {"full": ({}, True), "no_sharing": ({}, False), "no_fx": ({"use_mlp": False}, True),
            "no_both": ({"use_mlp": False}, False)}  # setting -> (attention options, backbone share_mlp)
# What the rows are, for Table 4's report (one paragraph; its line breaks are not part of it).
TABLE4_ROWS = """
"w/o f(x)" keeps sharing: one static metric M0 for the stack (the generator's place), while "w/o both" has one M0
per layer, so each row is a model of its own and is trained on its own. In the authors' original code "w/o f(x)" was
a frozen M0 buffer and the unshared generators were created lazily outside the optimizer (docs/experiments.md §9.2),
so the paper's rows may measure something else. Every row runs with unit block scales; the static M0 takes no block
scales at all (they act on generated metrics only). The generators' dropout is the attention dropout of the row's
preset. Rows are scored seed-paired against DAMCHA on the verdicts' metric: the validation loss at smoke, the
held-out MSE (digits) and NLL (concept task) at decide; FID@Top-50 and BERTScore stay as secondary columns."""
