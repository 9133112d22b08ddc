"""MQAR's report: the capability table (test accuracy per arm and rung), the tuning grid, the calibration against
chance, how the runs stopped, and the verdicts of the claims that read this store."""

from __future__ import annotations

from pathlib import Path

from ... import report
from ...claims import frame_verdicts, verdict_markdown
from ...io import atomic_write_csv, atomic_write_text
from ...results import ResultStore
from ..results_index_papers import capability
from ..token_report import final_frame, stopping
from ..tuning import Tuning, calibration_lines

NAME = "mqar"
RUNG = ("seq_len", "n_pairs")


def write_report(out: Path, store: ResultStore, env: dict, preset_name: str, tuning: Tuning | None = None
                 ) -> list:
    df, env, tuned = final_frame(store, env, tuning)
    if df.empty:
        if tuned:  # a tuned preset whose finals wait: its grid so far
            print("\n".join(tuned))
        return []
    cap = capability(df)
    verdicts = frame_verdicts(NAME, preset_name, df, store.path, store.context_id)
    notes = [f"Preset `{preset_name}`. Test accuracy at the query positions (% of queries answered right) at the best "
             "validation checkpoint, mean [95 % Student-t interval over seeds] (n seeds); chance is 100/n % (a value "
             "from the context picked without its key). Rungs: sequence length T, key–value pairs n; vocabulary "
             f"{int(df['vocab_size'].iloc[0]) if 'vocab_size' in df else '?'}. Recipe and arms: "
             "attention_zoo/experiments/mqar/presets.py.", stopping(df), *tuned,
             *report.table_blocks(calibration_lines(df, "test_acc", "chance_acc", False, "chance, 1/n",
                                                    by=("arm", *RUNG))),
             "## Verdicts of the claims that read this store", "", verdict_markdown(verdicts),
             "## Capability: test accuracy (%) per arm and rung"]
    if not cap.empty:
        atomic_write_csv(cap, out / f"{NAME}_capability.csv")
        atomic_write_text(out / f"{NAME}_capability.md", report.markdown_table(cap) + "\n")
    report.write_tables(out, NAME, df, cap, env, "MQAR: multi-query associative recall (Zoology) for every arm",
                        "\n\n".join(n for n in notes if n))
    return verdicts


__all__ = ["NAME", "capability", "stopping", "write_report"]
