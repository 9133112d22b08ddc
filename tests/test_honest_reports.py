"""Noise guard on timings, honest paper | ours | delta rules, one schema for every results file."""

from __future__ import annotations

import math
import time

import pandas as pd
import pytest

from attention_zoo.experiments.efficiency import table2_efficiency as t2
from attention_zoo.measure.latency import LatencyResult, check_consistency, measure_latency, warn_unstable
from attention_zoo.report import UNSTABLE_MARK, comparison_frame, format_comparison, mark_values, write_tables

QUIET = {"load_before": 0.0, "load_after": 0.0, "other_cpu_cores": 0.0, "cores": 2}


# ---- noise guard ------------------------------------------------------------------------------------------------
def test_noisy_timing_is_marked_unstable(capsys):
    delays = iter([0.001, 0.02] * 50)
    res = measure_latency(lambda: time.sleep(next(delays)), "cpu", warmup=0, min_time_s=0.0, min_repeats=10)
    assert res.unstable and "IQR/median" in res.unstable_reason
    warn_unstable("sleepy", res)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: sleepy: unstable timing") and "IQR/median" in err[0]


def test_steady_timing_on_a_quiet_machine_is_stable():
    res = LatencyResult.from_times([10.0, 10.1, 10.05, 9.95, 10.0], "cpu", 0, QUIET)
    assert not res.unstable and res.unstable_reason == ""


@pytest.mark.parametrize("load, why", [({**QUIET, "load_after": 9.0}, "load average"),
                                       ({**QUIET, "other_cpu_cores": 1.5}, "other processes")])
def test_busy_machine_marks_unstable(load, why):
    res = LatencyResult.from_times([10.0] * 5, "cpu", 0, load)
    assert res.unstable and why in res.unstable_reason


def test_repeats_adapt_to_a_minimum_time():
    res = measure_latency(lambda: time.sleep(0.01), "cpu", warmup=0, min_time_s=0.15, min_repeats=3)
    assert res.repeats >= 10 and sum(res.times_ms) >= 150
    fixed = measure_latency(lambda: None, "cpu", warmup=0, repeats=4)
    assert fixed.repeats == 4
    with pytest.raises(ValueError, match="^min_time_s"):
        measure_latency(lambda: None, "cpu", min_time_s=float("nan"))
    assert {"load_before", "load_after", "other_cpu_cores"} <= set(res.load)


def test_forward_slower_than_fwd_bwd_is_caught():
    fwd = LatencyResult.from_times([20.0] * 5, "cpu", 0, QUIET)
    both = LatencyResult.from_times([10.0] * 5, "cpu", 0, QUIET)
    check_consistency(fwd, both)
    assert fwd.unstable and both.unstable and "slower than forward+backward" in fwd.unstable_reason


def _t2_rows(unstable: bool) -> pd.DataFrame:
    base = {"setting": "CIFAR-10/100", "seq_len": 64, "batch": 1, "flavour": "paper", "status": "ok",
            "message": "", "unit": "ms"}
    rows = []
    for v, ms in (("mha", 1.0), ("tha", 2.0)):
        bad = unstable and v == "tha"
        rows += [{**base, "variant": v, "metric": "latency_fwd_median_ms", "value": ms, "unstable": bad,
                  "unstable_reason": "IQR/median 30% > 10%" if bad else ""},
                 {**base, "variant": v, "metric": "latency_fwd_bwd_median_ms", "value": 3 * ms, "unstable": False,
                  "unstable_reason": ""}]
    return pd.DataFrame(rows)


def test_table2_marks_unstable_numbers_in_markdown(tmp_path):
    df = _t2_rows(unstable=True)
    wide = t2.wide_frame(df)
    marks = t2.unstable_marks(df)
    shown = mark_values(wide, marks, t2.INDEX)
    tha = shown[shown["variant"] == "tha"].iloc[0]
    assert str(tha["fwd ms (median)"]).endswith(UNSTABLE_MARK)
    assert not str(tha["fwd+bwd ms (median)"]).endswith(UNSTABLE_MARK)
    assert "IQR/median" in wide[wide["variant"] == "tha"]["timing"].iloc[0]
    assert not str(shown[shown["variant"] == "mha"].iloc[0]["fwd ms (median)"]).endswith(UNSTABLE_MARK)
    assert t2.unstable_marks(_t2_rows(unstable=False)) == {}
    png = t2.plots(df.assign(unit="ms"), tmp_path)
    assert png and all(p.exists() for p in png)


def test_table2_an_unstable_mha_baseline_marks_every_ratio_of_its_setting():
    df = _t2_rows(unstable=False)
    df.loc[(df["variant"] == "mha") & (df["metric"] == "latency_fwd_median_ms"), "unstable"] = True
    wide = t2.wide_frame(df)
    shown = mark_values(wide, t2.unstable_marks(df, wide), t2.INDEX)
    tha = shown[shown["variant"] == "tha"].iloc[0]
    assert str(tha["fwd latency / MHA"]).endswith(UNSTABLE_MARK)  # its denominator is unstable
    assert not str(tha["fwd ms (median)"]).endswith(UNSTABLE_MARK)  # its own timing is not
    assert not str(tha["fwd+bwd latency / MHA"]).endswith(UNSTABLE_MARK)


# ---- comparison rules -------------------------------------------------------------------------------------------
def test_not_comparable_rows_get_no_delta():
    df = comparison_frame([{"what": "a", "paper": 10.0, "ours": 12.0, "note": "not comparable: smoke on digits"},
                           {"what": "b", "paper": 10.0, "ours": 12.0, "note": ""}])
    assert math.isnan(df["delta"].iloc[0]) and math.isnan(df["delta_pct"].iloc[0])
    assert df["delta"].iloc[1] == pytest.approx(2.0) and df["delta_pct"].iloc[1] == pytest.approx(20.0)
    assert "not comparable" in format_comparison(df)


def test_delta_of_percentages_is_in_points():
    df = comparison_frame([{"what": "top-1 (%)", "paper": 80.0, "ours": 70.0},
                           {"what": "accuracy", "paper": 50.0, "ours": 55.0, "unit": "%"},
                           {"what": "a vs b (test loss %)", "paper": -3.7, "ours": -0.4}])
    assert list(df["delta"]) == pytest.approx([-10.0, 5.0, 3.3])
    assert list(df["delta_unit"]) == ["pp", "pp", "pp"]
    assert df["delta_pct"].isna().all()  # never a percent of a percent
    assert "-10.0000 pp" in format_comparison(df)


def test_one_value_is_never_compared_with_two_paper_numbers():
    src = ("digits", "damcha", "fid_top50")
    df = comparison_frame([{"what": "cifar10 FID", "paper": 50.0, "ours": 60.0, "source": src},
                           {"what": "cifar100 FID", "paper": 53.0, "ours": 60.0, "source": src},
                           {"what": "other", "paper": 1.0, "ours": 2.0, "source": ("x",)}])
    assert list(df["what"]) == ["cifar10 FID", "other"] and "source" not in df


def test_table2_memory_ratio_says_what_was_measured():
    rows = []
    for v, mib in (("tha", 10.0), ("damcha", 20.0)):
        rows.append({"variant": v, "flavour": "paper", "seq_len": 64, "metric": "peak_train_rss_mib", "value": mib,
                     "status": "ok", "unit": "MiB", "setting": "CIFAR-10/100"})
    comp = t2.paper_comparison(pd.DataFrame(rows), "paper")
    mem = comp[comp["what"].str.contains("memory")].iloc[0]
    assert "CPU peak RSS" in mem["note"] and "GPU allocation" in mem["note"]
    assert mem["note"].startswith("not comparable") and math.isnan(mem["delta"])  # no delta across devices


def test_table2_compares_the_paper_gflops_like_for_like_and_explains_counter_gaps():
    from attention_zoo.experiments.efficiency.table2_report import gap_notes

    rows = [{"variant": v, "flavour": "paper", "seq_len": 64, "metric": "fwd_gflops_analytic", "value": g,
             "status": "ok", "unit": "GFLOP", "setting": "CIFAR-10/100"}
            for v, g in (("damcha", 0.22), ("damcha[hidden_dims=()]", 0.08))]
    comp = t2.paper_comparison(pd.DataFrame(rows), "smoke")
    like = comp[comp["what"].str.contains(r"hidden_dims=\(\)", regex=True)].iloc[0]
    assert like["ours"] == pytest.approx(0.08) and not math.isnan(like["delta"])
    default = comp[comp["what"].str.contains("default generator")].iloc[0]
    assert default["ours"] == pytest.approx(0.22) and math.isnan(default["delta"])
    flags = pd.DataFrame([{"variant": "tha", "flavour": "paper", "metric": "flop_counter_agrees", "value": 0.0,
                           "setting": "WMT"}])
    assert "causal" in gap_notes(flags)  # THA declares why its counters see less than the analytic count


# ---- one schema -------------------------------------------------------------------------------------------------
def test_write_tables_one_schema(tmp_path):
    long = pd.DataFrame([{"variant": "mha", "flavour": "paper", "metric": "x", "value": 1.0, "unit": "ms"},
                         {"variant": "mha", "flavour": "paper", "metric": "x_raw", "value": 1.1, "unit": "ms",
                          "repeat": 0}])
    wide = pd.DataFrame([{"variant": "mha", "flavour": "paper", "x": 1.0}])
    paths = write_tables(tmp_path, "s", long, wide, {"runs": []}, "T")
    got = pd.read_csv(paths["long"])
    assert "flavor" in got and "flavour" not in got and "repeat" not in got and len(got) == 1
    assert "flavor" in pd.read_csv(paths["wide"])
    raw = pd.read_csv(paths["raw"])
    assert list(raw["repeat"]) == [0]
    with pytest.raises(ValueError, match="^long_df"):
        write_tables(tmp_path, "s", long.drop(columns="unit"), wide, {}, "T")


def test_mixed_runs_are_flagged_in_markdown(tmp_path):
    long = pd.DataFrame([{"metric": "x", "value": 1.0, "unit": "ms"}])
    runs = [{"run_id": "r1", "git_commit": "aaaa"}, {"run_id": "r2", "git_commit": "bbbb", "git_dirty": True}]
    md = write_tables(tmp_path, "s", long, long, {"runs": runs}, "T")["md"].read_text()
    assert "Mixed runs" in md and "r1" in md and "(dirty)" in md
    single = write_tables(tmp_path, "s", long, long, {"runs": runs[:1]}, "T")["md"].read_text()
    assert "Mixed runs" not in single


def test_quick_benchmark_flags_rates_above_the_gemm_rate():
    from attention_zoo.measure.quick import check_gemm_bound

    rows = {"a": {"status": "ok", "achieved_gflops": 150.0, "unstable": False, "unstable_reason": None},
            "b": {"status": "ok", "achieved_gflops": 50.0, "unstable": False, "unstable_reason": None}}
    check_gemm_bound(rows, gemm=100.0)
    assert rows["a"]["unstable"] and "GEMM rate" in rows["a"]["unstable_reason"]
    assert not rows["b"]["unstable"]


def test_quick_benchmark_says_which_cpu_and_where_mha_time_goes(tmp_path):
    """Every figure of the quick benchmark carries the CPU it came from (markdown header, CSV column), and the MHA
    breakdown rows (layer, projections, SDPA core, the rest) are written with their shares of the layer."""
    from attention_zoo.envinfo import cpu_model
    from attention_zoo.measure.quick import main

    csv, md = tmp_path / "q.csv", tmp_path / "q.md"
    main(["--variants", "mha", "--batch", "1", "--seq-len", "8", "--d-model", "8", "--heads", "2", "--layers", "1",
          "--vocab", "8", "--warmup", "0", "--repeats", "2", "--threads", "1", "--csv", str(csv), "--md", str(md)])
    df = pd.read_csv(csv)
    assert (df["cpu_model"] == cpu_model()).all() and cpu_model()
    text = md.read_text()
    assert f"CPU: {cpu_model()}" in text and "where the time goes" in text
    parts = df[df["case"].str.startswith("mha breakdown: ")].set_index("case")
    assert len(parts) == 4 and (parts["fwd_bwd_ms"].notna()).all()
    assert parts.loc["mha breakdown: mha layer", "layer_share"] == 1.0
    shares = parts["layer_share"].drop("mha breakdown: mha layer")
    assert abs(shares.sum() - 1.0) < 1e-9


def test_a_record_is_dirty_for_changed_code_but_not_for_the_runs_own_outputs(tmp_path):
    import subprocess

    from attention_zoo.envinfo import tree_dirty

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    assert not tree_dirty(tmp_path)
    (tmp_path / "results" / "table.md").write_text("new\n")  # a run writing its outputs
    assert not tree_dirty(tmp_path)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert tree_dirty(tmp_path)


@pytest.mark.parametrize("setting", [None, "1"])
def test_large_cpu_tensors_sit_on_huge_pages_when_opted_in_and_the_record_says_which(setting):
    """``THP_MEM_ALLOC_ENABLE=1``, set by the user (``import attention_zoo`` sets nothing), asks PyTorch's CPU
    allocator for transparent huge pages, and the environment record reports what the kernel actually gave an 8 MiB
    tensor."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        mode = None
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if setting is not None:
        env["THP_MEM_ALLOC_ENABLE"] = setting
    code = ("import json, attention_zoo\nfrom attention_zoo.envinfo import environment_record\n"
            "r = environment_record()\nprint(json.dumps([r['thp_mem_alloc_enable'], r['cpu_huge_pages']]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    asked, got = json.loads(out.stdout.strip().splitlines()[-1])
    assert asked == setting
    if mode is None:  # not Linux: nothing to ask the kernel
        assert got is None
    else:  # "always" gives huge pages regardless, "never" refuses them; "madvise" follows the allocator's request
        assert got == {"always": True, "never": False, "madvise": asked == "1"}[mode]


@pytest.mark.parametrize("setting", [None, "0"])
def test_cpu_timing_keeps_freed_memory_unless_opted_out_and_the_record_says_which(setting):
    """While timing on CPU (``SteadyHeap``) freed memory is kept for reuse (as a GPU caching allocator does): a freed
    64 MiB tensor stays resident instead of going back to the kernel, and the warm-up ends with a touched pad that
    stays resident for later growth; ``ATTENTION_ZOO_MALLOC_RETAIN=0`` keeps glibc's default, which returns freed
    blocks, and pads nothing. After the scope glibc's default is back either way. The record says which applied."""
    import json
    import os
    import platform
    import subprocess
    import sys

    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        pytest.skip("glibc malloc only")
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_ZOO_MALLOC_RETAIN"}
    if setting is not None:
        env["ATTENTION_ZOO_MALLOC_RETAIN"] = setting
    code = ("import json, torch\nfrom attention_zoo.envinfo import SteadyHeap, environment_record\n"
            "def rss():\n"
            "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS'))\n"
            "def freed():\n"
            "    t = torch.ones(1 << 24); t2 = torch.ones(1 << 26); held = rss(); del t, t2\n"
            "    return (held - rss()) / 1024\n"
            "before = rss()\n"
            "with SteadyHeap('cpu') as heap:\n"
            "    heap.settle(); padded = (rss() - before) / 1024; kept = freed()\n"
            "print(json.dumps([environment_record()['cpu_malloc_retained'], padded, kept, freed()]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    retained, padded_mib, freed_mib, freed_after_mib = json.loads(out.stdout.strip().splitlines()[-1])
    # the scope restored glibc's default: the freed 256 MiB block goes back to the kernel (the 64 MiB one may be
    # served from the heap's free space and stay; measured 256.004 or 320 MiB, ~0 while memory is kept)
    assert freed_after_mib > 192, (retained, padded_mib, freed_mib, freed_after_mib)
    if setting == "0":
        assert retained is False and padded_mib < 32  # no pad
        assert freed_mib > 192, freed_mib  # the 256 MiB block (and the 64 MiB one, if mapped) returned at once
    else:
        assert retained is True and padded_mib > 230, padded_mib  # the 256 MiB pad stays resident
        assert freed_mib < 16, freed_mib  # still resident, for the next step's buffers


def test_a_tuned_figure_names_each_arms_setting_and_its_reference(tmp_path, monkeypatch):
    """The caption of a tuned preset's figure lists every arm's chosen setting (never the grid's or the shared
    setting's), nothing for untuned rows; the delta plot draws its legend (reference, interval, n) and caption."""
    from attention_zoo import plots
    from attention_zoo.report import setting_note

    rows = [{"variant": v, "flavor": "paper", "lr": lr, "weight_decay": 0.1, "phase": phase}
            for v, lr, phase in (("mha", 4e-3, "tuned"), ("damcha", 2e-3, "tuned"), ("damcha", 1e-3, "tune"),
                                 ("damcha", 2e-3, "shared"))]
    note = setting_note(pd.DataFrame(rows))
    assert note.endswith("damcha/paper lr 0.002, wd 0.1; mha/paper lr 0.004, wd 0.1.") and "0.001" not in note
    assert setting_note(pd.DataFrame(rows).drop(columns="phase")) is None
    assert setting_note(pd.DataFrame(rows).assign(phase="tune")) is None
    per_set = pd.concat([pd.DataFrame(rows).assign(dataset=ds, lr=lr) for ds, lr in (("digits", 4e-3), ("text", 1e-3))])
    per_note = setting_note(per_set, arms=("dataset", "variant"))  # each dataset tunes its own: both choices named
    assert "digits/mha lr 0.004, wd 0.1" in per_note and "text/mha lr 0.001, wd 0.1" in per_note
    deltas = pd.DataFrame({"arm": ["damcha/paper"], "panel": ["test bpc"], "mean": [1.0], "low": [0.5],
                           "high": [1.5], "n": [10]})
    seen = {}
    real = plots.atomic_savefig

    def keep(fig, path, **kw):
        seen["texts"] = [t.get_text() for t in fig.texts] + [t.get_text() for ax in fig.axes
                                                               for leg in [ax.get_legend()] if leg
                                                               for t in leg.get_texts()]
        return real(fig, path, **kw)

    monkeypatch.setattr(plots, "atomic_savefig", keep)
    plots.delta_plot(deltas, "panel", tmp_path / "d.png", "title", "x", reference="MHA/paper", note=note)
    assert (tmp_path / "d.png").stat().st_size > 0
    assert "0 = MHA/paper (reference)" in seen["texts"] and "mean paired difference (n = 10 seeds)" in seen["texts"]
    assert any("mha/paper lr 0.004" in t for t in seen["texts"])
    curves = pd.DataFrame({"step": [1, 2, 1, 2], "loss": [2.0, 1.5, 2.1, 1.4], "arm": ["mha/paper"] * 4})
    plots.line_plot(curves, "step", "loss", "arm", tmp_path / "c.png", "title", "validation loss", note=note)
    assert any("mha/paper lr 0.004" in t for t in seen["texts"])  # learning curves at tuned settings say so too
