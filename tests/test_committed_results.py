"""The committed report (results/) is what the code at HEAD renders from the committed stores: the index and the
verdicts re-render byte for byte, every figure the report names exists, and no file carries an absolute path of the
machine that ran it."""

import re
import shutil
from pathlib import Path

import pytest

from attention_zoo.experiments.results_index import build_index

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
RENDERED = ("README.md", "claims.md", "claims.csv")  # what build_index writes from the stores
TEXT = (".md", ".csv", ".json", ".jsonl")
ABSOLUTE = re.compile(r"(?<![\w.])/(?:work|root|home|tmp|Users|private|mnt|scratch)/")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("results") / "results"
    shutil.copytree(RESULTS, copy, ignore=shutil.ignore_patterns("_cache", "checkpoints", ".*.claims", ".*.lock"))
    build_index(copy, probes=False)  # freshness lines are compared apart (below), so no probe is needed
    return copy


FRESHNESS = re.compile(r"^(\*\*Older than its code:\*\*|Code: ).*$", re.M)


@pytest.mark.parametrize("name", RENDERED)
def test_committed_report_equals_what_the_code_renders_from_the_committed_stores(rendered, name):
    # Each section's age against the code is read from git history, which a shallow checkout may lack: compared
    # apart (tests/test_results_index.py plants a history), the rest must match byte for byte.
    committed = FRESHNESS.sub("<freshness>", (RESULTS / name).read_text())
    assert committed == FRESHNESS.sub("<freshness>", (rendered / name).read_text()), (
        f"results/{name} is stale: rebuild it with `python reproduce/all.py --index-only` and commit it")


def test_every_figure_the_report_names_is_committed():
    readme = (RESULTS / "README.md").read_text()
    named = set(re.findall(r"\(([\w./-]+\.png)\)", readme))
    assert named, "the report names no figure"
    missing = sorted(p for p in named if not (RESULTS / p).is_file())
    assert not missing, f"figures named in results/README.md but not committed: {missing}"


def test_committed_results_hold_no_absolute_paths():
    offenders = []
    for path in sorted(RESULTS.rglob("*")):
        if path.suffix not in TEXT or not path.is_file():
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if ABSOLUTE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{no}: {ABSOLUTE.search(line).group(0)}")
                break
    assert not offenders, "absolute paths in committed results:\n" + "\n".join(offenders[:20])


def test_the_committed_report_is_complete():
    """The committed run produced every table and figure of every section, the report has a heading for each, and
    it opens with the summary (issue 56), then the full verdict table."""
    from attention_zoo.experiments.results_index import SECTIONS, missing_outputs

    assert missing_outputs(RESULTS) == [], "outputs missing from the committed run"
    readme = (RESULTS / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", readme, flags=re.M)
    absent = [s.name for s in SECTIONS if not any(h.startswith(f"{s.name}: ") for h in headings)]
    assert not absent, f"sections without a heading in results/README.md: {absent}"
    assert headings[:2] == ["Summary", "Verdicts on the paper's claims"], f"the report opens with {headings[:2]!r}"
    assert "**Missing:**" not in readme
