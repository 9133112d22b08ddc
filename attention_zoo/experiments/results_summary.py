"""The summary that opens ``results/README.md`` (docs/results.md, "Reading the report"): how to read the report, one
line per claim grouped by
paper, the forest plot ``verdicts.png`` and the compute-multiplier leaderboard. The words and numbers come from
``claims.summary``; the figure from ``plots.verdicts`` (the two layers meet here, above both)."""

from __future__ import annotations

from pathlib import Path

from ..claims.summary import READING, forest_frame, leaderboard_markdown, summary_markdown
from ..plots.verdicts import forest_plot

FIGURE = "verdicts.png"
LADDERS = ("scaling_decide", "scaling")  # the scale axis' folders, the deciding preset first: its multiplier figure


def summary_section(results: str | Path, verdicts: list) -> list[str]:
    """The "## Summary" lines; draws ``<results>/verdicts.png`` when a claim was decided with an interval (and
    removes a stale one otherwise, so the link never shows an old figure)."""
    results = Path(results)
    if not results.is_dir():
        raise ValueError(f"results: {str(results)!r} is not a directory")
    frame = forest_frame(verdicts)
    figure = results / FIGURE
    if frame.empty:
        figure.unlink(missing_ok=True)
    else:
        forest_plot(frame, figure)
    ladder = [f"![multipliers]({f.relative_to(results)})" for f in
              (results / folder / "scaling_multipliers.png" for folder in LADDERS) if f.is_file()][:1]
    return ["## Summary", "", READING, "", *summary_markdown(verdicts, FIGURE if not frame.empty else None),
            *leaderboard_markdown(verdicts), *(ladder + [""] if ladder else [])]


__all__ = ["FIGURE", "summary_section"]
