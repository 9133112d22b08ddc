"""``python -m attention_zoo.bench train --task lm|vit``: the stand-ins' training throughput, one model at a time
against a seed ensemble and two processes against two threads; tiny runs (their numbers mean nothing)."""

import pandas as pd
import pytest
import torch

from attention_zoo import bench


def _main(argv):
    threads = torch.get_num_threads()
    try:
        return bench.main(argv)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("task", ["lm", "vit"])
def test_train_throughput_rows_table_and_figure(tmp_path, task):
    out = tmp_path / task
    assert _main(["train", "--task", task, "--variants", "mha,damcha", "--d-models", "16", "--seeds", "2",
                  "--steps", "1", "--rounds", "1", "--warmup", "0", "--procs", "" if task == "vit" else "mha",
                  "--proc-steps", "1", "--proc-rounds", "1", "--csv", str(out / "t.csv"), "--md", str(out / "t.md"),
                  "--plot", str(out / "t.png")]) == 0
    df = pd.read_csv(out / "t.csv")
    unit = "tok" if task == "lm" else "img"
    steps = df[df["path"].isin(["one", "ensemble"])]
    assert set(steps["path"]) == {"one", "ensemble"} and (steps[f"{unit}_per_cpu_s"] > 0).all()
    assert (steps["gemm_fraction"] > 0).all() and steps[steps["path"] == "ensemble"]["speedup_vs_one"].notna().all()
    md = (out / "t.md").read_text()
    assert "## Targets" in md and "ensemble of 2 vs one at a time, mha, D 32: not measured" in md
    if task == "lm":
        procs = df[~df["path"].isin(["one", "ensemble"])]
        assert set(procs["path"]) == {"2 processes x 1 thread", "1 process x 2 threads"}
        assert (procs["tok_per_wall_s"] > 0).all() and "DAMCHA/MHA time per token" in md
    assert (out / "t.png").stat().st_size > 0 and (out / "t.csv.env.json").is_file()


def test_train_throughput_needs_a_task_and_checks_its_output(tmp_path, capsys):
    assert bench.main(["train", "--task", "lm", "--csv", str(tmp_path), "--procs", ""]) == 2  # a directory
    assert "error: csv:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.main(["train", "--variants", "mha", "--d-models", "16"])
    assert exc.value.code == 2  # the synthetic mode has no --d-models: --task selects the stand-ins' mode
    assert bench.main(["train", "--task", "lm", "--plot", str(tmp_path / "t.xyz"), "--procs", ""]) == 2
    assert "error: plot:" in capsys.readouterr().err


def test_the_figure_draws_each_arm_in_the_house_palette(tmp_path):
    from matplotlib.colors import to_hex

    from attention_zoo.experiments.efficiency.train_throughput_report import plot
    from attention_zoo.plots.style import variant_colour

    rows = [{"task": "lm", "variant": v, "d_model": d, "path": path, "status": "ok", "tok_per_cpu_s": 1e4 * d,
             "gemm_fraction": 0.3} for v in ("mha", "damcha") for d in (32, 64) for path in ("one", "ensemble")]
    rows += [{"task": "lm", "variant": v, "d_model": 64, "path": "2 processes x 1 thread", "status": "ok",
              "tok_per_wall_s": 1e5} for v in ("mha", "damcha")]
    fig = plot(pd.DataFrame(rows), ["lm"], tmp_path / "t.png")
    lines = fig.axes[0].get_lines()
    assert [to_hex(ln.get_color()) for ln in lines] == [variant_colour(ln.get_label().split(" ")[0]) for ln in lines]
    assert {to_hex(b.get_facecolor()) for b in fig.axes[2].patches} == {variant_colour("mha"), variant_colour("damcha")}
