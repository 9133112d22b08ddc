"""Run every table and figure at one preset (finished cells are skipped by each script), then write
``results/README.md``. Each script runs in its own process; a failing script is reported and the rest go on.

Presets: ``smoke`` covers the whole paper on embedded data on a 2-core CPU (every variant in both flavours and the
control arms, three seeds in Tables 1, 5 and 6, five in Tables 3, 4, App. F–H and the synthetic sweeps at 200 steps,
λ ∈ {0, 0.2, …, 1} and d_e ∈ {4, 8, …, 20}), plus the quick and the training-throughput benchmarks; ``decide`` runs
the decide presets (every arm tuned on one grid, then ten seeds at its best, trained to a validation plateau) of
Table 5, Table 6, the synthetic sweeps, Tables 1, 3, 4, MQAR and the masked LM, in that order, into
``<results>/<name>`` (``DECIDE``);
``paper`` runs each script's paper preset with its defaults (see docs/paper_scale.md); ``tiny`` is the smoke
pipeline shrunk to seconds per script (two variants, a few steps, random FID features) for the test suite — its
numbers mean nothing. The command, commit, machine and each script's wall and CPU time go to
``<results>/run_all.json``, which the index reads; commands are recorded relative to the repository root.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..envinfo import environment_record, resolve_device
from ..io import atomic_write_json
from ..results import ensure_out_dir
from ..workers import child_preexec, terminate_as_interrupt
from .common import DeviceAction, ExperimentParser, HelpFormatter, ListAction, cli_main, positive_int
from .protocol import EXPERIMENTS, LAUNCH_OPTIONS, add_launcher_arguments
from .results_index import RUN_RECORD, build_index

ROOT = Path(__file__).resolve().parents[2]
REPRODUCE = ROOT / "reproduce"
# The experiments in the protocol's order (Appendix E reads Table 1's per-sample scores), then the benchmarks:
# "benchmark" is attention_zoo.measure.quick, "train_speed" the training-throughput mode of attention_zoo.bench.
SCRIPTS = (*EXPERIMENTS, "benchmark", "train_speed")
# The decide presets (run name -> script), in the order the compute goes: the headline Tables 5 and 6 first.
DECIDE = {"table5_decide": "table5_gpt2", "table6_decide": "table6_vit", "synthetic_decide": "synthetic",
          "table1_decide": "table1_generation", "table3_decide": "table3_depth_blocks",
          "table4_decide": "table4_ablation", "mqar_decide": "mqar", "masked_lm_decide": "masked_lm"}
PRESETS = ("smoke", "decide", "paper", "tiny")

_ALL_ROWS = ["--variants", "*,controls", "--flavour", "both"]  # every variant (both flavours) and the controls
_TINY_GEN = ["--steps", "2", "--eval-samples", "8", "--fid-extractor", "tiny-random", "--image-size", "16"]
_TINY_TIMING = ["--repeats", "1", "--warmup", "0", "--extra"]

# Per preset, the arguments each script gets beyond --preset/--device/--out/--quiet. Coverage lives here; sizes
# (steps, models, scored samples) live in the scripts' presets. Flavours and seeds are spelled out wherever they
# differ from the scripts' shared defaults (flavour paper; seeds per script), so these runs stay what they were.
SCRIPT_ARGS: dict[str, dict[str, list[str]]] = {
    "smoke": {
        "table2_efficiency": ["--flavour", "both"],
        "table1_generation": [*_ALL_ROWS, "--seeds", "0", "1", "2"],
        "table5_gpt2": [*_ALL_ROWS, "--seeds", "0", "1", "2"],
        "table6_vit": [*_ALL_ROWS, "--seeds", "0", "1", "2"],
        "appendix_e_kde": ["--flavour", "both"],
        "synthetic": ["--variants", "*,controls"],  # its smoke grids and default seeds 0-4
        "benchmark": ["--variants", "*", "--flavor", "both", "--repeats", "15"],  # 5 rounds left IQRs of 30 %
        "train_speed": ["--seeds", "10", "--steps", "20", "--rounds", "5", "--shapes", "regression:1",
                        "classification:20"],
        "scaling": ["--variants", "mha,dcmha,damcha,mha_pm"],  # its smoke ladder's core arms
    },
    "decide": {name: [] for name in DECIDE},
    "paper": {
        "table2_efficiency": ["--flavour", "both"],
        "table1_generation": ["--flavour", "damcha_repo"],  # the baselines as the paper ran them
        "table5_gpt2": ["--flavour", "damcha_repo"],
        "table6_vit": ["--flavour", "damcha_repo"],
        "appendix_e_kde": ["--flavour", "both"],
    },
    "tiny": {
        "table2_efficiency": ["--variants", "mha,damcha", "--flavour", "paper", "--settings", "cifar", "--counters",
                              "", *_TINY_TIMING],
        "table7_complexity": ["--variants", "mha,damcha", "--flavour", "paper", "--seq-lens", "16", "32",
                              "--d-models", "16", "32", "--causal", "false", *_TINY_TIMING],
        "synthetic": ["--variants", "mha,damcha", "--lambda", "0", "1", "--de", "4", "--seeds", "0", "1", "--steps",
                      "2", "--workers", "1"],
        "table5_gpt2": ["--variants", "mha,damcha", "--flavour", "paper", "--steps", "2", "--eval-batches", "1",
                        "--train", "eval_every=1", "eval_max_batches=1"],
        "table1_generation": ["--variants", "mha,damcha", "--flavour", "paper", "--datasets", "digits", *_TINY_GEN],
        "appendix_e_kde": ["--flavour", "paper"],
        "table3_depth_blocks": ["--depths", "1", *_TINY_GEN],
        "table4_ablation": ["--datasets", "digits", *_TINY_GEN],
        "table6_vit": ["--variants", "mha,damcha", "--flavour", "paper", "--steps", "2", "--eval-batches", "1"],
        "appendix_fgh": ["--steps", "4"],
        "scaling": ["--variants", "mha,damcha", "--rungs", "16", "24"],
        "rowsum_analysis": ["--sections", "gradient_identity,equivalence"],  # the others: 300 steps, B=4 T=512
        "benchmark": ["--variants", "mha,damcha", "--batch", "1", "--seq-len", "16", "--d-model", "16", "--heads",
                      "2", "--layers", "1", "--warmup", "0", "--repeats", "1"],
        "train_speed": ["--variants", "mha", "--seeds", "2", "--steps", "1", "--rounds", "1", "--warmup", "0"],
        "mqar": ["--arms", "mha", "dcmha", "--steps", "2", "--train", "eval_every=1"],
        "masked_lm": ["--arms", "mha", "moa", "--steps", "2", "--train", "eval_every=1", "eval_max_batches=1"],
    },
}


def scripts_of(preset: str) -> tuple[str, ...]:
    """The scripts a preset runs: an experiment without that preset (the baselines' stand-ins have no paper preset)
    is left out; ``tiny`` runs the smoke presets."""
    if preset == "decide":
        return tuple(DECIDE)
    own = "smoke" if preset == "tiny" else preset
    return tuple(s for s in SCRIPTS if s not in EXPERIMENTS or own in EXPERIMENTS[s].presets)


def shown_command(cmd: list[str]) -> str:
    """The command as a reader reruns it from the repository root (no absolute paths of this machine)."""
    def rel(a: str) -> str:
        p = Path(a)
        if p.is_absolute():
            try:
                return str(p.relative_to(ROOT))
            except ValueError:
                return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else a
        return a

    return shlex.join(["python", *(rel(a) for a in cmd[1:])])


def launch_arguments(args: argparse.Namespace) -> list[str]:
    """all.py's launcher options as the experiment scripts take them (nothing for the local default)."""
    if getattr(args, "launcher", "local") == "local":
        return []
    parser = add_launcher_arguments(argparse.ArgumentParser())
    out = []
    for action in parser._actions:
        key = action.dest
        if key not in LAUNCH_OPTIONS or getattr(args, key, None) in (None, action.default, []):
            continue
        value = getattr(args, key)
        out += [action.option_strings[0], *([str(v) for v in value] if isinstance(value, list) else [str(value)])]
    return out


@functools.cache
def accepts(name: str, flag: str) -> bool:
    """Whether experiment ``name``'s script takes ``flag`` (all.py passes --data-dir and --no-download to those)."""
    return name in EXPERIMENTS and flag in EXPERIMENTS[name].load().build_parser()._option_string_actions


def data_arguments(name: str, data_dir: str | None, download: bool = True) -> list[str]:
    """all.py's --data-dir / --no-download as script ``name`` takes them (nothing where it does not)."""
    out = ["--data-dir", str(data_dir)] if data_dir is not None and accepts(name, "--data-dir") else []
    return out + (["--no-download"] if not download and accepts(name, "--no-download") else [])


def script_command(name: str, preset: str, device: str, results: Path, threads: int | None = None,
                   launch: list[str] | None = None, data: tuple[str | None, bool] = (None, True),
                   dry_run: bool = False) -> list[str]:
    """The command line of one script at a run_all preset (``tiny`` runs the scripts' smoke preset); ``launch``:
    launcher options, passed to the experiment scripts (the benchmarks run here); ``data``: all.py's --data-dir
    and download switch; ``dry_run``: the experiment scripts only print their plans."""
    extra = SCRIPT_ARGS[preset].get(name, []) + ([] if threads is None else ["--threads", str(threads)])
    script = DECIDE.get(name, name)
    extra += (launch or []) if script in EXPERIMENTS else []
    extra += data_arguments(script, *data)
    extra += ["--dry-run"] if dry_run and script in EXPERIMENTS else []
    if name in DECIDE:
        return [sys.executable, str(REPRODUCE / f"{script}.py"), "--preset", "decide", "--device", device, "--out",
                str(results / name), "--quiet", *extra]
    if name == "train_speed":
        out = results / "benchmark"
        return [sys.executable, "-m", "attention_zoo.bench", "train", *extra, "--csv", str(out / "train_speed.csv"),
                "--md", str(out / "train_speed.md")]
    if name == "benchmark":
        out = results / "benchmark"
        return [sys.executable, "-m", "attention_zoo.measure.quick", "--device", device, *extra,
                "--csv", str(out / "benchmark.csv"), "--md", str(out / "benchmark.md"),
                "--plot", str(out / "benchmark.png")]
    cmd = [sys.executable, str(REPRODUCE / f"{name}.py"), "--preset", "smoke" if preset == "tiny" else preset,
           "--device", device, "--out", str(results / name), "--quiet", *extra]
    if name == "appendix_e_kde":
        cmd += ["--table1-dir", str(results / "table1_generation")]
    return cmd


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load_record(path: Path) -> dict:
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {"runs": [], "scripts": {}}
    return rec if isinstance(rec, dict) else {"runs": [], "scripts": {}}


def dry_run(args: argparse.Namespace, scripts: list[str]) -> int:
    """Each script's command and plan (the experiments' own ``--dry-run``; the benchmarks' last recorded cost)."""
    recorded = _load_record(Path(args.results) / RUN_RECORD).get("scripts", {})
    failed = []
    for name in scripts:
        cmd = script_command(name, args.preset, args.device, Path(args.results), args.threads, launch_arguments(args),
                             (args.data_dir, args.download), dry_run=True)
        print(f"== {name}: {shown_command([c for c in cmd if c != '--dry-run'])}", flush=True)
        if "--dry-run" in cmd:
            if subprocess.run(cmd, preexec_fn=child_preexec()).returncode != 0:
                failed.append(name)
            continue
        last = recorded.get(name, {})
        print(f"{name}: dry run; the last run took {last['cpu_s']:.0f} s CPU, {last['wall_s']:.0f} s wall"
              if "cpu_s" in last else f"{name}: dry run; no recorded run to estimate from", flush=True)
    if args.preset == "paper" and resolve_device(args.device).type == "cpu":
        print("warning: the paper presets would train on a CPU; docs/paper_scale.md sizes them in GPU-hours")
    if failed:
        print(f"dry run failed for: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def run_script(cmd: list[str]) -> tuple[int, bool]:
    """Run one script to its end: (exit code, interrupted). A Ctrl-C (SIGINT to this process, or a SIGTERM: a
    background job ignores SIGINT) is passed on to the
    script's whole process group -- its main process and its workers, as a terminal Ctrl-C would -- and the script
    stores its finished cells, checkpoints the running ones and exits 130; we wait for that instead of killing it
    mid-write (a second Ctrl-C kills the group). The script dies with us (``child_preexec``): no orphan writes."""
    proc = subprocess.Popen(cmd, preexec_fn=child_preexec(), process_group=0)  # its own group: see _signal_group
    try:
        with terminate_as_interrupt():  # a SIGTERM (`kill PID` of a background all.py) acts as the Ctrl-C
            return proc.wait(), False
    except KeyboardInterrupt:
        try:
            _signal_group(proc, signal.SIGINT)
            return proc.wait(), True
        except KeyboardInterrupt:
            _signal_group(proc, signal.SIGKILL)
            return proc.wait(), True


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    # A SIGINT to the script's pid alone leaves its workers training while the main process waits for them; the
    # group reaches them all, whether the Ctrl-C came from a terminal or a `kill -INT` of all.py's pid.
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # already gone
        pass


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = ExperimentParser(prog="python reproduce/all.py", description=__doc__.split("\n\n")[0],
                         formatter_class=HelpFormatter, epilog=__doc__.split("\n\n")[1])
    p.add_argument("--preset", choices=PRESETS, default="smoke",
                   help="smoke: the whole paper on embedded data (hours on 2 CPU cores); decide: Tables 1, 3-6 and "
                        "Figures 12-13 with every arm tuned on validation, 10 seeds each, trained to a plateau "
                        "(hours each); results/README.md has each script's measured time; "
                        "paper: the scripts' paper presets; tiny: seconds per script, for tests")
    p.add_argument("--device", action=DeviceAction, default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--out", dest="results", type=Path, default=Path("results"), help="root of the per-script folders")
    p.rename("--results", "--out")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads of every script (default: each script's own choice)")
    p.add_argument("--only", action=ListAction, join=True, default=None,
                   help="subset of the preset's scripts (default: all)")
    p.add_argument("--data-dir", default=None, help="data directory, passed to every script that reads data")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="scripts fail instead of downloading missing data")
    p.add_argument("--index-only", action="store_true", help="only rebuild results/README.md")
    p.add_argument("--dry-run", action="store_true",
                   help="print each script's plan (its cells to run and to skip, data, estimated cost) and exit; "
                        "runs and writes nothing")
    add_launcher_arguments(p)  # passed on to every experiment script (docs/cluster.md)
    args = p.parse_args(argv)
    scripts = scripts_of(args.preset)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else list(scripts)
    unknown = sorted(set(chosen) - set(scripts))
    if unknown:
        raise ValueError(f"only: unknown {', '.join(unknown)}; available at preset {args.preset}: {', '.join(scripts)}")
    if args.dry_run:
        return dry_run(args, [s for s in scripts if s in chosen])
    results = ensure_out_dir(args.results, "out")  # before any script runs
    record_path = results / RUN_RECORD
    record = _load_record(record_path)
    todo = [s for s in scripts if s in chosen and not args.index_only]
    failed = []
    if todo:
        env = environment_record(resolve_device(args.device))
        run = {"run_id": f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}",
               "command": "python reproduce/all.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
               "preset": args.preset, "scripts": todo, "cores": os.cpu_count(),
               "loadavg_start": os.getloadavg()[0],
               **{k: env.get(k) for k in ("time_utc", "git_commit", "git_dirty", "host", "cpu_model", "device",
                                          "device_name", "torch", "python")}}
        record["runs"] = [r for r in record.get("runs", []) if r.get("run_id") != run["run_id"]] + [run]
        t_run, cpu_run = time.perf_counter(), _children_cpu()
        for name in todo:
            cmd = script_command(name, args.preset, args.device, results, args.threads, launch_arguments(args),
                                 (args.data_dir, args.download))
            shown = shown_command(cmd)
            print(f"== {name}: {shown}", flush=True)
            t0, cpu0, load0 = time.perf_counter(), _children_cpu(), os.getloadavg()[0]
            rc, stopped = run_script(cmd)
            wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
            print(f"== {name}: exit {rc} after {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
            record.setdefault("scripts", {})[name] = {
                "run_id": run["run_id"], "command": shown, "exit_code": rc, "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1), "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
                "preset": args.preset}
            run["total_wall_s"] = round(time.perf_counter() - t_run, 1)
            run["total_cpu_s"] = round(_children_cpu() - cpu_run, 1)
            run["loadavg_end"] = os.getloadavg()[0]
            atomic_write_json(record_path, record)  # after every script: a crash keeps the timings so far
            if stopped:
                print(f"all.py: interrupted during {name}; its finished cells are stored, rerun the same command to "
                      "continue", file=sys.stderr)
                return 130
            if rc != 0:
                failed.append(name)
    path = build_index(results)
    print(f"wrote {path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
