"""The results/README.md builder on a tiny results tree."""

import json
from pathlib import Path

import pandas as pd

from attention_zoo.experiments.results_index import build_index


def test_index_lists_tables_paper_rows_figures_flavours_and_env(tmp_path):
    t = tmp_path / "table9"
    t.mkdir()
    (t / "table9.md").write_text("# Table 9\n\n| variant | x |\n|---|---|\n| mha | 1 |\n\n## Paper vs ours\n\n"
                                 "| what | paper | ours | delta |\n|---|---|---|---|\n| DAMCHA x | 1.0 | 1.5 | 0.5 |\n")
    pd.DataFrame({"variant": ["mha", "tha", "tha"], "flavour": ["paper", "paper", "damcha_repo"],
                  "value": [1, 2, 3]}).to_csv(t / "table9_long.csv", index=False)
    (t / "table9.env.json").write_text(json.dumps({"device_name": "TestCPU", "device": "cpu", "torch": "x"}))
    (t / "plot.png").write_bytes(b"\x89PNG")
    md = build_index(tmp_path).read_text()
    assert "[table9.md](table9/table9.md)" in md
    assert "| DAMCHA x | 1.0 | 1.5 | 0.5 |" in md  # the paper | ours | delta block is carried over
    assert "| variant | x |" not in md  # other tables are linked, not copied
    assert "[table9/plot.png](table9/plot.png)" in md
    assert "| tha | paper, damcha_repo | damcha_repo, paper |" in md
    assert "TestCPU" in md
    assert "DAMCHA under RowSum" in md and "Known discrepancies" in md


def test_index_names_every_sitting_of_a_resumed_store(tmp_path):
    t = tmp_path / "table9"
    t.mkdir()
    lines = [{"kind": "run", "run_id": rid, "context_id": "c1", "env": {"git_commit": commit, "cpu_model": "TestCPU",
                                                                       "time_utc": f"2026-01-01T0{h}:00:00+00:00",
                                                                       **dirty}}
             for rid, commit, h, dirty in (("A", "aaaaaaa111", 1, {"git_dirty": False}), ("B", "bbbbbbb222", 2, {}))]
    cells = [("x1", "A"), ("x2", "A"), ("x3", "A"), ("x3", "B"), ("x4", "B")]  # x3 redone by B: B's record counts
    lines += [{"kind": "cell", "cell_id": cid, "context_id": "c1", "run_id": rid, "cell": {"i": cid},
               "rows": [{"metric": "m", "value": 1.0}]} for cid, rid in cells]
    (t / "table9.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = {"run_id": "R", "command": "python reproduce/all.py", "preset": "smoke", "total_wall_s": 60.0}
    (tmp_path / "run_all.json").write_text(json.dumps({"runs": [run], "scripts": {"table9": {"run_id": "R"}}}))
    md = build_index(tmp_path).read_text()
    assert "**Resumed stores**" in md
    assert ("`table9/table9.jsonl`: 4 cells from 2 runs of its script: 2 by `A` (commit `aaaaaaa`, clean tree, "
            "TestCPU, started 2026-01-01T01:00:00+00:00); 2 by `B` (commit `bbbbbbb`, tree unknown") in md
    (t / "table9.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines if x.get("run_id") != "B"))
    assert "Resumed stores" not in build_index(tmp_path).read_text()  # one sitting: nothing to say


def test_the_index_flags_a_section_whose_code_changed_after_its_run(tmp_path):
    """A planted history: the package at a 'run' commit, then one commit touching a file the section's numbers
    depend on and one touching render-only code; only the first makes the section older than its code."""
    import shutil
    import subprocess

    from attention_zoo.experiments.freshness import code_files, freshness_line

    repo = tmp_path / "repo"
    shutil.copytree(Path(__file__).resolve().parents[1] / "attention_zoo", repo / "attention_zoo",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "code of the run")
    run = git("rev-parse", "HEAD")
    folder = tmp_path / "results" / "table5_gpt2"
    folder.mkdir(parents=True)
    (folder / "table5_gpt2.env.json").write_text(json.dumps({"git_commit": run, "runs": [{"git_commit": run}]}))
    modules = ("attention_zoo.experiments.lm.table5_gpt2",)
    files = code_files(modules, repo)
    assert "attention_zoo/experiments/lm/table5_gpt2.py" in files and "attention_zoo/variants/damcha.py" in files
    assert not any(f.startswith("attention_zoo/claims/") or f.endswith("report.py") for f in files)
    assert "is the same at HEAD" in freshness_line(folder, {}, "table5_gpt2", modules, repo)

    with open(repo / "attention_zoo" / "claims" / "table.py", "a") as f:  # renders: cannot change a number
        f.write("\n# a comment\n")
    git("commit", "-qam", "render-only change")
    assert "is the same at HEAD" in freshness_line(folder, {}, "table5_gpt2", modules, repo)

    with open(repo / "attention_zoo" / "variants" / "damcha_ops.py", "a") as f:  # a comment computes nothing
        f.write("\n# a comment\n")
    git("commit", "-qam", "a comment in the section's code")
    assert "is the same at HEAD" in freshness_line(folder, {}, "table5_gpt2", modules, repo)

    with open(repo / "attention_zoo" / "variants" / "damcha_ops.py", "a") as f:  # the section's code
        f.write("\nPLANTED = 1\n")
    git("commit", "-qam", "a change the section depends on")
    line = freshness_line(folder, {}, "table5_gpt2", modules, repo)
    assert line.startswith("**Older than its code:**") and "1 later commit(s)" in line
    assert git("rev-parse", "--short=7", "HEAD") in line

    git("revert", "--no-edit", "HEAD")  # undone: the code at HEAD is the run's again, so are its numbers
    assert "is the same at HEAD" in freshness_line(folder, {}, "table5_gpt2", modules, repo)


def test_a_store_remade_outside_the_driver_does_not_take_the_drivers_older_record(tmp_path):
    """run_all.json keeps its record of a script after the folder is remade by running the script directly: that
    record's commit and timings are then not the store's, so the section and the freshness check ignore it."""
    from attention_zoo.experiments.freshness import driver_entry, section_commits

    folder = tmp_path / "synthetic_decide"
    folder.mkdir()
    command = "python reproduce/synthetic.py --preset decide"
    run = {"run_id": "R", "command": "python reproduce/all.py", "preset": "decide", "git_commit": "old1234",
           "time_utc": "2026-01-01T01:00:00+00:00", "total_wall_s": 600.0}
    record = {"runs": [run], "scripts": {"synthetic_decide": {"run_id": "R", "command": command, "wall_s": 590.0,
                                                              "cpu_s": 1000.0, "exit_code": 0}}}
    (tmp_path / "run_all.json").write_text(json.dumps(record))

    def sitting(stamp: str, commit: str) -> None:
        (folder / "synthetic.env.json").write_text(json.dumps({"command": "reproduce/synthetic.py --preset decide",
                                                               "git_commit": commit, "time_utc": stamp}))

    sitting("2026-01-01T01:00:02+00:00", "old1234")  # made by the driver's run
    assert driver_entry(folder, record, "synthetic_decide") == record["scripts"]["synthetic_decide"]
    sitting("2026-01-03T05:00:00+00:00", "new5678")  # remade directly, two days later
    assert driver_entry(folder, record, "synthetic_decide") is None
    assert section_commits(folder, record, "synthetic_decide") == ["new5678"]
    md = build_index(tmp_path).read_text()
    assert "`synthetic_decide`: made outside `all.py`, in sittings: `reproduce/synthetic.py --preset decide` at " \
           "`new5678`" in md
    assert "590 s" not in md.split("## Figure 12 (decide)")[1]  # the driver's timing is not shown as the store's
    assert "(superseded: its folder was remade outside `all.py`, below)" in md


def test_the_report_names_the_newest_run_that_completed_a_section_not_a_later_interrupted_one(tmp_path):
    done = {"run_id": "A", "command": "python reproduce/all.py --preset smoke", "preset": "smoke"}
    stopped = {"run_id": "B", "command": "python reproduce/all.py --preset decide --only table1_decide",
               "preset": "decide"}
    record = {"runs": [done, stopped], "scripts": {"table9": {"run_id": "A", "exit_code": 0},
                                                   "table1_decide": {"run_id": "B", "exit_code": 130}}}
    (tmp_path / "run_all.json").write_text(json.dumps(record))
    first = build_index(tmp_path).read_text().split("\n")[2]
    assert first.startswith("Generated by `python reproduce/all.py --preset smoke`")
    record["scripts"]["table1_decide"]["exit_code"] = 0  # once it completes, it is the newest that did
    (tmp_path / "run_all.json").write_text(json.dumps(record))
    assert build_index(tmp_path).read_text().split("\n")[2].startswith("Generated by `python reproduce/all.py "
                                                                       "--preset decide --only table1_decide`")
