"""What the token-sequence stand-ins' reports (MQAR, the masked LM) share: the final cells of a tuned store with the
tuning grid's lines, and how the final cells stopped. Render-only."""

from __future__ import annotations

import pandas as pd

from .. import report
from ..results import ResultStore
from .arm_plan import arm_label
from .tuning import Tuning, report_lines


def final_frame(store: ResultStore, env: dict, tuning: Tuning | None) -> tuple[pd.DataFrame, dict, list[str]]:
    """(the final cells' rows, the store's environment, the tuning grid's report lines). Without a tuning grid every
    row is final; with one, the ``tuned`` phase. The rows are empty when there is nothing final to report."""
    df = store.frame()
    env = store.environment(env, df)
    if df.empty:
        return df, env, []
    tuned = []
    if tuning is not None:
        tuned = report.table_blocks(report_lines(tuning, store.records(), arm_label))
        df = df[df["phase"] == "tuned"].copy() if "phase" in df else df.iloc[:0]
    return df, env, tuned


def stopping(df: pd.DataFrame) -> str:
    """How the final cells ended: the share that early stopping ended before the step limit, and the steps run."""
    steps = df[df["metric"] == "steps_run"]
    if steps.empty or "max_steps" not in steps:
        return ""
    stopped = (steps["value"] < steps["max_steps"]).mean()
    return (f"Early stopping ended {100 * stopped:.0f} % of the {len(steps)} final cells before their step limit "
            f"(steps run: median {steps['value'].median():.0f}, range {steps['value'].min():.0f}–"
            f"{steps['value'].max():.0f} of {int(steps['max_steps'].max())}).")
