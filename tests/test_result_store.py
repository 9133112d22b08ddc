"""Result store: provenance-keyed cells, integrity of the JSONL file, concurrent writers, orphan-free workers."""

from __future__ import annotations

import configparser
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from attention_zoo.experiments import common
from attention_zoo.experiments.synthetic import sweep as syn_exp
from attention_zoo.results import ResultStore, ensure_out_dir

ROOT = Path(__file__).resolve().parent.parent
ENV_A = {"environment": {"device": "cpu", "device_name": "CPU A", "torch": "2.13.0", "threads": 2,
                         "dtype": "float32"}}


def _rows(v):
    return [{"metric": "m", "value": v, "unit": "ms"}]


# ---- provenance -------------------------------------------------------------------------------------------------
def test_context_keys_cells(tmp_path):
    cell = {"variant": "mha", "seed": 0}
    a = ResultStore(tmp_path, "t", ENV_A)
    assert not a.is_done(cell)
    a.add(cell, _rows(1.0))
    assert ResultStore(tmp_path, "t", ENV_A).is_done(cell)
    for change in ({"threads": 1}, {"device_name": "CPU B"}, {"torch": "2.12.0"}, {"dtype": "bfloat16"}):
        other = {"environment": {**ENV_A["environment"], **change}}
        b = ResultStore(tmp_path, "t", other)
        assert not b.is_done(cell), change  # measured elsewhere: never counted as done
        assert b.frame().empty  # ... and never shown as this run's result
    assert not ResultStore(tmp_path, "t", {**ENV_A, "config": {"lr": 0.02}}).is_done(cell)
    assert not ResultStore(tmp_path, "t", ENV_A, fresh=True).is_done(cell)


def test_fresh_recomputes_and_newest_wins(tmp_path):
    cell = {"variant": "mha"}
    ResultStore(tmp_path, "t", ENV_A).add(cell, _rows(1.0))
    fresh = ResultStore(tmp_path, "t", ENV_A, fresh=True)
    assert not fresh.is_done(cell)
    fresh.add(cell, _rows(2.0))
    assert fresh.is_done(cell)
    df = ResultStore(tmp_path, "t", ENV_A).frame()
    assert list(df["value"]) == [2.0] and df["run_id"].iloc[0] == fresh.run_id


def test_rows_carry_run_ids_and_env_lists_every_run(tmp_path):
    one = ResultStore(tmp_path, "t", ENV_A, env={"git_commit": "aaa", "host": "h1"})
    one.add({"seed": 0}, _rows(1.0))
    two = ResultStore(tmp_path, "t", ENV_A, env={"git_commit": "bbb", "host": "h1"})
    two.add({"seed": 1}, _rows(2.0))
    df = two.frame()
    assert set(df["run_id"]) == {one.run_id, two.run_id}
    env = two.environment({"git_commit": "bbb"}, df)
    assert {r["git_commit"] for r in env["runs"]} == {"aaa", "bbb"}


def _run_synthetic(out, *extra):
    return syn_exp.main(["--device", "cpu", "--lambda", "0.2", "--seeds", "0", "--variants", "mha", "--steps", "2",
                         "--workers", "1", "--quiet", "--out", str(out), *extra])


def _cells(out):
    return [json.loads(line) for line in (out / "synthetic.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "cell"]


def test_changing_an_option_or_the_machine_reruns_the_cell(tmp_path, monkeypatch):
    assert _run_synthetic(tmp_path) == 0
    assert len(_cells(tmp_path)) == 1
    assert _run_synthetic(tmp_path) == 0
    assert len(_cells(tmp_path)) == 1  # same settings, same machine: reused
    n = 1
    if (os.cpu_count() or 1) > 1:  # default: all cores for the single worker; one thread is another environment
        _run_synthetic(tmp_path, "--threads", "1")
        n += 1
        assert len(_cells(tmp_path)) == n
    _run_synthetic(tmp_path, "--steps", "3")
    assert len(_cells(tmp_path)) == n + 1  # a preset field changed
    real = common.fingerprint
    monkeypatch.setattr(common, "fingerprint", lambda *a, **k: {**real(*a, **k), "device_name": "another CPU"})
    _run_synthetic(tmp_path)
    assert len(_cells(tmp_path)) == n + 2  # another machine model: measured again
    long = pd.read_csv(tmp_path / "synthetic_long.csv")
    assert long["run_id"].nunique() == 1  # the report shows this context's rows only
    _run_synthetic(tmp_path, "--fresh")
    assert len(_cells(tmp_path)) == n + 3


def test_demo_command_measures_on_a_fresh_clone():
    """README's main command writes outside the committed results/, so a fresh clone computes every cell."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    cmds = [c.strip() for c in tox["testenv:demo"]["commands"].splitlines() if c.strip()]
    assert cmds and all("reproduce/" in c for c in cmds)
    for c in cmds:
        out = c.split("--out", 1)[1].split()[0]
        assert not out.startswith("results"), c
        ignored = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()}
        assert out.split("/")[0] in ignored, f"{out} must be git-ignored so a fresh clone has no cells there"


# ---- integrity ----------------------------------------------------------------------------------------------------
def test_torn_garbage_and_duplicate_lines(tmp_path, capsys):
    s = ResultStore(tmp_path, "t", ENV_A)
    s.add({"seed": 0}, _rows(1.0))
    s.add({"seed": 1}, _rows(2.0))
    s.add({"seed": 0}, _rows(3.0))  # a duplicate cell id: the newest counts once
    path = tmp_path / "t.jsonl"
    with open(path, "ab") as f:
        f.write(b"garbage that is not json\n")
        f.write(b"\x00\x00\x00\n")
        f.write(json.dumps({"kind": "cell", "cell": {"seed": 5}}).encode() + b"\n")  # lacks required keys
        f.write(b'{"kind": "cell", "cell_id": "torn')  # a crash mid-write: no newline
    s2 = ResultStore(tmp_path, "t", ENV_A)
    err = capsys.readouterr().err
    assert "malformed" in err and "t.jsonl.corrupt" in err
    moved = [json.loads(line) for line in (tmp_path / "t.jsonl.corrupt").read_text().splitlines()]
    assert sorted(m["line"] for m in moved) == [5, 6, 7, 8]  # line numbers reported, nothing dropped
    assert any("torn" in m["text"] for m in moved) and any("garbage" in m["text"] for m in moved)
    df = s2.frame()
    assert sorted(df["seed"]) == [0, 1] and float(df[df["seed"] == 0]["value"].iloc[0]) == 3.0
    s2.add({"seed": 2}, _rows(4.0))  # appends on a line of its own
    assert len(ResultStore(tmp_path, "t", ENV_A).frame()) == 3
    assert not (tmp_path / "t.jsonl").read_bytes().count(b"\x00")


def test_torn_tail_is_repaired_before_append(tmp_path):
    s = ResultStore(tmp_path, "t", ENV_A)
    s.add({"seed": 0}, _rows(1.0))
    with open(tmp_path / "t.jsonl", "ab") as f:
        f.write(b'{"kind": "cell", "cell_id"')
    s.add({"seed": 1}, _rows(2.0))  # must not glue onto the torn text
    s2 = ResultStore(tmp_path, "t", ENV_A)
    assert sorted(s2.frame()["seed"]) == [0, 1]
    assert len(s2.moved) == 1


def test_out_is_validated_before_work(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="^out:"):
        ensure_out_dir(f)
    with pytest.raises(ValueError, match="^out:"):
        ResultStore(f / "sub", "t")
    assert ensure_out_dir(tmp_path / "a" / "b").is_dir()


def _writer(out, tag, q):
    store = ResultStore(out, "t", ENV_A)
    ran = []
    for seed in range(8):
        cell = {"seed": seed}
        if store.claim(cell):
            time.sleep(0.05)
            store.add(cell, [{"metric": "m", "value": seed, "unit": "x", "by": tag}])
            ran.append(seed)
    q.put((tag, ran))


def test_two_concurrent_writers_never_run_a_cell_twice(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(tmp_path, t, q)) for t in ("a", "b")]
    for p in procs:
        p.start()
    done = dict(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    ran = done["a"] + done["b"]
    assert sorted(ran) == list(range(8))  # every cell once, none twice
    assert done["a"] and done["b"]  # both did work
    recs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    cells = [r for r in recs if r["kind"] == "cell"]
    assert len(cells) == len({r["cell_id"] for r in cells}) == 8
    df = ResultStore(tmp_path, "t", ENV_A).frame()
    assert len(df) == 8 and df["seed"].nunique() == 8  # statistics see each seed once


def test_claim_of_a_dead_process_is_taken_over(tmp_path):
    s = ResultStore(tmp_path, "t", ENV_A)
    cell = {"seed": 0}
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    claims = tmp_path / ".t.claims"
    claims.mkdir()
    import socket
    (claims / s.key(cell)).write_text(json.dumps({"pid": child.pid, "host": socket.gethostname()}))
    assert s.claim(cell)  # its holder is gone
    other = ResultStore(tmp_path, "t", ENV_A)
    (claims / s.key(cell)).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    assert not other.claim(cell)  # a live holder keeps it


# ---- workers die with their parent -----------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("kind", ["pool", "fork_server"])
def test_no_orphan_workers_after_sigkill_of_parent(tmp_path, kind):
    script = {
        "pool": """
            import os, time
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context
            from attention_zoo.experiments.launchers import _init_worker
            pool = ProcessPoolExecutor(2, mp_context=get_context("fork"), initializer=_init_worker,
                                       initargs=(os.getpid(), None))
            futs = [pool.submit(time.sleep, 60) for _ in range(2)]
            time.sleep(1.0)
            print(" ".join(str(p) for p in pool._processes), flush=True)
            time.sleep(60)
        """,
        "fork_server": """
            import time
            from attention_zoo.measure.memory import ForkServers
            fs = ForkServers(1)
            fs._start(1)
            print(fs.servers[0].pid, flush=True)
            time.sleep(60)
        """,
    }[kind]
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert pids and all(_alive(p) for p in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "a worker outlived its killed parent"
