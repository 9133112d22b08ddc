"""``reproduce/all.py`` end to end at the tiny preset: every script runs, every section of results/README.md is there
with its table and figures, and the run record holds the command, commit, machine and each script's timing."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from attention_zoo.experiments.results_index import SECTIONS, missing_outputs
from attention_zoo.experiments.run_all import SCRIPT_ARGS, SCRIPTS, launch_arguments, script_command

ROOT = Path(__file__).resolve().parents[1]
# The tiny preset skips RowSum's diag_vs_full section (300 training steps), the only source of its figures.
TINY_MISSING = {"RowSum analysis: rowsum_analysis/diag_vs_full_over_H.png",
                "RowSum analysis: rowsum_analysis/block_inference_losses.png"}


def test_smoke_preset_covers_the_paper():
    smoke = SCRIPT_ARGS["smoke"]
    for table in ("table1_generation", "table5_gpt2", "table6_vit"):
        args = smoke[table]
        seeds = args[args.index("--seeds") + 1:]
        assert len(seeds) >= 3 and args[args.index("--flavour") + 1] == "both"
        assert "--variants" not in args or args[args.index("--variants") + 1] == "*,controls"  # + the control arms
    from attention_zoo.experiments.synthetic.sweep import PRESETS

    assert PRESETS["smoke"].lambdas == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # the paper's grid, with λ = 0.2
    assert PRESETS["smoke"].des == (4, 8, 12, 16, 20)
    assert len(PRESETS["smoke"].seeds) >= 5 and len(PRESETS["decide"].seeds) >= 10
    cmd = script_command("appendix_e_kde", "smoke", "cpu", Path("somewhere"))
    assert cmd[cmd.index("--table1-dir") + 1] == str(Path("somewhere") / "table1_generation")


def test_all_py_passes_the_launcher_to_the_experiments_only():
    import argparse

    from attention_zoo.experiments.protocol import add_launcher_arguments

    args = add_launcher_arguments(argparse.ArgumentParser()).parse_args(
        ["--launcher", "submitit", "--slurm-partition", "gpu", "--slurm-extra", "slurm_mem_gb=8"])
    launch = launch_arguments(args)
    assert launch == ["--launcher", "submitit", "--slurm-partition", "gpu", "--slurm-extra", "slurm_mem_gb=8"]
    for name in ("synthetic", "table2_efficiency", "synthetic_decide"):
        preset = "decide" if name == "synthetic_decide" else "smoke"
        assert script_command(name, preset, "cpu", Path("r"), None, launch)[-len(launch):] == launch
    assert "--launcher" not in script_command("benchmark", "smoke", "cpu", Path("r"), None, launch)  # timed here
    local = add_launcher_arguments(argparse.ArgumentParser()).parse_args([])
    assert launch_arguments(local) == []


def test_all_py_tiny_writes_every_section_and_figure(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(ROOT / "reproduce" / "all.py"), "--preset", "tiny", "--device", "cpu",
                           "--threads", "1", "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(missing_outputs(tmp_path)) == TINY_MISSING
    readme = (tmp_path / "README.md").read_text()
    for sec in SECTIONS:
        assert f"## {sec.name}: {sec.title}" in readme
    for name in ("Table 1", "Table 2", "Table 3", "Table 4", "Table 5", "Table 6", "Table 7", "Figure 12",
                 "Figure 13", "Appendix E", "Appendix F", "Appendix G", "Appendix H", "RowSum analysis", "Benchmark"):
        assert f"## {name}: " in readme
    record = json.loads((tmp_path / "run_all.json").read_text())
    run = record["runs"][-1]
    assert run["preset"] == "tiny" and run["git_commit"] and run["total_wall_s"] > 0 and run["cores"]
    assert set(record["scripts"]) == set(SCRIPTS)
    assert all(s["exit_code"] == 0 and s["wall_s"] > 0 for s in record["scripts"].values())
    assert "python reproduce/all.py --preset tiny" in readme and run["git_commit"] in readme
    assert "whole run:" in readme and "| `table1_generation` |" in readme
    # rebuilding the index alone keeps the recorded timings
    assert subprocess.run([sys.executable, str(ROOT / "reproduce" / "all.py"), "--index-only", "--out",
                           str(tmp_path)], env=env, capture_output=True).returncode == 0
    assert "| `table1_generation` |" in (tmp_path / "README.md").read_text()


def handles_sigint(flag: Path) -> str:
    """Python source: on SIGINT write ``flag`` and exit 130, as a script or worker that stops cleanly does."""
    return ("import pathlib, signal, sys\n"
            f"def stop(*_):\n    pathlib.Path({str(flag)!r}).write_text('x')\n    sys.exit(130)\n"
            "signal.signal(signal.SIGINT, stop)\n")


def run_and_ctrl_c(cmd: list[str], ready: Path) -> tuple[int, bool]:
    """``run_script(cmd)``, with a Ctrl-C to this process once ``ready`` exists (as a Ctrl-C would reach all.py).
    Python's own SIGINT handler is installed for the call: a test run started in the background (`pytest &`)
    inherits SIGINT ignored, and the Ctrl-C would then never reach run_script."""
    import signal
    import threading

    from attention_zoo.experiments.run_all import run_script

    def interrupt_when_ready():
        for _ in range(600):
            if ready.exists():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_when_ready, daemon=True).start()
        return run_script(cmd)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_ctrl_c_reaches_the_running_script_which_ends_cleanly(tmp_path):
    """all.py passes a Ctrl-C on to its script and waits for the script's own clean stop (exit 130, cells stored)
    instead of killing it mid-write; the interrupt is reported, not raised as a traceback."""
    ready, done = tmp_path / "ready", tmp_path / "stopped cleanly"
    child = handles_sigint(done) + f"import time\npathlib.Path({str(ready)!r}).write_text('x')\ntime.sleep(60)\n"
    rc, stopped = run_and_ctrl_c([sys.executable, "-c", child], ready)
    assert stopped and rc == 130 and done.exists()  # its own handler ran: not a SIGKILL (rc -9)


def test_a_ctrl_c_sent_to_the_driver_alone_also_reaches_the_scripts_workers(tmp_path):
    """`kill -INT <all.py pid>` reaches only all.py; the script's workers must stop too (as a terminal Ctrl-C would
    stop them), or the script waits on workers that keep training. The planted script has one worker process."""
    ready, worker_stopped = tmp_path / "worker ready", tmp_path / "worker stopped"
    worker = (handles_sigint(worker_stopped)
              + f"import time\npathlib.Path({str(ready)!r}).write_text('x')\ntime.sleep(60)\n")
    script = ("import signal, subprocess, sys\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # the main process waits for its worker
              f"sys.exit(subprocess.call([sys.executable, '-c', {worker!r}]))\n")
    rc, stopped = run_and_ctrl_c([sys.executable, "-c", script], ready)
    assert stopped and rc == 130 and worker_stopped.exists()
