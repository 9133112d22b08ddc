"""Benchmark API and CLI on your own shapes; plugins (--include, entry points) seen by the CLIs and subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import attention_zoo as zoo
from attention_zoo.bench import COLUMNS

ROOT = Path(__file__).resolve().parent.parent
FAST = {"warmup": 0, "min_time_s": 0.0, "min_repeats": 3}
PLUGIN = textwrap.dedent('''
    import attention_zoo as zoo
    from attention_zoo.variants.mha import MultiHeadAttention


    @zoo.register_attention("{name}")
    class Mine(MultiHeadAttention):
        """MHA under another name, registered from outside the package."""
''')


def _env(**extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **extra}
    env.pop("ATTENTION_ZOO_INCLUDE", None)
    return env


def test_benchmark_api_two_shape_sweep():
    df = zoo.benchmark(["tha"], [(1, 16, 16, 2), (1, 32, 16, 2)], device="cpu", **FAST)
    assert list(df.columns) == COLUMNS
    assert len(df) == 2 * 2 * 2  # (mha, tha) x 2 shapes x (fwd, fwd_bwd)
    assert (df["status"] == "ok").all() and (df["latency_median_ms"] > 0).all()
    assert df["fwd_gflop_analytic"].gt(0).all() and df["fwd_gflop_counted"].gt(0).all()
    assert df["achieved_gflops"].gt(0).all()
    mha = df[df["variant"] == "mha"]
    assert (mha["latency_vs_mha"] == 1.0).all()
    fb = df[df["mode"] == "fwd_bwd"]
    assert fb["peak_mib"].notna().all() and set(fb["memory_kind"]) == {"peak_rss_mib"}
    assert df["unstable"].isin([True, False]).all() and not df["compiled"].any()
    from attention_zoo.envinfo import cpu_model

    assert (df["cpu_model"] == cpu_model()).all()  # which CPU each figure came from


def test_benchmark_compiled_rows_report_compile_time_and_ratio():
    df = zoo.benchmark("mha", [(1, 16, 16, 2)], device="cpu", modes=("fwd",), compile=True, memory=False, **FAST)
    comp = df[df["compiled"]].iloc[0]
    assert comp["status"] == "ok" and comp["compile_s"] > 0 and comp["compiled_vs_eager"] > 0
    assert pd.isna(df[~df["compiled"]].iloc[0]["compiled_vs_eager"])


def test_compile_fallback_hook_times_eager_and_says_why(monkeypatch, capsys):
    """A variant whose compiled fwd+bwd is slower than eager declares ``compile_fallback``: its compiled row is the
    eager module, with the reason in the row and a warning; the others still compile."""
    from attention_zoo.variants.mha import MultiHeadAttention
    from attention_zoo.variants.mma import MixedMultiHeadAttention

    assert MultiHeadAttention(16, 2).compile_fallback() is None  # the default: compile
    moa = {f: zoo.create_attention("moa", d_model=16, n_heads=4, flavor=f).compile_fallback()
           for f in ("paper", "damcha_repo")}
    assert "routing" in moa["paper"] and moa["damcha_repo"] is None  # declared per flavour
    monkeypatch.setattr(MixedMultiHeadAttention, "compile_fallback", lambda self: "slower compiled (test)")
    df = zoo.benchmark("mma", [(1, 16, 16, 4)], device="cpu", modes=("fwd",), compile=True, memory=False, **FAST)
    comp = df[df["compiled"]].set_index("variant")
    assert comp.loc["mma", "compile_fallback"] == "slower compiled (test)"
    assert pd.isna(comp.loc["mma", "compile_s"]) and "slower compiled (test)" in comp.loc["mma", "message"]
    assert pd.isna(comp.loc["mha", "compile_fallback"]) and comp.loc["mha", "compile_s"] > 0
    assert "mma/paper: --compile falls back to eager (slower compiled (test))" in capsys.readouterr().err


def test_benchmark_autocast_dtype_and_bad_inputs():
    df = zoo.benchmark("mha", [(1, 16, 16, 2)], device="cpu", dtype="bf16", modes=("fwd",), memory=False, **FAST)
    assert (df["dtype"] == "bf16").all() and (df["status"] == "ok").all()
    for kwargs, arg in (({"shapes": [(1, 16, 15, 2)]}, "shapes"), ({"dtype": "fp8"}, "dtype"),
                        ({"modes": ("sideways",)}, "modes"), ({"variants": "nosuch"}, "variants")):
        call = {"variants": "mha", "shapes": [(1, 16, 16, 2)], "device": "cpu", **kwargs}
        with pytest.raises(ValueError, match=f"^{arg}"):
            zoo.benchmark(call.pop("variants"), call.pop("shapes"), **call)


def test_bench_cli_sweep_with_a_plugin_variant(tmp_path):
    plugin = tmp_path / "myattn.py"
    plugin.write_text(PLUGIN.format(name="mine"))
    out = tmp_path / "bench.csv"
    res = subprocess.run([sys.executable, "-m", "attention_zoo.bench", "--include", str(plugin), "--variants", "mine",
                          "--batch", "1", "--seq-len", "16", "32", "--d-model", "16", "--heads", "2",
                          "--warmup", "0", "--min-time", "0.01", "--min-repeats", "3", "--results-file", str(out),
                          "--plot", str(tmp_path / "b.png"), "--quiet", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    df = pd.read_csv(out)
    mine = df[df["variant"] == "mine"]
    assert len(mine) == 4 and (mine["status"] == "ok").all()
    assert mine[mine["mode"] == "fwd_bwd"]["peak_mib"].notna().all()  # the memory subprocess knew the plugin
    assert "peak memory not measured" not in res.stderr
    assert (tmp_path / "b.png").stat().st_size > 0
    assert json.loads(Path(f"{out}.env.json").read_text())["device"] == "cpu"


def test_reproduce_script_sees_a_plugin_in_cli_and_memory_subprocess(tmp_path):
    plugin = tmp_path / "myattn2.py"
    plugin.write_text(PLUGIN.format(name="mine2"))
    res = subprocess.run([sys.executable, str(ROOT / "reproduce" / "table2_efficiency.py"), "--include", str(plugin),
                          "--variants", "mine2", "--settings", "cifar", "--device", "cpu", "--warmup", "0",
                          "--repeats", "2", "--counters", "", "--extra", "--threads", "1", "--quiet",
                          "--out", str(tmp_path / "t2")], capture_output=True, text=True, timeout=300, env=_env(),
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    long = pd.read_csv(tmp_path / "t2" / "table2_efficiency_long.csv")
    mem = long[(long["variant"] == "mine2") & (long["metric"] == "peak_train_rss_mib")]
    assert len(mem) == 1 and mem["status"].iloc[0] == "ok" and mem["value"].iloc[0] > 0


def test_unknown_include_is_a_clean_error(tmp_path):
    res = subprocess.run([sys.executable, "-m", "attention_zoo.bench", "--include", str(tmp_path / "none.py")],
                         capture_output=True, text=True, timeout=120, env=_env(), cwd=ROOT)
    assert res.returncode == 2 and "include" in res.stderr and "Traceback" not in res.stderr


def test_entry_point_group_registers_installed_plugins(tmp_path):
    (tmp_path / "zoo_plugin_pkg.py").write_text(PLUGIN.format(name="fromep"))
    dist = tmp_path / "zoo_plugin_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zoo-plugin-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[attention_zoo.variants]\nfromep = zoo_plugin_pkg\n")
    code = "import attention_zoo as zoo; print(zoo.list_attentions('fromep'))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(PYTHONPATH=str(tmp_path)), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "['fromep']" in res.stdout
