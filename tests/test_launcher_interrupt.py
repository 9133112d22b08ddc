"""One Ctrl-C ends a local run within seconds: the unit that is training checkpoints and returns, and no worker takes
the next unit (before, each pool worker treated its unit's interrupt as that unit's end, took the next one, and a
second Ctrl-C was needed). A SIGINT sent to the driver alone reaches the workers too."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A unit of "training", as the engine runs one: its own SIGINT/SIGTERM handler records the signal, the loop
# checkpoints and the unit returns None.
WORK = """
LOG = Path(sys.argv[1])

def work(unit):
    seen = []
    old = {s: signal.signal(s, lambda *_: seen.append(1)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        (LOG / f"started-{unit[0]['c']}").write_text(str(os.getpid()))
        for _ in range(600):  # 30 s of "training" unless interrupted
            if seen:
                return None
            time.sleep(0.05)
        return [[{"metric": "m", "value": 1.0, "unit": ""}]]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
"""

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from attention_zoo.experiments.launchers import LocalLauncher

    {WORK}
    if __name__ == "__main__":
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a background test run inherits SIGINT ignored
        plan = SimpleNamespace(workers=int(sys.argv[2]), work=work, worker_init=None)
        got = []
        try:
            for _, _, err in LocalLauncher().run([[{"c": i}] for i in range(6)], plan):
                got.append(err)
        except KeyboardInterrupt:
            got.append("driver interrupted")
        print(got)
        sys.exit(130 if got else 1)
""").replace("{WORK}\n", WORK)


@pytest.mark.parametrize("workers,target", [(2, "group"), (2, "driver"), (1, "group")])
def test_one_ctrl_c_stops_the_run_and_no_worker_takes_the_next_unit(tmp_path, workers, target):
    (tmp_path / "drive.py").write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "drive.py"), str(tmp_path), str(workers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("started-*"))) < workers:
            assert proc.poll() is None and time.monotonic() < deadline, "the units never started"
            time.sleep(0.05)
        if target == "group":  # a terminal's Ctrl-C: the driver and every worker get it
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("one Ctrl-C did not end the run: the workers went on to the next units")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert time.monotonic() - t0 < 20
    assert len(list(tmp_path.glob("started-*"))) == workers, out  # no unit started after the Ctrl-C


EXECUTE = textwrap.dedent("""
    import os, signal, sys, time
    from argparse import Namespace
    from pathlib import Path
    from attention_zoo.experiments.protocol import Plan, execute
    from attention_zoo.results import ResultStore

    {WORK}
    if __name__ == "__main__":
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `nohup ... &` leaves a background job
        store = ResultStore(LOG / "store", "t", {"options": {}})
        plan = Plan(store, [[{"c": i}] for i in range(6)], work, lambda: 0, workers=int(sys.argv[2]))
        sys.exit(execute(plan, Namespace(dry_run=False, launcher="local", quiet=True), "t"))
""").replace("{WORK}\n", WORK)


def _terminated(tmp_path, cmd: list[str], started: int, timeout: float = 20):
    """Start ``cmd`` in its own session, wait for ``started`` units to start, SIGTERM its main process; (process,
    stdout, stderr) once it has ended (a run that outlives ``timeout`` fails the test)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("started-*"))) < started:
            assert proc.poll() is None and time.monotonic() < deadline, "the units never started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("a SIGTERM did not end the run")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc, out, err


@pytest.mark.parametrize("workers", [2, 1])
def test_a_sigterm_stops_a_background_run_as_a_ctrl_c_does(tmp_path, workers):
    """``kill PID`` of a run started with ``nohup … &`` (SIGINT ignored): the running units checkpoint and return, no
    unit starts after it, the driver exits 130 and the claims go back. Before, with pool workers, SIGTERM killed the
    driver outright and its workers with it (the units' work since their last checkpoint lost); one worker in the
    driver's own process was already stopped by the engine's handler."""
    (tmp_path / "drive.py").write_text(EXECUTE)
    proc, out, err = _terminated(tmp_path, [sys.executable, str(tmp_path / "drive.py"), str(tmp_path), str(workers)],
                                 workers)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; finished cells are stored" in err
    assert len(list(tmp_path.glob("started-*"))) == workers  # no unit started after the signal
    assert not list((tmp_path / "store" / ".t.claims").glob("*"))  # every claim went back


def test_a_sigterm_to_all_py_is_passed_on_as_a_ctrl_c_to_the_scripts_group(tmp_path):
    """``run_script`` (all.py's runner) under SIGTERM: the script's group gets the Ctrl-C, the script stops as above
    and all.py reports it interrupted; before, all.py died and took the script with it."""
    (tmp_path / "drive.py").write_text(EXECUTE)
    (tmp_path / "outer.py").write_text(textwrap.dedent(f"""
        import signal, sys
        from attention_zoo.experiments.run_all import run_script
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background all.py
        code, interrupted = run_script([sys.executable, {str(tmp_path / "drive.py")!r}, {str(tmp_path)!r}, "2"])
        print("script", code, interrupted)
        sys.exit(code)
    """))
    proc, out, err = _terminated(tmp_path, [sys.executable, str(tmp_path / "outer.py")], 2)
    assert proc.returncode == 130 and "script 130 True" in out, (out, err[-2000:])
    assert len(list(tmp_path.glob("started-*"))) == 2
