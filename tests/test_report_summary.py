"""The one-minute summary at the top of results/README.md (issue 56): one row per claim grouped by paper, every row
within 160 characters, no claim id twice, claims that re-read another's rows folded into its row, the forest plot
drawn and linked, the multiplier leaderboard or the command that makes it. Built from the committed stores into a
copy (the committed results are never written)."""

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from attention_zoo.claims import get_claim, verdicts_for
from attention_zoo.claims.summary import (
    MAX_ROW,
    SCALE_COMMAND,
    forest_frame,
    group_of,
    leaderboard_markdown,
    summary_markdown,
)
from attention_zoo.claims.verdicts import Verdict
from attention_zoo.experiments.results_summary import FIGURE, summary_section
from attention_zoo.plots.verdicts import forest_plot

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROW_ID = re.compile(r"^\| [^|]+ \| `([^`]+)`(?: \(\+([^)]*)\))? \|")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    copy = tmp_path_factory.mktemp("r56") / "results"
    shutil.copytree(RESULTS, copy, ignore=shutil.ignore_patterns("_cache", "checkpoints", ".*.claims", ".*.lock"))
    verdicts = verdicts_for(copy)
    return copy, verdicts, summary_section(copy, verdicts)


def first_table(lines: list[str]) -> list[str]:
    """The rows of the first markdown table (header and separator left out)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append(line)
    return rows


def row_ids(row: str) -> list[str]:
    m = ROW_ID.match(row)
    assert m, f"a summary row without a claim id: {row}"
    return [m[1], *(m[2].split(", ") if m[2] else [])]


def test_the_first_table_has_one_row_per_claim_each_within_160_characters(built):
    _, verdicts, lines = built
    assert lines[0] == "## Summary"
    rows = first_table(lines)
    too_long = [r for r in rows if len(r.encode()) > MAX_ROW]  # bytes ≥ characters: holds by either count
    assert not too_long, too_long
    ids = [i for r in rows for i in row_ids(r)]
    assert len(ids) == len(set(ids)), "a claim id twice"
    assert set(ids) == {v.claim.id for v in verdicts}, "a claim without a row, or a row without a claim"
    for r in rows:  # the verdict word is never cut
        assert re.search(r"\| \*\*(supported|contradicted|equivalent|explained by a control|inconclusive|"
                         r"not decidable|not run)\*\* \|", r), r


def test_a_claim_that_rereads_another_claims_rows_folds_into_its_row(built):
    _, verdicts, lines = built
    folded = {v.claim.id: v.same_as for v in verdicts if v.same_as}
    assert folded, "the committed verdicts have claims that share rows (T1.cifar100 reads T1.cifar10's)"
    rows = {row_ids(r)[0]: row_ids(r)[1:] for r in first_table(lines)}
    for cid, target in folded.items():
        if target in rows:
            assert cid in rows[target] and cid not in rows


def test_count_lines_add_up_to_the_claims_of_each_paper(built):
    _, verdicts, lines = built
    counts = [line for line in lines if line.startswith("- **")]
    total = sum(int(re.search(r"\*\*: (\d+) claims?", c)[1]) for c in counts)
    assert total == len({v.claim.id for v in verdicts})
    assert any(c.startswith("- **DAMCHA") for c in counts)


def test_the_forest_plot_is_drawn_and_linked(built):
    copy, verdicts, lines = built
    assert f"![verdicts]({FIGURE})" in lines
    png = copy / FIGURE
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    frame = forest_frame(verdicts)
    assert len(frame) >= 10
    # drawn in the paper's direction: a contradicted claim's interval lies below 0 or short of the paper's effect
    for r in frame.itertuples():
        if r.kind == "contradicted":
            assert r.high < 0 or r.high < r.paper, r.label
        if r.kind == "supported":
            assert r.low > 0, r.label


def test_the_leaderboard_shows_the_ladder_or_names_its_command(built):
    _, verdicts, lines = built
    text = "\n".join(lines)
    if any(v.claim.id.startswith("S.mult_") for v in verdicts):
        assert "| arm | verdict | preset |" in text and "Not run yet" not in text
    else:
        assert f"Not run yet: `{SCALE_COMMAND}`." in lines
    assert "Not run yet" in "\n".join(leaderboard_markdown([v for v in verdicts if not v.claim.id.startswith("S.")]))


def test_the_leaderboard_reads_every_rung_of_a_multiplier_verdict():
    claim = replace(get_claim("T1.cifar10"), id="S.mult_damcha")
    ours = ("damcha vs mha: multiplier 1.27 [0.304, ∞] at the largest rung D48×1 (n = 2); every rung (FLOPs): "
            "D16×1: 0.683 [0.336, ∞]; D48×1: 1.27 [0.304, ∞] (extrapolated); CPU-seconds reading: D16×1: 9 [1, 2]")
    text = "\n".join(leaderboard_markdown([Verdict(claim, "smoke", "not decidable at n = 2", ours=ours)]))
    assert "| damcha | not decidable | smoke | 0.683 [0.336, ∞] | 1.27 [0.304, ∞]ᵉ |" in text
    assert "9 [1, 2]" not in text  # the CPU-seconds reading is not the FLOPs leaderboard
    assert "Not run yet" not in text


def test_unknown_prefixes_group_as_other_and_the_longest_prefix_wins():
    assert group_of("T1.cifar10") == "damcha" and group_of("D3.shared_amortised") == "damcha"
    assert group_of("DC.lm") == "dcmha" and group_of("THA.mlm") == "tha" and group_of("S.mult_moa") == "scale"
    assert group_of("ZZ.new") == "other"
    with pytest.raises(ValueError, match="claim_id"):
        group_of("")


def test_folding_and_compression_on_planted_verdicts():
    base = get_claim("T1.cifar10")
    a = Verdict(base, "decide", "inconclusive", ours="x" * 400)
    b = Verdict(replace(base, id="ZZ.copy"), "decide", "inconclusive", same_as=base.id)
    c = Verdict(replace(base, id="ZZ.elsewhere"), "smoke", "inconclusive", same_as=base.id)  # another preset
    lines = summary_markdown([a, b, c], figure=None)
    rows = first_table(lines)
    assert [row_ids(r) for r in rows] == [["T1.cifar10", "ZZ.copy"], ["ZZ.elsewhere"]]
    assert all(len(r) <= MAX_ROW and "**inconclusive**" in r for r in rows)
    assert any(line.startswith("- **Other claims**: 1 claim") for line in lines)
    assert not any("![verdicts]" in line for line in lines)


def test_bad_input_names_the_argument(tmp_path):
    with pytest.raises(ValueError, match="verdicts"):
        summary_markdown([])
    with pytest.raises(ValueError, match="frame"):
        forest_plot(forest_frame([]), tmp_path / "x.png")
    with pytest.raises(ValueError, match="results"):
        summary_section(tmp_path / "absent", [])
    nan_row = {"label": "x", "kind": "inconclusive", "effect": float("nan"), "low": 0.0, "high": 1.0, "unit": "pts",
               "mde": 1.0, "relative": False, "paper": float("nan")}
    with pytest.raises(ValueError, match="frame"):
        forest_plot(pd.DataFrame([nan_row]), tmp_path / "x.png")
