"""The results/README.md builder on a tiny results tree."""

import json

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
