"""Every reproduce script answers bad input with one ``error: ...`` line and exit code 2, never a traceback."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attention_zoo.experiments.common import parse_extra_configs
from attention_zoo.experiments.protocol import EXPERIMENTS
from attention_zoo.registry import _parse_value

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["appendix_e_kde", "appendix_fgh", "rowsum_analysis", "run_all", "synthetic", "table1_generation",
           "table2_efficiency", "table3_depth_blocks", "table4_ablation", "table5_gpt2", "table6_vit",
           "table7_complexity"]
# (script, argv, start of the message): errors raised by our own validation inside main()
OUR_ERRORS = [
    ("appendix_e_kde", ["--variants", "nosuch"], "variants:"),
    ("appendix_fgh", ["--device", "tpu"], "device:"),
    ("rowsum_analysis", ["--device", "tpu"], "device:"),
    ("run_all", ["--only", "nosuch"], "only:"),
    ("synthetic", ["--device", "tpu"], "device:"),
    ("table1_generation", ["--variants", "nosuch"], "variants:"),
    ("table2_efficiency", ["--device", "tpu"], "device:"),
    ("table2_efficiency", ["--device", "cpu", "--extra", "damcha:fused_rowsum=maybe"], "extra:"),
    ("table3_depth_blocks", ["--variants", "nosuch"], "variants:"),
    ("table4_ablation", ["--variants", "nosuch"], "variants:"),
    ("table5_gpt2", ["--variants", "nosuch"], "variants:"),
    ("table6_vit", ["--variants", "nosuch"], "variants:"),
    ("table7_complexity", ["--device", "tpu"], "device:"),
]
# options rejected up front by argparse (its own "error:" line, exit 2)
ARGPARSE_ERRORS = [(s, ["--threads", "0"]) for s in SCRIPTS if s != "run_all"] + [
    (s, ["--seeds", "-1"]) for s in ("appendix_e_kde", "synthetic", "table1_generation", "table3_depth_blocks",
                                     "table4_ablation", "table5_gpt2", "table6_vit")] + [
    ("synthetic", ["--seeds", str(2**32)]), ("synthetic", ["--lambda", "nan"]), ("synthetic", ["--lambda", "-0.5"]),
    ("synthetic", ["--lambda", "inf"]), ("synthetic", ["--workers", "0"]), ("synthetic", ["--de", "0"]),
    ("table2_efficiency", ["--batch", "0"]), ("table2_efficiency", ["--memory-workers", "0"]),
    ("table2_efficiency", ["--min-time", "nan"]), ("table7_complexity", ["--memory-workers", "-1"]),
    ("table7_complexity", ["--seq-lens", "0"]), ("table6_vit", ["--workers", "0"]),
    ("table6_vit", ["--eval-batches", "0"]), ("table6_vit", ["--batch-size", "x"]),
    ("table5_gpt2", ["--eval-batches", "-1"]), ("appendix_fgh", ["--seed", "-3"]),
    ("table1_generation", ["--eval-samples", "0"]),
    # options a script does not use are not offered
    ("table2_efficiency", ["--seeds", "1"]), ("table7_complexity", ["--seeds", "1"]),
    ("rowsum_analysis", ["--variants", "mha"]), ("rowsum_analysis", ["--flavour", "paper"]),
    ("appendix_fgh", ["--variants", "mha"]), ("appendix_fgh", ["--flavour", "paper"]),
]


def main_of(script):
    if script == "run_all":
        return importlib.import_module("attention_zoo.experiments.run_all").main
    return EXPERIMENTS[script].load().main


@pytest.mark.parametrize("script,argv,start", OUR_ERRORS, ids=[f"{s}-{a[-1]}" for s, a, _ in OUR_ERRORS])
def test_our_errors_are_one_line(script, argv, start, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--out", str(tmp_path / "out"), "--quiet"]
    if script == "run_all":
        argv = argv[:2] + ["--out", str(tmp_path / "out")]
    assert main_of(script)(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {start}"), err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("script,argv", ARGPARSE_ERRORS, ids=[f"{s}-{'='.join(a)}" for s, a in ARGPARSE_ERRORS])
def test_bad_options_are_rejected_up_front(script, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main_of(script)(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize("script", ["table7_complexity", "synthetic"])
def test_script_process_prints_no_traceback(script, tmp_path):
    cmd = [sys.executable, str(ROOT / "reproduce" / f"{script}.py"), "--device", "nosuch", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: device: expected auto, cpu, cuda or cuda:N, got 'nosuch'"]


def test_help_prints_each_default_once(capsys):
    for script in SCRIPTS:
        with pytest.raises(SystemExit):
            main_of(script)(["--help"])
        out = capsys.readouterr().out
        options = out.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]  # the epilog follows a blank line
        for block in options.split("\n  -")[1:]:
            text = " ".join(block.split())
            assert len(re.findall(r"\bdefault\b", text, re.I)) <= 1, (script, text)
            assert not re.search(r"issue|#\d", text, re.I), (script, text)


@pytest.mark.parametrize("raw,value", [("true", True), ("Yes", True), ("1", True), ("false", False), ("no", False),
                                       ("0", False)])
def test_extra_bool_values(raw, value):
    assert _parse_value(raw, bool_option=True) is value
    assert parse_extra_configs([f"damcha:fused_rowsum={raw}"])[0][1] == {"fused_rowsum": value}


@pytest.mark.parametrize("raw", ["maybe", "2", "", "tru"])
def test_extra_bool_values_reject_others(raw):
    with pytest.raises(ValueError, match="^extra: damcha:collapsed_generator: expected true/false"):
        parse_extra_configs([f"damcha:collapsed_generator={raw}"])
    with pytest.raises(ValueError, match="^extra: mha:bias:"):
        parse_extra_configs([f"mha:bias={raw}"])


def test_extra_non_bool_values_keep_their_types():
    assert parse_extra_configs(["damcha:compact_rank=2,kl_weight=0.5,off_diag_mode=bayesian"])[0][1] == {
        "compact_rank": 2, "kl_weight": 0.5, "off_diag_mode": "bayesian"}
